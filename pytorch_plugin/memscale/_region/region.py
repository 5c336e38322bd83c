"""The region object: ``with memscale.dtr(budget): ...``.

:class:`DTRRegion` is what the user holds: its settings, the table of op facts
shared by its entries, the counters accumulated over entries, and the engine's
tuning carried from one entry to the next (those two kept by
:class:`~.counters.Counters`). Each ``with region:`` creates a
:class:`~.session.Session` (an engine instance) and pushes a
:class:`~.mode.RegionMode` that hands every ATen op to it; ``__exit__`` closes the
session and folds its counters into :meth:`DTRRegion.summary`.

Holds no per-op logic (see :mod:`.dispatch`) and no policy: defaults of a
region (the minimum evictee size, the tuning policy) are the engine's
(``"defaults": "region"``); Python converts the budget to bytes and carries
the engine's tuning choice forward.
"""

from __future__ import annotations

from typing import Any, Final

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .._allocator.budget import THRESHOLD, Budget, default_budget
from .._allocator.boundary import step_boundary
from .._allocator.stats import Granules
from ..config import check_heuristic, parse_size
from ..errors import ConfigError, MemscaleError
from .device import host_bandwidth, sync_count
from . import entry, steps
from .counters import Counters
from .dispatch import dispatch
from .mode import RegionMode
from .native import NativeMode, NativeSession, is_native_tensor, unwrap_native, use_native
from .schema import OpInfo
from .session import Session
from .tensor import DTRTensor, unwrap
from .verify import Where


#: The name of the engine's tuning policy: what a budgeted region with no
#: heuristic given (argument or ``MEMSCALE_HEURISTIC``) runs. Such an entry
#: scores with the engine's default heuristic and records its program; at exit
#: the engine replays the recording with every candidate configuration
#: (``memscale_dtr_tune``) and later entries run the configuration it chose.
DEFAULT_HEURISTIC: Final[str] = "auto"

def _allocator_installed() -> bool:
    try:
        from .._allocator.install import installed
    except ImportError:
        return False
    return installed() is not None


class DTRRegion:
    """A DTR region; use :func:`dtr` to make one. Re-enterable (enter per step).

    Each entry creates an engine instance with the region's settings and destroys
    it at exit; :meth:`summary` accumulates the counters of all entries. The
    arguments are :func:`dtr`'s, plus ``sink``: an object told about every
    registration (used by :mod:`memscale.trace` to write DTR traces).

    Not reentrant: one entry at a time, on the thread that entered it.
    """

    def __init__(
        self,
        budget: int | str | Budget | None = THRESHOLD,
        *,
        heuristic: str | None = None,
        recompute: bool = True,
        swap: bool = False,
        park: bool = True,
        evictee_min_size: int | str | None = None,
        recomp_time_factor: float | None = None,
        recomp_memory_factor: float | None = None,
        usage: str | None = None,
        stress: bool = False,
        offload_limit: int | str | None = None,
        sink: Any = None,
    ) -> None:
        check_heuristic(heuristic, "dtr() heuristic")
        for flag, value in (("recompute", recompute), ("swap", swap), ("park", park), ("stress", stress)):
            if not isinstance(value, bool):
                raise ConfigError(f"dtr({flag}={value!r}): expected True or False")
        if not recompute and not swap:
            raise ConfigError("dtr(recompute=False, swap=False): nothing could ever be evicted; enable one")
        for name, value in (("recomp_time_factor", recomp_time_factor), ("recomp_memory_factor", recomp_memory_factor)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ConfigError(f"dtr({name}={value!r}): expected a number >= 0")
        if usage is not None and usage not in ("engine", "allocator"):
            raise ConfigError(f"dtr(usage={usage!r}): expected 'engine' or 'allocator'")
        if stress and budget is not THRESHOLD and budget is not None:
            raise ConfigError(
                f"dtr(budget={budget!r}, stress=True): the stress setting evicts everything it can "
                "whatever the budget; give no budget"
            )
        self._stress = stress
        #: Set by the drop-in steps (:mod:`memscale._dropin.steps`), which enter and
        #: leave the region around the program's own code: a backward pass
        #: that raised ends the entry's tracking (:attr:`failed_backward`), so
        #: the code that caught the error does not run inside a step that is
        #: over, and the next forward starts a new step.
        self.ends_on_failed_backward = False
        #: Set by the drop-in steps for an entry that measures a step shape's
        #: floor: its engine records the program and, when the step finishes,
        #: searches the least budget it runs at (stats' ``least_budget``).
        self.least_budget = False
        resolved = Budget(0, "dtr(stress=True)") if stress else self._resolve_budget(budget, f"dtr(budget={budget!r})")
        self._budget = resolved.nbytes
        self._budget_source = resolved.source
        self._heuristic = heuristic
        self.recompute = recompute
        self._swap = swap
        self._park = park
        self._evictee_min_size = (
            None
            if evictee_min_size is None
            else parse_size(evictee_min_size, name="dtr(evictee_min_size)", allow_percent=False)
        )
        self._recomp_time_factor = recomp_time_factor
        self._recomp_memory_factor = recomp_memory_factor
        self._offload_limit = (
            None
            if offload_limit is None
            else parse_size(offload_limit, name="dtr(offload_limit)", allow_percent=False)
        )
        self._usage = usage
        # The allocator's granules over the entries (usage="allocator").
        self._granules = Granules()
        self._step_ended = False  # end_step told the allocator a step ended, this entry
        self._sink = sink
        #: Whether a ``torch.optim`` optimizer step inside an entry ends a step
        #: (:meth:`end_step`); regions whose steps something else closes (the
        #: drop-in API, :func:`memscale.enable`) turn it off.
        self.step_boundaries = True
        #: Facts about each ATen overload seen, shared by the region's entries.
        self.op_infos: dict[Any, OpInfo] = {}
        self._session: Session | NativeSession | None = None
        self._mode: RegionMode | NativeMode | None = None
        #: Whether the open entry runs on the native path (:mod:`.native`).
        self.native = False
        self._eager: Any = None  # the compiler stance of an entry
        self._froze = False  # the entry froze the collector's heap
        #: When set, every rebuild is checked against a fingerprint of the
        #: first run, and this says where an op ran (see :mod:`.verify`).
        self.verify_where: Where | None = None
        #: Counters over the entries, and the engine's tuning between them.
        self._counters = Counters()

    # ------------------------------------------------------------- settings

    @staticmethod
    def _resolve_budget(budget: int | str | Budget | None | object, label: str) -> Budget:
        """``budget`` in bytes, with where it came from (``label``: the call)."""
        if budget is THRESHOLD:
            return default_budget()
        if isinstance(budget, Budget):
            return budget
        if budget is None:
            return Budget(0, label)
        return Budget(DTRRegion._budget_bytes(budget), label)  # type: ignore[arg-type]

    @staticmethod
    def _budget_bytes(budget: int | str) -> int:
        total = None
        if isinstance(budget, str) and budget.strip().endswith("%"):
            from .._allocator.stats import device_total_memory

            total = device_total_memory() if torch.cuda.is_available() else None
            if total is None:
                raise ConfigError(
                    f"dtr(budget={budget!r}): a percentage needs a GPU's memory size; on the CPU give bytes"
                )
        nbytes = parse_size(budget, name="dtr(budget)", total=total)
        if nbytes <= 0:
            raise ConfigError(f"dtr(budget={budget!r}): must be positive (None = unlimited)")
        return nbytes

    @property
    def budget(self) -> int:
        """The budget in bytes (0 = unlimited)."""
        return self._budget

    @property
    def budget_source(self) -> str:
        """Where the budget came from (an argument, the eviction threshold...)."""
        return self._budget_source

    @budget.setter
    def budget(self, value: int | str | Budget | None) -> None:
        """Set the budget; a changed budget forgets the tuned configuration
        (the next entry records and tunes again)."""
        if self._stress:
            raise ConfigError("DTRRegion.budget: a stress region has no budget")
        resolved = self._resolve_budget(value, f"DTRRegion.budget = {value!r}")
        nbytes = resolved.nbytes
        self._budget_source = resolved.source
        if nbytes != self._budget:
            self._counters.forget_tuning()
        self._budget = nbytes
        if self._session is not None:
            self._session.set_budget(nbytes)

    def _config(self) -> dict[str, Any]:
        """The configuration of the next entry's engine (``None``: the engine's
        region default)."""
        usage = self._usage
        if usage is None:
            usage = "allocator" if (torch.cuda.is_available() and _allocator_installed()) else "engine"
        config: dict[str, Any] = {
            "defaults": "region",
            "budget": self._budget,
            "heuristic": self._heuristic,
            "recomp_time_factor": self._recomp_time_factor,
            "recomp_memory_factor": self._recomp_memory_factor,
            "evictee_min_size": self._evictee_min_size,
            "swap_bandwidth": host_bandwidth() if self._swap else 0,
            "park": self._park,
            "offload_limit": self._offload_limit,
            "usage": usage,
        }
        if self._stress:
            config["stress"] = True
        if self._counters.graph_size is not None:
            config["reserve"] = self._counters.graph_size
        if usage == "allocator":
            config["device"] = torch.cuda.current_device()
        if self._counters.tuned_config is not None:
            config.update(self._counters.tuned_config)
        if self.least_budget and not self._stress:
            config["least_budget"] = True
        return config

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> DTRRegion:
        if self._session is not None:
            raise MemscaleError("memscale.dtr: this region is already entered (it is re-enterable, not reentrant)")
        if steps.open_region() is not None:
            raise MemscaleError(
                "memscale.dtr: another DTR region is open on this thread, and regions do not nest (the inner "
                "one's tensors would be the outer one's). memscale run, memscale.enable() and memscale.wrap() "
                "open one region per training step: under them, remove the inner `with memscale.dtr(...)`; a "
                "script's own region opened before the step's first forward is used instead of the step's"
            )
        mark = sync_count()
        self.native = use_native(self, self._sink)
        session: Session | NativeSession
        if self.native:
            session = NativeSession(self, self._config())
        else:
            session = Session(self, self._config(), self._sink)
        session.sync_mark = mark  # the bandwidth measured for it is its own
        if self._sink is not None:
            self._sink.start(session)
        self._session = session
        device = session.config.get("device") if session.config.get("usage") == "allocator" else None
        self._granules.start(device)
        self._step_ended = False
        self._mode = NativeMode(session) if isinstance(session, NativeSession) else RegionMode(session)
        self._mode.watch_backward = self.ends_on_failed_backward
        self._eager = entry.compiled_code_runs_eagerly()
        self._mode.__enter__()
        steps.entered(self)
        # The native path keeps no Python objects per op: nothing to freeze.
        self._froze = False if self.native else entry.freeze_heap()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        session = self._session
        mode = self._mode
        assert session is not None and mode is not None
        try:
            steps.exited(self)
            mode.__exit__(exc_type, exc, tb)
        finally:
            if self._froze:
                self._froze = False
                entry.thaw_heap()
            if self._eager is not None:
                self._eager.__exit__(None, None, None)
                self._eager = None
            self._session = None
            self._mode = None
            stats = session.close(ok=exc_type is None)
            if not self._step_ended:  # a step ends here (once: end_step told the allocator already)
                step_boundary(session.config.get("device"))
            self._granules.stop()
            self._counters.accumulate(stats, session.config, session, self._budget)
            self._counters.keep_tuning(session, self._budget)
            if self._sink is not None:
                self._sink.stop()
            if exc_type is not None:
                entry.drain_autograd_queue()

    @property
    def is_entered(self) -> bool:
        """Whether the region is entered now."""
        return self._session is not None

    @property
    def failed_backward(self) -> BaseException | None:
        """When :attr:`ends_on_failed_backward` is set: an error saying that a
        backward pass of the open entry raised (noticed at the first op after
        it, or here); else ``None``."""
        mode = self._mode
        return mode.backward_failure() if mode is not None else None

    def end_step(self) -> None:
        """End a training step inside this entry, before the parameters are updated.

        What the step leaves behind is made resident and plain, as at exit
        (the gradients, the loss, whatever the program holds); the step's
        engine is destroyed, its counters going into :meth:`summary`; the entry
        goes on with a fresh engine. Every ``torch.optim`` optimizer step does
        this by itself (see :mod:`.steps`); call it in a loop that updates
        parameters another way, so that the engine's state stays bounded by
        one step.
        """
        session, mode = self._session, self._mode
        if session is None or mode is None:
            raise MemscaleError("DTRRegion.end_step: the region is not entered")
        try:
            with _disable_current_modes():  # re-runs must reach the kernels
                stats = session.close(ok=True)
        finally:
            fresh: Session | NativeSession
            fresh = NativeSession(self, self._config()) if self.native else Session(self, self._config(), self._sink)
            if self._sink is not None:
                self._sink.stop()
                self._sink.start(fresh)
            self._session = fresh
            mode.session = fresh
        self._counters.accumulate(stats, session.config, session, self._budget)
        self._counters.keep_tuning(session, self._budget)
        step_boundary(session.config.get("device"))
        self._step_ended = True

    def suspend(self, suspended: bool = True) -> None:
        """Run ops as outside the region until ``suspend(False)`` (the optimizer
        update between two steps: parameters and optimizer state stay plain)."""
        if self._mode is not None:
            self._mode.suspended = suspended

    # -------------------------------------------------------------- results

    def summary(self) -> dict[str, Any]:
        """Counters over every entry so far (and the running one).

        Keys: ``evictions``, ``rematerializations``, ``swaps_out``, ``swaps_in``,
        ``parked`` (the swaps out that parked what a rebuild's outer levels
        hold, or what an open plan reads later, see :mod:`.rebuild`),
        ``bytes_evicted``, ``base_cost_ns``, ``remat_cost_ns``, ``overhead``
        (``(base + remat) / base``), ``peak_usage`` (bytes, highest of any entry,
        in the budget's units: with ``usage="allocator"`` the allocator's
        allocated bytes at their highest during the entry, memory made before
        it and op temporaries included; else the registered resident bytes),
        ``min_budget`` (bytes: the lower bound below which no budget can
        work, the highest of any entry: what is pinned - parameters, inputs,
        gradients - plus the largest working set of any op or rebuild, as the
        engine saw them; measure it with ``dtr(None)``), ``min_budget_parts``
        (its parts: ``pinned_at_registration``, ``pinned_later``,
        ``under_min_size`` - resident tensors smaller than the minimum
        evictee size, never evicted - ``op_bytes``, ``op``), ``budget`` (bytes, 0 = unlimited),
        ``budget_source`` (where it came from), ``entries``, ``tuning``: ``None``
        until the engine tuned this region, else ``choice``, ``feasible``,
        ``overhead``, ``default_overhead``, ``wall_ns``, ``instructions`` and
        ``config`` (the keys later entries run with) of its report, or
        ``{"error": message}`` when tuning failed; ``synchronizations``: how
        many times the region's own code waited for the device (measuring
        the host bandwidth once per process, the fingerprints of verified
        rebuilds); no op adds any. ``nested_restarts``: how many times a
        rebuild whose plans nested found no room and started over bottom-up
        (see :mod:`.rebuild`). ``granules_mapped``, ``granules_unmapped``,
        ``granules_remapped``: what the memscale allocator did to its 2 MiB
        granules during the entries (``usage="allocator"``; 0 otherwise);
        ``step_plan_placed``, ``step_plan_missed``: the large requests its
        step plans placed, and those that fell back to best fit (the region
        tells the allocator where each step ends, at exit or ``end_step``).
        """
        out = self._counters.summary(self._session, self._budget, self._budget_source)
        out.update(self._granules.totals())
        return out

    def last_summary(self) -> dict[str, Any]:
        """The counters of the last completed entry (``engine``: its raw stats;
        ``config``: the configuration its engine ran with, defaults applied)."""
        return self._counters.last_summary()

    def reset_summary(self) -> None:
        """Forget the counters of past entries."""
        self._counters.reset()

    # ------------------------------------------------------------ tensors

    def wrap(self, t: torch.Tensor) -> DTRTensor:
        """A region tensor standing for plain tensor ``t`` (registered pinned).

        Only inside the region. Autograd treats the result as a new tensor
        (``requires_grad`` is copied, gradients flow into the result, not into
        ``t``); plain tensors need no wrapping to be used in the region.
        """
        session = self._session
        if session is None:
            raise MemscaleError("DTRRegion.wrap: the region is not entered")
        if isinstance(session, NativeSession):
            out = torch.ops.aten.alias.default(t)
            if t.requires_grad:
                out.requires_grad_(True)
            return out  # type: ignore[no-any-return]
        if type(t) is DTRTensor and t._c.session is session:
            return t
        with _disable_current_modes():
            out = dispatch(session, torch.ops.aten.alias.default, (t,), {})
        if t.requires_grad:
            out.requires_grad_(True)
        return out  # type: ignore[no-any-return]

    def unwrap(self, t: Any) -> Any:
        """The plain tensor behind region tensor ``t`` (rebuilt if evicted)."""
        if is_native_tensor(t):
            return unwrap_native(t)
        return unwrap(t)


def dtr(
    budget: int | str | Budget | None = THRESHOLD,
    *,
    heuristic: str | None = None,
    recompute: bool = True,
    swap: bool = False,
    park: bool = True,
    evictee_min_size: int | str | None = None,
    recomp_time_factor: float | None = None,
    recomp_memory_factor: float | None = None,
    usage: str | None = None,
    stress: bool = False,
    offload_limit: int | str | None = None,
) -> DTRRegion:
    """A Dynamic Tensor Rematerialization region.

    Args:
        budget: memory budget: bytes, ``"8GiB"``-style, ``"75%"`` of the GPU's
            memory, or ``None`` for no budget (ops are recorded, nothing is
            evicted: the way to measure a step's peak). Default: the eviction
            threshold (``MEMSCALE_EVICTION_THRESHOLD`` or
            ``install(threshold=...)``); without one, on a GPU with the
            memscale allocator the device's memory (the engine evicts only when
            an allocation would fail), else no budget.
            ``summary()["budget_source"]`` says which.
        heuristic: the engine's eviction heuristic (one of
            :func:`memscale.config.heuristics`: ``"dtr"``, ``"dtr-eq"``,
            ``"anc-sqrt"``, ``"lru"``, ...). ``None``: ``MEMSCALE_HEURISTIC``
            when set, else, under a budget, ``"auto"``: the first entry
            scores with the engine's default heuristic and records its
            program, the engine then chooses a configuration by replaying it
            (``memscale_dtr_tune``) and later entries run that choice (see
            ``summary()["tuning"]``; a changed budget tunes again). Any other
            name is used as given, without tuning.
        recompute: allow evicting by dropping and recomputing.
        swap: allow evicting by copying to host memory.
        park: at a tight budget, let rebuilds park in host memory what they
            hold for later rather than drop it or fail (default ``True``):
            a tensor an open rematerialization plan reads again, taken
            because nothing else was left, is copied out instead of dropped
            (dropped, it would be rebuilt by a plan nested in the one that
            reads it), and when a nested rebuild finds nothing evictable,
            the storages its outer levels hold (the running op's other
            inputs, the inputs of outer plans' steps) are copied out until
            it fits, and back when those levels go on. ``summary()["parked"]``
            counts them (also in ``swaps_out``). ``offload_limit`` caps
            the bytes out. Off, such a rebuild fails with "nothing
            evictable" where its working set alone fits.
        evictee_min_size: tensors smaller than this are never evicted
            (``None``: ``MEMSCALE_EVICTEE_MIN_SIZE`` when set, else 1 KiB).
        recomp_time_factor: exponent of the recompute cost in the score.
        recomp_memory_factor: exponent of the memory term in the score.
        usage: ``"engine"`` (sum of resident registered bytes) or
            ``"allocator"`` (the memscale allocator's allocated bytes); default:
            ``"allocator"`` on CUDA with the allocator installed, else
            ``"engine"``.
        stress: the stress setting, for testing a model under DTR: no budget;
            after every op, every evictable tensor no running op needs is
            evicted (whatever its size), and rebuilt when next read; a
            tensor rebuilt once stays until released, so a step re-runs each
            op at most about once more. Outputs and gradients must be bitwise
            those of the plain run; :func:`memscale.check` compares them.
        offload_limit: with ``swap`` or ``park``, the most bytes swapped out to host
            memory at any time (bytes or ``"4GiB"``; ``None``: no cap). The
            engine drops a recomputable victim instead of swapping it past the
            cap, and leaves one that cannot be recomputed in place.

    Returns:
        A :class:`DTRRegion`: ``with region: ...`` once per training step.

    Raises:
        ConfigError: a malformed argument (named in the message).
    """
    return DTRRegion(
        budget,
        heuristic=heuristic,
        recompute=recompute,
        swap=swap,
        park=park,
        evictee_min_size=evictee_min_size,
        recomp_time_factor=recomp_time_factor,
        recomp_memory_factor=recomp_memory_factor,
        usage=usage,
        stress=stress,
        offload_limit=offload_limit,
    )

