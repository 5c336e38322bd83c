"""make_resident's free rounds: an op with two inputs where rebuilding the
cheap one takes back the costly one, whose plan then needs the room the cheap
one holds (:func:`memscale._region.rebuild.make_resident`); and the
outermost rebuild starting over bottom-up when nested plans ran out of room;
and parking (a level swaps back what an inner level parked of its inputs;
``Session.park_outer_levels`` parks the outer levels' storages, outermost
first).

On bench/gpu/correctness.py's model (an MLP with layer norm beside a chain of
matrix products) at half the peak, layer norm's backward needs its input
(rebuilt by a 3-op plan) and its incoming gradient (a plan re-running much of
the backward); holding the first through the second's plan found nothing
evictable. Whether that happens depends on measured op costs, so the rounds
are tested here with a stand-in engine whose plans do exactly that.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from memscale import MemscaleError
from memscale._native.engine import NoRoomError
from memscale._region import rebuild
from memscale._region.cells import HeldCells


class _Engine:
    def __init__(self) -> None:
        self.locks: Counter[int] = Counter()
        self.open_plans = 0
        self.abandoned = 0

    def abandon_plans(self) -> int:
        n, self.open_plans = self.open_plans, 0
        self.abandoned += n
        return n

    def lock(self, t: int) -> None:
        self.locks[t] += 1

    def unlock(self, t: int) -> None:
        assert self.locks[t] > 0, f"unlocking t{t}, not locked"
        self.locks[t] -= 1


class _Cell:
    def __init__(self, tensor_id: int, resident: bool) -> None:
        self.tensor_id = tensor_id
        self.tensor: Any = object() if resident else None


class _Session:
    def __init__(self) -> None:
        self.engine = _Engine()
        self.rebuilt_bytes = 0
        self.room_failed_for: list[Any] = []
        self.nested_restarts = 0
        self.levels: list[list[Any]] = []


def _plans(s: _Session, cheap: _Cell, costly: _Cell) -> Any:
    """materialize with two plans: the cheap input's (96 bytes re-made) takes
    the costly input back unless it is locked; the costly one's (300 bytes)
    needs the room the cheap one takes, so it fails while that is locked and
    otherwise takes it back."""
    calls: list[int] = []

    def materialize(s_: Any, cell: _Cell) -> None:
        calls.append(cell.tensor_id)
        if cell is cheap:
            if not s.engine.locks[costly.tensor_id]:
                costly.tensor = None
            s.rebuilt_bytes += 96
        else:
            if s.engine.locks[cheap.tensor_id]:
                raise MemscaleError("nothing evictable: the cheap input is held")
            cheap.tensor = None
            s.rebuilt_bytes += 300
        cell.tensor = object()
        s.engine.lock(cell.tensor_id)  # materialize returns it locked

    return materialize, calls


def test_the_costly_input_is_rebuilt_without_the_cheap_one_held(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _Session()
    cheap, costly, other = _Cell(1, resident=False), _Cell(2, resident=True), _Cell(3, resident=True)
    materialize, calls = _plans(s, cheap, costly)
    monkeypatch.setattr(rebuild, "_materialize", materialize)
    held = HeldCells(s.engine)  # type: ignore[arg-type]
    rebuild.make_resident(s, [cheap, costly, other], held)  # type: ignore[arg-type]
    assert calls == [1, 2, 1], "cheap, then costly with nothing held, then cheap again with costly held"
    assert sorted(c.tensor_id for c in held.cells) == [1, 2, 3]
    assert all(c.tensor is not None for c in held.cells)
    assert dict(s.engine.locks) == {1: 1, 2: 1, 3: 1}, "each input locked once, nothing leaked"
    held.release()
    assert not +s.engine.locks


def test_rounds_end_holding_their_locks(monkeypatch: pytest.MonkeyPatch) -> None:
    """After FREE_ROUNDS the rounds keep what they locked, so a pair that
    takes each other back forever ends (here in the engine's error) instead
    of looping."""
    s = _Session()
    a, b = _Cell(1, resident=False), _Cell(2, resident=True)
    calls: list[int] = []

    def materialize(s_: Any, cell: _Cell) -> None:
        calls.append(cell.tensor_id)
        other = b if cell is a else a
        if s.engine.locks[other.tensor_id]:
            raise MemscaleError("nothing evictable")
        other.tensor = None  # each takes the other back
        s.rebuilt_bytes += 100
        cell.tensor = object()
        s.engine.lock(cell.tensor_id)

    monkeypatch.setattr(rebuild, "_materialize", materialize)
    held = HeldCells(s.engine)  # type: ignore[arg-type]
    with pytest.raises(MemscaleError, match="nothing evictable"):
        rebuild.make_resident(s, [a, b], held)  # type: ignore[arg-type]
    held.release_quietly()
    assert len(calls) <= rebuild.FREE_ROUNDS + 2


def _nesting(s: _Session, chain: list[_Cell], max_open: int, hopeless: bool = False) -> Any:
    """``_materialize_once`` for ``chain`` (innermost first): each cell's
    plan needs the one before it; a plan whose input is evicted rebuilds it
    with a nested plan, holding a lock of its own meanwhile, and a rebuild
    under more than ``max_open`` open plans finds no room. Every rebuild of a
    cell takes the cell before it back (as a tight budget does): after using
    it, or, ``hopeless``, before (so its input is always rebuilt nested)."""
    calls: list[int] = []

    def once(s_: Any, cell: _Cell) -> None:
        calls.append(cell.tensor_id)
        if s.engine.open_plans > max_open:
            raise NoRoomError("nothing evictable: the nested plans hold the room")
        i = chain.index(cell)
        s.engine.open_plans += 1
        hold = 1000 + cell.tensor_id
        s.engine.lock(hold)
        try:
            if i > 0 and hopeless:
                chain[i - 1].tensor = None
            if i > 0 and chain[i - 1].tensor is None:
                rebuild._materialize(s_, chain[i - 1])
                s.engine.unlock(chain[i - 1].tensor_id)
            if i > 0:
                chain[i - 1].tensor = None
            cell.tensor = object()
        finally:
            s.engine.unlock(hold)
        s.engine.open_plans -= 1
        s.engine.lock(cell.tensor_id)

    return once, calls


def test_nested_plans_out_of_room_start_over_from_the_innermost(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _Session()
    chain = [_Cell(i, resident=False) for i in range(1, 5)]
    once, calls = _nesting(s, chain, max_open=1)
    monkeypatch.setattr(rebuild, "_materialize_once", once)
    held = HeldCells(s.engine)  # type: ignore[arg-type]
    rebuild.make_resident(s, [chain[-1]], held)  # type: ignore[arg-type]
    assert chain[-1].tensor is not None and held.cells == [chain[-1]]
    assert s.nested_restarts == 1 and s.engine.abandoned > 0
    assert calls[:3] == [4, 3, 2], "top-down first: the third nested rebuild has no room"
    assert calls[3:] == [2, 1, 4, 3], "then 2 alone (rebuilding 1 nested), and 4 again (rebuilding 3)"
    held.release()
    assert not +s.engine.locks, "nothing leaked"
    assert s.room_failed_for == []


def test_nested_restarts_end_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bottom-up cannot help when even one plan has no room: after
    NESTED_RESTARTS restarts the error goes to the caller, nothing held."""
    s = _Session()
    chain = [_Cell(i, resident=False) for i in range(1, 4)]
    once, calls = _nesting(s, chain, max_open=0, hopeless=True)
    monkeypatch.setattr(rebuild, "_materialize_once", once)
    with pytest.raises(NoRoomError):
        rebuild.materialize(s, chain[-1])  # type: ignore[arg-type]
    assert s.nested_restarts == rebuild.NESTED_RESTARTS
    assert not +s.engine.locks and s.engine.open_plans == 0


def test_no_room_without_nested_plans_is_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _Session()
    cell = _Cell(1, resident=False)
    calls: list[int] = []

    def once(s_: Any, c: _Cell) -> None:
        calls.append(c.tensor_id)
        raise NoRoomError("nothing evictable")

    monkeypatch.setattr(rebuild, "_materialize_once", once)
    with pytest.raises(NoRoomError):
        rebuild.materialize(s, cell)  # type: ignore[arg-type]
    assert calls == [1] and s.nested_restarts == 0


def test_later_restarts_rebuild_more_of_the_failing_chain_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The top cell's plan takes back the innermost cell A before it needs B,
    whose plan needs A: rebuilding A alone first (restart 0) meets the same
    failure; rebuilding A then B first (restart 1) leaves the top's plan
    nothing to nest."""
    s = _Session()
    a, b, top = _Cell(1, resident=False), _Cell(2, resident=False), _Cell(3, resident=False)
    needs = {id(top): b, id(b): a}
    calls: list[int] = []

    def once(s_: Any, cell: _Cell) -> None:
        calls.append(cell.tensor_id)
        if s.engine.open_plans > 1:
            raise NoRoomError("nothing evictable: the nested plans hold the room")
        s.engine.open_plans += 1
        if cell is top:
            a.tensor = None  # the top's plan takes A back first
        need = needs.get(id(cell))
        if need is not None and need.tensor is None:
            rebuild._materialize(s_, need)
            s.engine.unlock(need.tensor_id)
        cell.tensor = object()
        s.engine.open_plans -= 1
        s.engine.lock(cell.tensor_id)

    monkeypatch.setattr(rebuild, "_materialize_once", once)
    rebuild.materialize(s, top)  # type: ignore[arg-type]
    assert top.tensor is not None and s.nested_restarts == 2
    assert calls == [3, 2, 1, 1, 3, 2, 1, 1, 2, 3], "top-down fails; A alone then top fails again; A, B, then top"
    s.engine.unlock(top.tensor_id)
    assert not +s.engine.locks


def test_a_level_swaps_back_what_an_inner_level_parked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both inputs evicted: ``a`` is rebuilt and locked, then ``b``'s rebuild
    (an inner level) parks ``a``. Before returning, the level swaps ``a``
    back; each rebuild's lock is kept (released together)."""
    s = _Session()
    a, b = _Cell(1, resident=False), _Cell(2, resident=False)
    calls: list[int] = []
    levels_seen: list[int] = []

    def materialize(s_: Any, cell: _Cell) -> None:
        calls.append(cell.tensor_id)
        levels_seen.append(len(s.levels))
        if cell is b:
            a.tensor = None  # parked by the inner level, lock kept
        cell.tensor = object()
        s.engine.lock(cell.tensor_id)

    monkeypatch.setattr(rebuild, "_materialize", materialize)
    held = HeldCells(s.engine)  # type: ignore[arg-type]
    rebuild.make_resident(s, [a, b], held)  # type: ignore[arg-type]
    assert calls == [1, 2, 1], "a, b (which parks a), then a swapped back"
    assert levels_seen == [1, 1, 1], "the inputs are one level while they are rebuilt"
    assert not s.levels, "the level is gone once the inputs are resident"
    assert a.tensor is not None and b.tensor is not None
    assert dict(s.engine.locks) == {1: 2, 2: 1}
    held.release()
    assert not +s.engine.locks


class _Group:
    def __init__(self) -> None:
        self.copied = False


class _ParkingEngine:
    def __init__(self, refuse: set[int]) -> None:
        self.refuse = refuse
        self.asked: list[int] = []
        self.usage = 0

    def park(self, t: int) -> bool:
        self.asked.append(t)
        if t in self.refuse:
            return False
        self.usage -= 100
        return True


class _Status:
    budget = 1000


class _ParkingSession:
    """What ``Session.park_outer_levels`` reads of a session."""

    def __init__(self, levels: list[list[Any]], refuse: set[int] = frozenset(), usage: int = 1000) -> None:
        self.parking = True
        self.levels = levels
        self.engine = _ParkingEngine(set(refuse))
        self.engine.usage = usage
        self.groups = {c.root: _Group() for level in levels for c in level}
        self.usage_known = True
        self.status = _Status()

    def usage_now(self) -> int:
        return self.engine.usage


class _Rooted:
    def __init__(self, root: int, resident: bool = True) -> None:
        self.root = root
        self.tensor: Any = object() if resident else None


def test_parking_takes_the_outer_levels_outermost_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from memscale._region import state as state_module
    from memscale._region.session import Session

    monkeypatch.setattr(state_module, "copy_to_host", lambda g: setattr(g, "copied", True))
    outer = [_Rooted(1), _Rooted(2), _Rooted(3, resident=False)]
    middle = [_Rooted(4), _Rooted(5)]
    inner = [_Rooted(5), _Rooted(6)]  # shares storage 5 with the middle level
    s = _ParkingSession([outer, middle, inner], refuse={2}, usage=1150)
    assert Session.park_outer_levels(s, 50)  # type: ignore[arg-type]
    assert s.engine.asked == [1, 2, 4], "outermost first, a refusal skipped, stops once 50 more bytes fit"
    assert [r for r, g in s.groups.items() if g.copied] == [1, 4]

    s = _ParkingSession([outer, middle, inner], usage=5000)
    assert Session.park_outer_levels(s, 0)  # type: ignore[arg-type]
    assert s.engine.asked == [1, 2, 4], "never the innermost level's storages (5 is shared), nor an evicted one"

    for levels, parking in (([inner], True), ([outer, inner], False)):
        s = _ParkingSession(levels)
        s.parking = parking
        assert not Session.park_outer_levels(s, 10)  # type: ignore[arg-type]
        assert s.engine.asked == []
