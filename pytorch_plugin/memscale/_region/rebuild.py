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

When plans nest (an input a step needs was evicted while an earlier step ran,
and is rebuilt by a plan of its own), each open plan holds the inputs of its
next step, and a tight budget may have no room left for the innermost one.
Each level of a rebuild (the running op's inputs, then each re-run step's) is
on ``Session.levels``; with parking on (``dtr(park=True)``, the default), the
innermost level that finds nothing evictable has the storages of the outer
levels copied to host memory (``Session.park_outer_levels``, outermost first:
it reads them last), their locks kept. Each level checks, once its inner
rebuilds are done and before it reads its inputs, that they are all resident,
and swaps back what was parked (:func:`_unpark`: a plan of one swap-in step,
which parks nothing of this level). So a rebuild needs room for the working
set of one level at a time, not for every level's at once. (The engine parks
too: a later step's input taken as a last resort is swapped, not dropped.)
Without parking, or when parking cannot make room, the outermost rebuild
starts over (at most :data:`NESTED_RESTARTS`
times): the plans are abandoned, their locks released, the cells whose
nested rebuilds found no room are rebuilt first, innermost first, each with
nothing else held (one cell at the first restart, one more at each later
one), and new plans are made from what is resident now (every step the
failed attempt ran was reported, so nothing is lost or counted twice in the
engine).

Every function returns with the cells it was asked for locked once (the
caller unlocks them, normally through a :class:`~.cells.HeldCells`). Holds no
state; decides nothing (the engine plans, the session evicts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from .._native.engine import STEP_SWAP_IN, NoRoomError
from ..errors import MemscaleError
from .cells import Cell, HeldCells, RecordedOp
from .device import copy_to_device
from .replay import rerun
from .tensor import EvictedTensorError

if TYPE_CHECKING:
    from .state import SessionState

#: Plans tried for one cell before giving up: each new plan means the budget
#: loop took back something the previous one rebuilt.
MAX_PLANS_PER_CELL: Final[int] = 64


#: Rounds of :func:`make_resident` that start over with nothing held when an
#: input was taken back meanwhile (then the rounds keep what they locked).
FREE_ROUNDS: Final[int] = 4


#: Times the outermost rebuild starts over when the budget had no room left
#: while its plans nested (see the module's docstring).
NESTED_RESTARTS: Final[int] = 4


def materialize(s: SessionState, cell: Cell) -> None:
    """Make ``cell`` resident; returns with ``cell`` locked once (caller unlocks).

    The outermost rebuild: starts over when nested plans ran out of room.
    """
    _restarting(s, lambda: _materialize(s, cell), _nothing_to_undo)


def _restarting(s: SessionState, rebuild: Callable[[], None], undo: Callable[[], None]) -> None:
    """Run the outermost ``rebuild``; start over when nested plans ran out of room.

    On a :class:`NoRoomError` raised while plans were open: ``undo`` unlocks
    what ``rebuild`` locked itself (every nested rebuild released its own
    locks on the way out), the plans are abandoned, and restart ``k`` first
    rebuilds the ``k + 1`` innermost cells whose rebuilds failed, innermost
    first, each with nothing else held, then runs ``rebuild`` again: the
    deepest part of the work is done while nothing above it holds room.
    (Rebuilding the whole failing chain at once took back the first cells
    for the later ones: the time-first GRU at 30 % failed that way; the
    innermost cell alone passed it with twice the evictions.) A failure with
    no plan open, or after :data:`NESTED_RESTARTS` restarts, is raised.
    """
    chain: list[Cell] = []
    for restart in range(NESTED_RESTARTS + 1):
        s.room_failed_for = []
        try:
            for first in chain:
                if first.tensor is None:
                    with HeldCells(s.engine) as alone:
                        _materialize(s, first)
                        alone.adopt(first)
            rebuild()
            return
        except NoRoomError:
            undo()
            chain = s.room_failed_for[: restart + 1]
            if s.engine.abandon_plans() == 0 or restart == NESTED_RESTARTS:
                raise
            s.nested_restarts += 1
        finally:
            s.room_failed_for = []


def _nothing_to_undo() -> None:
    """``undo`` of a rebuild that holds nothing when it fails."""


def _materialize(s: SessionState, cell: Cell) -> None:
    """:func:`materialize` without starting over (a rebuild inside a rebuild);
    notes the cells whose rebuilds failed for room, innermost first."""
    try:
        _materialize_once(s, cell)
    except NoRoomError:
        s.room_failed_for.append(cell)
        raise


def _materialize_once(s: SessionState, cell: Cell) -> None:
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


def make_resident(s: SessionState, cells: list[Cell], held: HeldCells) -> None:
    """Rebuild the evicted ``cells``, then lock the resident ones; all end up
    in ``held``. The outermost rebuild: starts over when nested plans ran out
    of room (the cells it locked so far are unlocked first).
    """
    base = len(held.cells)

    def undo() -> None:
        mine, held.cells = held.cells[base:], held.cells[:base]
        for cell in mine:
            s.engine.unlock(cell.tensor_id)

    def rebuild() -> None:
        with _level(s, cells):
            _make_resident(s, cells, held)
            _unpark(s, cells, held)

    _restarting(s, rebuild, undo)


@contextmanager
def _level(s: SessionState, cells: list[Cell]) -> Iterator[None]:
    """One level of a rebuild: ``cells`` are what it reads (see
    :meth:`.state.SessionState.park_outer_levels`)."""
    s.levels.append(cells)
    try:
        yield
    finally:
        s.levels.pop()


def _unpark(s: SessionState, cells: list[Cell], held: HeldCells) -> None:
    """Bring back what an inner level parked of ``cells`` (locked, in ``held``)
    while it rebuilt the others: each comes back with a swap-in, which parks
    nothing of this level (a cell the budget loop evicted meanwhile is rebuilt
    by its plan, which may park the others again: at most
    :data:`MAX_PLANS_PER_CELL` rounds per cell, then an error)."""
    rounds = 0
    while missing := [c for c in cells if c.tensor is None]:
        rounds += 1
        if rounds > len(cells) * MAX_PLANS_PER_CELL:
            raise MemscaleError(
                f"memscale.dtr: the inputs of a rebuild could not be made resident together ({len(cells)} "
                "tensors; each rebuild took back another): the budget is too small for this step; raise it "
                "(summary()['min_budget'] of an unbudgeted run is a lower bound)"
            )
        for cell in missing:
            if cell.tensor is None:
                _materialize(s, cell)
                held.adopt(cell)


def _make_resident(s: SessionState, cells: list[Cell], held: HeldCells) -> None:
    """:func:`make_resident` without starting over.

    Rebuilding first keeps the resident inputs evictable while a rebuild
    needs room (locking them first made nested rebuilds hold them all); the
    inputs a round rebuilds stay locked through the round (unlocking them
    for the round's later rebuilds lost the zoo's batch-first GRU at 30 %).

    An input the engine took back while another was rebuilt is rebuilt in a
    new round. For the first :data:`FREE_ROUNDS` rounds the new round holds at
    most one input: the roomiest rebuild so far (the bytes its plan re-made,
    a bound on the room it needs), and only when no input still to rebuild
    may need more (one never rebuilt here may). Holding every input the last
    round locked would make a taken-back input's plan run in the room those
    locks leave, and fail where letting a cheap input go and rebuilding it
    afterwards fits (an op whose cheap input's plan took back its costly one,
    whose plan then needs the room the cheap one holds:
    tests/test_rebuild_rounds.py). Later rounds keep their locks. Every round
    locks at least one more cell (a rebuild, or the resident ones), so it
    ends.
    """
    base = len(held.cells)
    pending = list(cells)
    room: dict[int, int] = {}  # id(cell) -> bytes its last rebuild here re-made
    rounds = 0
    while pending:
        rounds += 1
        missing = [c for c in pending if c.tensor is None]
        locked = set()
        for cell in missing:
            if cell.tensor is None:
                before = s.rebuilt_bytes
                _materialize(s, cell)
                room[id(cell)] = s.rebuilt_bytes - before
                held.adopt(cell)
                locked.add(cell)
        rest = []
        for cell in pending:
            if cell in locked:
                continue
            if cell.tensor is not None:
                held.lock(cell)
            else:
                rest.append(cell)
        if rest and rounds <= FREE_ROUNDS:
            keep = _roomiest_rebuild(cells, rest, room)
            mine, held.cells = held.cells[base:], held.cells[:base]
            for cell in mine:
                if cell is keep:
                    held.cells.append(cell)
                    keep = None  # held once
                else:
                    s.engine.unlock(cell.tensor_id)
            pending = [c for c in cells if c not in held.cells[base:]]
        else:
            pending = rest


def _roomiest_rebuild(cells: list[Cell], rest: list[Cell], room: dict[int, int]) -> Cell | None:
    """The resident cell of ``cells`` whose rebuild here re-made the most
    bytes, if no cell of ``rest`` (to rebuild) may need more; else ``None``."""
    best, most = None, -1
    for c in cells:
        if c.tensor is not None and room.get(id(c), -1) > most:
            best, most = c, room[id(c)]
    if best is None or any(room.get(id(c), -1) < 0 or room[id(c)] > most for c in rest):
        return None
    return best


def make_all_resident(s: SessionState, cells: list[Cell]) -> None:
    """Make every cell resident at once (all locked until the last is rebuilt)."""
    with HeldCells(s.engine) as held:
        make_resident(s, cells, held)


def run_step(
    s: SessionState, op: RecordedOp, op_id: int, report: bool = True, keep: list[Cell] | None = None
) -> HeldCells:
    """Re-run one op with its inputs resident and locked.

    Outputs listed in ``keep`` are locked before the inputs are unlocked (an
    unlock can make the engine free an unreferenced storage) and returned
    held; the caller releases them. ``report``: tell the engine (a plan's
    step); a local re-derivation of a view is not reported.
    """
    s.sync()
    kept = HeldCells(s.engine)
    with HeldCells(s.engine) as inputs, _level(s, op.inputs):
        for cell in op.inputs:
            if cell.tensor is None:
                _materialize(s, cell)  # evicted since the plan was made
                inputs.adopt(cell)
            else:
                inputs.lock(cell)
        _unpark(s, op.inputs, inputs)
        if s.budgeted:
            # A resident output is re-made as a throw-away copy: count it too.
            extra = _output_bytes(s, op)
            if extra:
                s.make_room(extra, b"a rematerialization")
        info = s.infos.get(op.func)
        cost = rerun(op, info)
        s.rebuilt_bytes += _output_bytes(s, op)
        if s.verifier is not None and info is not None:
            s.verifier.rebuilt(op_id, info.label(), op.outputs)
        if report:
            s.engine.rematerialized(op_id, cost)
        with _released_on_error(kept):
            kept.lock_all(keep or [])
    if report and s.sink is not None:
        s.sink.remat(op_id, cost)
    return kept


def _output_bytes(s: SessionState, op: RecordedOp) -> int:
    """Bytes of the storages ``op`` makes (its outputs that are roots)."""
    groups = s.groups
    return sum(groups[c.root].nbytes for c in op.outputs if c.root == c.tensor_id and c.root in groups)


def _run_plan(s: SessionState, target: Cell, steps: list[tuple[int, int]]) -> bool:
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


def swap_in(s: SessionState, root: int) -> list[Cell]:
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
