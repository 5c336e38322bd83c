"""Budgets below a step's measured floor fail before the step runs.

Every tracked step's region measures the step's minimum budget (the engine's
``min_budget``: what is pinned - parameters, inputs, gradients - plus the
largest set of tensors one op or rebuild had resident at once). No budget
below it can run that step: every part of it was needed at the same moment.
A step that ran whole measured it all (an unbudgeted step - the baseline a
percentage on the CPU runs first, a step with no threshold - or a budgeted step
that finished); a step that failed measured a lower bound up to where it failed.

:class:`Floors` keeps the highest floor measured per *step shape*: the module
whose forward opened the step, the grad mode and its positional arguments
(tensors by shape, dtype, device; the signature of :mod:`.fitting`, keyword
arguments left out, because the first forward's global hook does not see
them). When a later step of the same shape opens under a budget below that
floor, :meth:`Floors.check` raises :class:`BudgetBelowFloorError` before the
step's region is entered: one line, naming the budget, the floor and where it
was measured, and the least threshold to give - no op of the step ran, so
nothing went over the budget and nothing is half done.

Holds the record; no policy (the floor is the engine's measurement).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .._allocator.budget import THRESHOLD_ENV, THRESHOLD_FLAG
from ..config import format_bytes
from ..errors import MemscaleError
from .fitting import signature

#: What each part of the engine's ``min_budget_parts`` is, in the error's words.
_PARTS: Final[tuple[tuple[str, str], ...]] = (
    ("pinned_at_registration", "pinned at registration (parameters, inputs)"),
    ("pinned_later", "pinned later (gradients)"),
    ("under_min_size", "under the minimum evictee size"),
)


class BudgetBelowFloorError(MemscaleError):
    """A step's budget is below the floor a step of the same shape measured:
    raised before the step ran (``floor``: the least budget in bytes)."""

    def __init__(self, message: str, floor: int) -> None:
        super().__init__(message)
        self.floor = floor


@dataclass(frozen=True)
class Floor:
    """The highest floor measured for a step shape."""

    nbytes: int
    step: int  # the 1-based number of the step that measured it
    whole: bool  # measured by a step that ran to its end (else: up to where it failed)
    parts: Mapping[str, Any]
    module: weakref.ref[Any]


def _parts_text(parts: Mapping[str, Any]) -> str:
    """``min_budget_parts`` in words ("" when there are none)."""
    if not parts:
        return ""
    words = [f"{format_bytes(int(parts.get(key, 0) or 0))} {what}" for key, what in _PARTS if parts.get(key)]
    op = str(parts.get("op") or "")
    if parts.get("op_bytes"):
        words.append(f"{format_bytes(int(parts['op_bytes']))} at {op or 'one op'}")
    return f": {' + '.join(words)}" if words else ""


def _least(floor: int, source: str) -> str:
    """The least threshold to give, in the words of where the budget came from."""
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
    def key(module: Any, positional: Any) -> Hashable | None:
        """A step shape: ``module`` and its forward's positional arguments
        (``None``: not known, or not seen - such a step is not checked)."""
        if module is None or positional is None:
            return None
        return signature(module, positional)

    def measured(self, key: Hashable | None, module: Any, nbytes: int, step: int, whole: bool,
                 parts: Mapping[str, Any] | None) -> None:
        """A tracked step of shape ``key`` measured ``nbytes`` as its floor."""
        if key is None or nbytes <= 0:
            return
        known = self._floors.get(key)
        if known is not None and known.module() is module and known.nbytes >= nbytes:
            return
        self._floors[key] = Floor(nbytes, step, whole, dict(parts or {}), weakref.ref(module))

    def check(self, key: Hashable | None, module: Any, budget: int, source: str) -> None:
        """Raise :class:`BudgetBelowFloorError` when a step of shape ``key`` is
        about to run under ``budget`` bytes (from ``source``) below its floor."""
        if key is None or budget <= 0:
            return
        floor = self._floors.get(key)
        if floor is None or floor.module() is not module or floor.nbytes <= budget:
            return
        how = "ran whole" if floor.whole else "failed, measuring up to where it failed"
        name = type(module).__name__
        raise BudgetBelowFloorError(
            f"a training step of {name} needs at least {format_bytes(floor.nbytes)}, more than its budget of "
            f"{format_bytes(budget)} (from {source}): step {floor.step}, with the same argument shapes, {how} and "
            f"had that much resident at once{_parts_text(floor.parts)}; no budget below it can run the step, and "
            f"this one was not started. The least threshold to give: {_least(floor.nbytes, source)} "
            f"({format_bytes(floor.nbytes)})",
            floor.nbytes,
        )
