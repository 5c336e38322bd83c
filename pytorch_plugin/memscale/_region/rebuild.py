"""Rebuilding: making evicted cells resident again from the engine's plans.

:func:`materialize` asks the engine for a plan (``memscale_dtr_plan``): the
steps that make a cell resident, evicted ancestors first, each a re-run of a
recorded op or a copy back from host memory. The plan is run step by step:

* each step locks its inputs while it runs (an input the budget loop took away
  since the plan was made is rebuilt first by a plan of its own, as DTR's
  recursive rematerialization does: holding every intermediate until the end
  would make plans that need more than the budget where DTR succeeds);
* a step's outputs stay locked until the next step, when it reads them, ran
  (a chain is never cut between two steps);
* before a step allocates, the engine makes room for what it will allocate.

A plan of zero steps for a cell without data means the engine holds the
storage resident but this view of it was not re-derived yet: its producing op
is re-run locally, without telling the engine.

Every function returns with the cells it was asked for locked once (the
caller unlocks them, normally through a :class:`~.cells.HeldCells`). Holds no
state; decides nothing (the engine plans, the session evicts).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from .._engine import STEP_SWAP_IN
from ..errors import MemscaleError
from .cells import Cell, HeldCells, RecordedOp
from .device import copy_to_device
from .replay import rerun
from .tensor import EvictedTensorError

if TYPE_CHECKING:
    from .session import Session

#: Plans tried for one cell before giving up: each new plan means the budget
#: loop took back something the previous one rebuilt.
MAX_PLANS_PER_CELL: Final[int] = 64


def materialize(s: Session, cell: Cell) -> None:
    """Make ``cell`` resident; returns with ``cell`` locked once (caller unlocks)."""
    s.sync()
    plans = 0
    while cell.tensor is None:
        if cell.session is not s:
            raise EvictedTensorError(f"tensor {cell.tensor_id} does not belong to the active DTR region")
        plans += 1
        if plans > MAX_PLANS_PER_CELL:
            raise MemscaleError(
                f"memscale.dtr: tensor {cell.tensor_id} could not be made resident after {plans - 1} "
                "rematerialization plans (the budget is too small to keep what the plan needs)"
            )
        steps = s.engine.plan(cell.tensor_id)
        if not steps:
            # The engine holds the storage resident: a view of it that Python
            # has not re-derived yet. Re-run its producing op locally.
            op = s.ops.get(cell.op_id)
            if op is None:
                raise EvictedTensorError(
                    f"memscale.dtr: tensor {cell.tensor_id} has no data, and the engine has no plan to rebuild it"
                )
            if run_step(s, op, cell.op_id, report=False, keep=[cell]).cells:
                return
        elif _run_plan(s, cell, steps):
            return
        s.sync()
    s.engine.lock(cell.tensor_id)


def make_resident(s: Session, cells: list[Cell], held: HeldCells) -> None:
    """Rebuild the evicted ``cells``, then lock the resident ones; all end up
    in ``held``.

    Rebuilding first keeps the resident inputs evictable while a rebuild
    needs room (locking them first made nested rebuilds hold them all); one
    evicted meanwhile is rebuilt in the next round. Each round locks at least
    one more cell, so it ends.
    """
    pending = list(cells)
    while pending:
        missing = [c for c in pending if c.tensor is None]
        for cell in missing:
            if cell.tensor is None:
                materialize(s, cell)
                held.adopt(cell)
        locked = set(missing)
        rest = []
        for cell in pending:
            if cell in locked:
                continue
            if cell.tensor is not None:
                held.lock(cell)
            else:
                rest.append(cell)
        pending = rest


def make_all_resident(s: Session, cells: list[Cell]) -> None:
    """Make every cell resident at once (all locked until the last is rebuilt)."""
    with HeldCells(s.engine) as held:
        make_resident(s, cells, held)


def run_step(
    s: Session, op: RecordedOp, op_id: int, report: bool = True, keep: list[Cell] | None = None
) -> HeldCells:
    """Re-run one op with its inputs resident and locked.

    Outputs listed in ``keep`` are locked before the inputs are unlocked (an
    unlock can make the engine free an unreferenced storage) and returned
    held; the caller releases them. ``report``: tell the engine (a plan's
    step); a local re-derivation of a view is not reported.
    """
    s.sync()
    kept = HeldCells(s.engine)
    with HeldCells(s.engine) as inputs:
        for cell in op.inputs:
            if cell.tensor is None:
                materialize(s, cell)  # evicted since the plan was made
                inputs.adopt(cell)
            else:
                inputs.lock(cell)
        if s.budgeted:
            # A resident output is re-made as a throw-away copy: count it too.
            groups = s.groups
            extra = sum(groups[c.root].nbytes for c in op.outputs if c.root == c.tensor_id and c.root in groups)
            if extra:
                s.make_room(extra, b"a rematerialization")
        info = s.infos.get(op.func)
        cost = rerun(op, info)
        if s.verifier is not None and info is not None:
            s.verifier.rebuilt(op_id, info.label(), op.outputs)
        if report:
            s.engine.rematerialized(op_id, cost)
        with _released_on_error(kept):
            kept.lock_all(keep or [])
    if report and s.sink is not None:
        s.sink.remat(op_id, cost)
    return kept


def _run_plan(s: Session, target: Cell, steps: list[tuple[int, int]]) -> bool:
    """Run the engine's plan for ``target``, steps in order, ancestors first.

    Returns whether ``target`` was produced and is left locked once.
    """
    ops = s.ops
    for kind, i in steps:
        if kind != STEP_SWAP_IN and i not in ops:
            raise MemscaleError(f"memscale.dtr: the engine planned unknown op {i}")
    held = HeldCells(s.engine)
    last = len(steps) - 1
    try:
        for n, (kind, i) in enumerate(steps):
            if n < last:
                next_kind, next_id = steps[n + 1]
                next_inputs = ops[next_id].inputs if next_kind != STEP_SWAP_IN else []
            else:
                next_inputs = [target]
            if kind == STEP_SWAP_IN:
                produced = HeldCells(s.engine)
                with _released_on_error(produced):
                    produced.lock_all([c for c in swap_in(s, i) if c in next_inputs])
            else:
                op = ops[i]
                produced = run_step(s, op, i, keep=[c for c in op.outputs if c in next_inputs])
            held.release()
            held = produced
    except BaseException:
        held.release_quietly()
        raise
    got = target in held.cells
    if got:
        held.cells.remove(target)
    held.release()
    return got


def swap_in(s: Session, root: int) -> list[Cell]:
    """Copy swapped-out storage ``root`` back; returns the cells it re-made."""
    group = s.groups.get(root)
    if group is None:
        raise MemscaleError(f"memscale.dtr: the engine asked to swap in unknown storage {root}")
    if group.host_copy is None:
        raise MemscaleError(f"memscale.dtr: storage {root} was never swapped out")
    if s.budgeted:
        s.make_room(group.nbytes, b"a swap-in")
    cells = copy_to_device(group)
    s.engine.swapped_in(root)
    if s.sink is not None:
        s.sink.swap_in(root)
    return cells


@contextmanager
def _released_on_error(held: HeldCells) -> Iterator[None]:
    """Cells locked into ``held`` by the block are unlocked if the block fails."""
    try:
        yield
    except BaseException:
        held.release_quietly()
        raise
