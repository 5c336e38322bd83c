"""Budgets below a step's measured floor fail before the step runs.

Every tracked step's region measures the step's minimum budget (the engine's
``min_budget``: what is pinned - parameters, inputs, gradients - plus the
largest set of tensors one op or rebuild had resident at once). No budget
below it can run that step: every part of it was needed at the same moment.
A step that ran whole measured it all (an unbudgeted step - the baseline a
percentage on the CPU runs first, a step with no threshold - or a budgeted step
that finished); a step that failed measured a lower bound up to where it failed.

:class:`Floors` keeps the floor measured per *step shape*: the module whose
forward opened the step, the grad mode, and that forward's arguments (tensors
by shape, dtype, device; the signature of :mod:`.fitting`). Where steps of one
shape measured several floors it keeps the lowest (steps that begin alike may
differ after their first forward; the lowest bounds them all). The first
step's keyword arguments are not seen (a global forward hook is given none):
its floor bounds the later steps whose keyword arguments hold no tensor, so a
model called with keyword tensors alone (``model(**batch)``) is checked
against the floors of its second step on.

The first :data:`MEASURED_STEPS` steps of each shape are measured: each
records its program and its engine searches the least budget it runs at, and
the least threshold kept for the shape is the highest they found. A shape's
first step can carry in less than its later ones: under gradient accumulation
the second micro-batch's backward reads the gradients the first one made
(externals, pinned while they are read), and a GAN's step on fakes reads the
generator's graph that the step before built. The later steps are like the
second (the same gradients, the same graph from the phase before).

When a step opens under a budget below the floor of its shape,
:meth:`Floors.check` raises :class:`BudgetBelowFloorError` before the step's
region is entered: one line, naming the budget, the floor and where it was
measured, and the least threshold that can work - no op of the step ran, so nothing
went over the budget and nothing is half done.

Holds the record; no policy (the floor is the engine's measurement).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import torch

from .._allocator.budget import THRESHOLD_ENV, THRESHOLD_FLAG
from ..config import format_bytes
from ..errors import BudgetBelowFloorError
from .fitting import signature

__all__ = ["BudgetBelowFloorError", "Floors", "Shape"]

#: The steps of each shape measured (their programs recorded and searched; on
#: the CPU under a percentage, run unbudgeted): the first carries in less than
#: the later ones can (see the module's docstring).
MEASURED_STEPS: Final[int] = 2

#: What each part of the engine's ``min_budget_parts`` is, in the error's words.
_PARTS: Final[tuple[tuple[str, str], ...]] = (
    ("pinned_at_registration", "pinned at registration (parameters, inputs)"),
    ("pinned_later", "pinned later (gradients)"),
    ("under_min_size", "under the minimum evictee size"),
)


#: Where a step's keyword arguments were not seen (the first forward's global
#: hook is given none), in its shape.
_UNSEEN: Final[str] = "memscale: keyword arguments not seen"


class Shape(NamedTuple):
    """A step's shape: the key its floor is kept under, and a second key it is
    also checked against (``None``: none)."""

    key: Hashable | None
    also: Hashable | None


def _has_tensor(x: Any) -> bool:
    """Whether ``x`` is or holds (in mappings, lists, tuples) a tensor."""
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, Mapping):
        return any(_has_tensor(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(v) for v in x)
    return False


class Least(NamedTuple):
    """What the engine's search (stats' ``least_budget``) found for a step's program."""

    nbytes: int  # the threshold to name: the least budget found to work and the search's headroom
    fails: int  # the largest budget a replay failed at (0: none failed)
    replayed: bool  # a replay finished at the least budget found (else: the step itself ran at it)
    replays: int
    headroom: int = 0  # the search's precision, added to the least budget found
    step: int = 0  # the 1-based number of the step whose program was searched (0: not known)

    @staticmethod
    def of(report: Any) -> Least | None:
        """The search's report as the engine's stats give it (``None``: no search, or it failed)."""
        if not isinstance(report, Mapping) or not report.get("threshold"):
            return None
        return Least(int(report["threshold"]), int(report.get("fails") or 0), bool(report.get("replayed")),
                     len(report.get("tries") or ()), int(report.get("headroom") or 0))


@dataclass(frozen=True)
class Floor:
    """The floor measured for a step shape (the lowest of its steps')."""

    nbytes: int
    step: int  # the 1-based number of the step that measured it
    whole: bool  # measured by a step that ran to its end (else: up to where it failed)
    parts: Mapping[str, Any]
    module: weakref.ref[Any]
    peak: int = 0  # the step's peak, when it ran whole with nothing evicted (a budget that works; 0: not known)
    least: Least | None = None  # the highest least budget the searches of its steps found (None: not searched)
    searched: int = 0  # the steps of the shape that ran whole and whose least was searched


def _parts_text(parts: Mapping[str, Any]) -> str:
    """``min_budget_parts`` in words ("" when there are none)."""
    if not parts:
        return ""
    words = [f"{format_bytes(int(parts.get(key, 0) or 0))} {what}" for key, what in _PARTS if parts.get(key)]
    op = str(parts.get("op") or "")
    if parts.get("op_bytes"):
        words.append(f"{format_bytes(int(parts['op_bytes']))} at {op or 'one op'}")
    return f": {' + '.join(words)}" if words else ""


def _peak_text(floor: Floor) -> str:
    """Where the floor's step ran with nothing evicted: a threshold that works ("" when not known)."""
    if floor.peak <= floor.nbytes:
        return ""
    return f"; step {floor.step} ran with nothing evicted at its peak of {format_bytes(floor.peak)}"


def _least_text(floor: Floor, least: Least) -> str:
    """How the least threshold named is known to work."""
    step = least.step or floor.step
    if least.replayed:
        tries = f"{least.replays} replays" if least.replays != 1 else "1 replay"
        where = f"{format_bytes(least.headroom)} below it, the headroom for later steps" if least.headroom else "at it"
        return f"a replay of step {step}'s recorded program finished {where}; {tries} searched up from the floor"
    if floor.peak and least.nbytes - least.headroom >= floor.peak:
        return (f"step {step} ran with nothing evicted at its peak of {format_bytes(floor.peak)}, and "
                f"{format_bytes(least.headroom)} of headroom for later steps")
    return f"step {step} ran whole {format_bytes(least.headroom)} below it, the headroom for later steps"


def _higher(a: Least | None, b: Least | None) -> Least | None:
    """The higher of two searches' results (``None``: not searched)."""
    if a is None or (b is not None and b.nbytes > a.nbytes):
        return b
    return a


def _least(floor: int, source: str) -> str:
    """The least threshold that can work, in the words of where the budget came from."""
    if source.startswith(THRESHOLD_FLAG):
        return f"{THRESHOLD_FLAG} {floor}"
    if source.startswith(THRESHOLD_ENV):
        return f"{THRESHOLD_ENV}={floor}"
    if source.startswith("Config."):
        return f"Config(threshold={floor})"
    return f"a budget of {floor} bytes"


class Floors:
    """The floors measured per step shape, and the check before a step runs."""

    def __init__(self) -> None:
        self._floors: dict[Hashable, Floor] = {}

    @staticmethod
    def shape(module: Any, args: Any, positional: Any) -> Shape:
        """A step's shape: ``module`` and its first forward's arguments,
        ``args`` = ``(args, kwargs)`` (or the Trainer's batch), or where those are not known its
        ``positional`` arguments alone (neither: a step that is not checked)."""
        if module is None:
            return Shape(None, None)
        if isinstance(args, tuple) and len(args) == 2 and isinstance(args[1], Mapping):
            key = signature(module, args)
            # A step whose keyword arguments hold no tensor is also the shape of
            # a step whose keyword arguments were not seen (the first).
            unseen = None if _has_tensor(args[1]) else signature(module, (args[0], _UNSEEN))
            return Shape(key, unseen)
        if args is not None:  # another form (the Trainer's batch)
            return Shape(signature(module, args), None)
        if positional is None:
            return Shape(None, None)
        return Shape(signature(module, (positional, _UNSEEN)), None)

    def has(self, shape: Shape, module: Any) -> bool:
        """Whether a step of ``shape`` measured a floor (what :meth:`check` checks against)."""
        return self._find(shape, module) is not None

    def measuring(self, shape: Shape, module: Any) -> bool:
        """Whether a step of ``shape`` that opens now is one of the first
        :data:`MEASURED_STEPS` of its shape: measured (its program searched)."""
        searched = 0
        for key in shape:  # the first step's shape may be its second key (keyword arguments not seen)
            found = self._floors.get(key) if key is not None else None
            if found is not None and found.module() is module:
                searched += found.searched
        return searched < MEASURED_STEPS

    def _find(self, shape: Shape, module: Any) -> Floor | None:
        for key in shape:
            found = self._floors.get(key) if key is not None else None
            if found is not None and found.module() is module:
                return found
        return None

    def _most(self, but: Floor) -> tuple[str, Least, int] | None:
        """The highest least threshold found for another step shape whose
        module is alive (its module's name, the search, its step), or None."""
        best: tuple[str, Least, int] | None = None
        for floor in self._floors.values():
            module = floor.module()
            if floor is but or floor.least is None or module is None:
                continue
            if best is None or floor.least.nbytes > best[1].nbytes:
                best = (type(module).__name__, floor.least, floor.step)
        return best

    def least_threshold(self) -> int:
        """The highest least threshold found over the step shapes measured
        (bytes; 0: none searched): the least that runs every one of them."""
        return max((f.least.nbytes for f in self._floors.values() if f.least is not None), default=0)

    def works(self, shape: Shape, module: Any, budget: int) -> bool:
        """Whether a step of ``shape`` is known to run at ``budget``: at or
        above the least threshold found for it."""
        floor = self._find(shape, module)
        return floor is not None and floor.least is not None and budget >= floor.least.nbytes

    def known(self, shape: Shape, module: Any) -> bool:
        """Whether the first :data:`MEASURED_STEPS` steps of ``shape`` were
        searched already (else the step that opens now measures its floor,
        and its engine searches the least budget it runs at:
        :attr:`memscale.dtr.least_budget`)."""
        return shape.key is not None and not self.measuring(shape, module)

    def measured(self, key: Hashable | None, module: Any, nbytes: int, step: int, whole: bool,
                 parts: Mapping[str, Any] | None, peak: int = 0, least: Least | None = None) -> None:
        """A tracked step of shape ``key`` measured ``nbytes`` as its floor
        (``peak``: its peak, when it ran whole with nothing evicted, else 0;
        ``least``: the engine's search for the least budget it runs at)."""
        if key is None or nbytes <= 0:
            return
        if least is not None:
            least = least._replace(step=least.step or step)
        searched = 1 if whole and least is not None else 0
        if not whole:
            least = None  # a search needs the whole program
        known = self._floors.get(key)
        if known is not None and known.module() is module:
            # The floor is the lowest measured (a bound for every step of the
            # shape); the least threshold the highest found (one that runs
            # every step searched).
            least, searched = _higher(known.least, least), known.searched + searched
            if known.nbytes <= nbytes:
                self._floors[key] = Floor(known.nbytes, known.step, known.whole, known.parts, known.module,
                                          known.peak, least, searched)
                return
        self._floors[key] = Floor(nbytes, step, whole, dict(parts or {}), weakref.ref(module), peak if whole else 0,
                                  least, searched)

    def check(self, shape: Shape, module: Any, budget: int, source: str) -> None:
        """Raise :class:`BudgetBelowFloorError` when a step of ``shape`` is
        about to run under ``budget`` bytes (from ``source``) below its floor."""
        if budget <= 0:
            return
        floor = self._find(shape, module)
        if floor is None:
            return
        least = floor.least
        if floor.nbytes <= budget:
            # At or above the floor the step may run: a replay that ran out of
            # room there does not prove the region would (the replay rebuilds
            # as the region does, with the op costs the measured step saw; the
            # region's own costs differ from run to run, and so its choices).
            return
        how = "ran whole" if floor.whole else "failed, measuring up to where it failed"
        name = type(module).__name__
        start = (
            f"the budget {format_bytes(budget)} (from {source}) is below what this training step of {name} needs, "
            f"at least {format_bytes(floor.nbytes)}: step {floor.step}, with the same argument shapes, {how} and "
            f"had that much resident at once{_parts_text(floor.parts)}; no budget below it can run the step"
        )
        if least is not None and least.nbytes > floor.nbytes and least.replayed:
            start += (
                f", and a replay of its recorded program ran out of room at {format_bytes(least.fails)}"
                if least.fails else ""
            )
        if least is not None:
            named, other = least.nbytes, self._most(floor)
            others = ""
            if other is not None and other[1].nbytes > named:
                # A threshold for the run is one every step shape measured runs at.
                named = other[1].nbytes
                others = (f"; the steps of {other[0]} (step {other[2]}), other shapes, need more: "
                          f"{format_bytes(named)}, found the same way")
            raise BudgetBelowFloorError(
                f"{start}; this one was not started. The least threshold that works: {_least(named, source)} "
                f"({format_bytes(least.nbytes)}, {least.nbytes / floor.nbytes:.3f}x that floor: "
                f"{_least_text(floor, least)}{others})",
                floor.nbytes, named,
            )
        raise BudgetBelowFloorError(
            f"{start}; this one was not started. The least threshold that can work: {_least(floor.nbytes, source)} "
            f"({format_bytes(floor.nbytes)}, a lower bound{_peak_text(floor)})",
            floor.nbytes,
        )
