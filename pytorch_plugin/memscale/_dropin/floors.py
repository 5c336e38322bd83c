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


@dataclass(frozen=True)
class Floor:
    """The floor measured for a step shape (the lowest of its steps')."""

    nbytes: int
    step: int  # the 1-based number of the step that measured it
    whole: bool  # measured by a step that ran to its end (else: up to where it failed)
    parts: Mapping[str, Any]
    module: weakref.ref[Any]
    peak: int = 0  # the step's peak, when it ran whole with nothing evicted (a budget that works; 0: not known)


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

    def measured(self, key: Hashable | None, module: Any, nbytes: int, step: int, whole: bool,
                 parts: Mapping[str, Any] | None, peak: int = 0) -> None:
        """A tracked step of shape ``key`` measured ``nbytes`` as its floor
        (``peak``: its peak, when it ran whole with nothing evicted, else 0)."""
        if key is None or nbytes <= 0:
            return
        known = self._floors.get(key)
        if known is not None and known.module() is module and known.nbytes <= nbytes:
            return
        self._floors[key] = Floor(nbytes, step, whole, dict(parts or {}), weakref.ref(module), peak if whole else 0)

    def check(self, shape: Shape, module: Any, budget: int, source: str) -> None:
        """Raise :class:`BudgetBelowFloorError` when a step of ``shape`` is
        about to run under ``budget`` bytes (from ``source``) below its floor."""
        if budget <= 0:
            return
        floor = None
        for key in shape:
            found = self._floors.get(key) if key is not None else None
            if found is not None and found.module() is module:
                floor = found
                break
        if floor is None or floor.nbytes <= budget:
            return
        how = "ran whole" if floor.whole else "failed, measuring up to where it failed"
        name = type(module).__name__
        raise BudgetBelowFloorError(
            f"the budget {format_bytes(budget)} (from {source}) is below what this training step of {name} needs, "
            f"at least {format_bytes(floor.nbytes)}: step {floor.step}, with the same argument shapes, {how} and "
            f"had that much resident at once{_parts_text(floor.parts)}; no budget below it can run the step, and "
            f"this one was not started. The least threshold that can work: {_least(floor.nbytes, source)} "
            f"({format_bytes(floor.nbytes)}, a lower bound{_peak_text(floor)})",
            floor.nbytes,
        )
