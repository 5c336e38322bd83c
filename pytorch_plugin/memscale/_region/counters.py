"""A region's counters over its entries, and the tuning carried between them.

:class:`Counters` is what :class:`~.region.DTRRegion` keeps from one entry to
the next: the engine's counters summed over the entries (``summary()``), the
last entry's (``last_summary()``), the highest peak and feasibility floor,
the size of the last entry's graph (the next engine reserves as much), and
the engine's tuning choice (or failure) that later entries run with. It
reads an entry through :class:`Entry`, which the Python session and the
native one both are.

Holds no policy: what is summed is the engine's stats; the tuning is the
engine's choice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, Protocol

from .._stats import SUMMED_KEYS, overhead

if TYPE_CHECKING:
    from .._native.engine import Engine

log = logging.getLogger("memscale")

#: What later entries run when tuning failed: the engine's default heuristic,
#: not recording (tuning is not retried every step).
_UNTUNED: Final[dict[str, Any]] = {"heuristic": "default"}

#: Keys of a tuning report kept in :meth:`DTRRegion.summary`'s ``"tuning"``.
_TUNING_KEYS: Final[tuple[str, ...]] = (
    "choice",
    "feasible",
    "overhead",
    "default_overhead",
    "wall_ns",
    "instructions",
    "config",
)


#: The lower bound of a feasible budget before any op ran.
_NO_FLOOR: Final[dict[str, Any]] = {"min_budget": 0, "parts": {}}


def _higher_floor(floor: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    """The higher of ``floor`` and the engine's ``min_budget`` in ``stats``."""
    nbytes = int(stats.get("min_budget", 0))
    if nbytes <= floor["min_budget"]:
        return floor
    return {"min_budget": nbytes, "parts": dict(stats.get("min_budget_parts") or {})}


class Entry(Protocol):
    """What the counters read of an entry's session (:class:`~.session.Session`
    or :class:`~.native.NativeSession`)."""

    engine: Engine
    tuning: dict[str, Any] | None
    tune_error: str | None
    nested_restarts: int

    def synchronizations(self) -> int: ...


class Counters:
    """The counters of a region's entries and the engine's tuning between them."""

    def __init__(self) -> None:
        self.reset()
        #: The last entry's ops, tensors and storages (the next engine
        #: makes room for as large a graph up front).
        self.graph_size: dict[str, int] | None = None
        #: The engine's tuning: the keys merged into later entries' config
        #: (``None``: not tuned), and what the summary reports.
        self.tuned_config: dict[str, Any] | None = None
        self.tuning: dict[str, Any] | None = None

    def reset(self) -> None:
        """Forget the counters of past entries (not the tuning)."""
        self._totals: dict[str, int] = dict.fromkeys(SUMMED_KEYS, 0)
        self._syncs = 0
        self._restarts = 0
        self._peak = 0
        self._floor: dict[str, Any] = _NO_FLOOR
        self._entries = 0
        self._last: dict[str, Any] = {}

    def forget_tuning(self) -> None:
        """The budget changed: the next entry records and tunes again."""
        self.tuned_config = None
        self.tuning = None

    def keep_tuning(self, session: Entry, budget: int) -> None:
        """Carry the engine's choice (or a tuning failure) to later entries."""
        if session.tuning is not None:
            report = session.tuning
            self.tuned_config = dict(report.get("config") or {})
            self.tuning = {key: report.get(key) for key in _TUNING_KEYS}
            log.info(
                "memscale.dtr: tuned for budget %d bytes in %.1f ms: %s (overhead %.3f, default heuristic %.3f)",
                budget,
                (report.get("wall_ns") or 0) / 1e6,
                report.get("choice"),
                report.get("overhead") or 0.0,
                report.get("default_overhead") or 0.0,
            )
        elif session.tune_error is not None:
            self.tuned_config = dict(_UNTUNED)
            self.tuning = {"error": session.tune_error}
            log.warning(
                "memscale.dtr: tuning failed (%s); later entries use the engine's default heuristic",
                session.tune_error,
            )

    def accumulate(self, stats: dict[str, Any], config: dict[str, Any], session: Entry, budget: int) -> None:
        """Add a closed entry's counters (``stats``: its engine's final stats;
        ``budget``: the region's, when the stats lack it)."""
        self._entries += 1
        last: dict[str, Any] = {key: int(stats.get(key, 0)) for key in SUMMED_KEYS}
        last["synchronizations"] = session.synchronizations()
        self._syncs += last["synchronizations"]
        last["nested_restarts"] = session.nested_restarts
        self._restarts += session.nested_restarts
        for key in SUMMED_KEYS:
            self._totals[key] += last[key]
        last["peak_usage"] = int(stats.get("peak_usage", 0))
        # The next entry's engine makes room for as large a graph up front.
        self.graph_size = {key: int(stats.get(key, 0)) for key in ("ops", "tensors", "storages")}
        last["budget"] = int(stats.get("budget", budget))
        self._peak = max(self._peak, last["peak_usage"])
        last["min_budget"] = int(stats.get("min_budget", 0))
        self._floor = _higher_floor(self._floor, stats)
        last["overhead"] = overhead(last["base_cost_ns"], last["remat_cost_ns"])
        last["engine"] = stats
        engine_config = stats.get("config")
        last["config"] = (
            dict(engine_config) if isinstance(engine_config, dict) else {k: v for k, v in config.items() if v is not None}
        )
        self._last = last

    def summary(self, session: Entry | None, budget: int, budget_source: str) -> dict[str, Any]:
        """Counters over every entry so far and the running one (``session``),
        as :meth:`~.region.DTRRegion.summary` describes them (its allocator's
        granules aside)."""
        totals = dict(self._totals)
        peak = self._peak
        floor = self._floor
        if session is not None:
            current = session.engine.stats()
            for key in SUMMED_KEYS:
                totals[key] += int(current.get(key, 0))
            peak = max(peak, int(current.get("peak_usage", 0)))
            floor = _higher_floor(floor, current)
        out: dict[str, Any] = dict(totals)
        out["overhead"] = overhead(totals["base_cost_ns"], totals["remat_cost_ns"])
        out["peak_usage"] = peak
        out["min_budget"] = floor["min_budget"]
        out["min_budget_parts"] = dict(floor["parts"])
        out["budget"] = budget
        out["budget_source"] = budget_source
        out["entries"] = self._entries + (1 if session is not None else 0)
        out["tuning"] = None if self.tuning is None else dict(self.tuning)
        out["synchronizations"] = self._syncs + (session.synchronizations() if session is not None else 0)
        out["nested_restarts"] = self._restarts + (session.nested_restarts if session is not None else 0)
        return out

    def last_summary(self) -> dict[str, Any]:
        """The counters of the last completed entry."""
        return dict(self._last)
