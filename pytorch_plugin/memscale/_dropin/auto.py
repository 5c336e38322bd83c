"""``unit="auto"`` under :func:`memscale.enable`: the unit is chosen per training step.

A training step is one unit of work: the forwards that build a graph (the
model's, then the loss module's - ``nn.CrossEntropyLoss``, ``NLLLoss``,
``BCELoss`` - and any other module the step calls) and the backward pass that
consumes it. ``auto`` decides once per step, at its first training forward:

* the step opens with a model that has block-level DTR (one with repeated
  blocks, :class:`~memscale._blocks.drop_in.BlockModels` took it): the whole
  step is the blocks'. The modules called after the model (the loss, a head
  outside it) open no region: a region there would register the blocks'
  saved activations as its inputs when backward reaches them, and pin what the
  blocks evict;
* any other first forward: the step is a region's (:class:`~.steps.Steps`),
  as with ``unit="op"``.

A blocks step ends where a region's would (:mod:`memscale._dropin.backward`:
its backward pass returned; an optimizer step; ``memscale.end_step()``; a
forward that raised). :class:`StepUnits` keeps the open step's unit and counts
the steps per unit, which the summary reports (``Summary.unit_steps``).

Not thread-safe by design (a step is opened and closed on the training
thread, as :class:`~.steps.Steps`). No policy: which activations to evict is
the engine's; this module only says which unit a step runs under.
"""

from __future__ import annotations

import threading
from typing import Any, Final, Protocol

#: ``Summary.unit_steps``'s keys: the units a step can run under.
BLOCK: Final[str] = "block"
OP: Final[str] = "op"


class Tracks(Protocol):
    """What :class:`StepUnits` asks of the block models (``BlockModels``)."""

    def tracks(self, module: Any) -> bool: ...


class StepUnits:
    """Which unit the open step of ``unit="auto"`` runs under, and the count of
    the steps the blocks ran (the regions' steps are :class:`~.steps.Steps`')."""

    def __init__(self, blocks: Tracks) -> None:
        self._blocks = blocks
        self._thread: int | None = None  # the thread of the open blocks step (None: none open)
        self._opener: int | None = None  # id of the module whose forward opened it
        #: Steps that ran as the blocks' (ended normally).
        self.block_steps = 0

    @property
    def blocks_step_open(self) -> bool:
        """Whether the open step is the blocks' (on any thread)."""
        return self._thread is not None

    def claims(self, module: Any, training: bool) -> bool:
        """Whether ``module``'s forward belongs to a blocks step: one is open on
        this thread, or this training forward (``training``: gradients on and
        no inference mode) of a block-tracked model opens one."""
        here = threading.get_ident()
        if self._thread == here:
            return True
        if self._thread is None and training and self._blocks.tracks(module):
            self._thread, self._opener = here, id(module)
            return True
        return False

    def raised(self, module: Any) -> None:
        """``module``'s forward raised: the open blocks step is abandoned when
        ``module`` opened it (a block's recompute in backward stops by raising
        inside the block, which ends nothing)."""
        if self._thread is not None and self._opener == id(module):
            self.end(failed=True)

    def end(self, failed: bool = False) -> None:
        """The open blocks step on this thread is over (``failed``: abandoned,
        not counted)."""
        if self._thread is None or self._thread != threading.get_ident():
            return
        self._thread = self._opener = None
        if not failed:
            self.block_steps += 1


def unit_steps(units: StepUnits, region_steps: int) -> dict[str, int]:
    """``Summary.unit_steps``: the steps per unit ``auto`` chose."""
    return {BLOCK: units.block_steps, OP: region_steps}
