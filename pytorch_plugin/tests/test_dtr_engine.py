"""memscale._native.engine: the one binding of the engine's C ABI (memscale_dtr_*).

Drives the real library directly, without PyTorch: registration, the budget
loop's victims, plans (and their capacity retry), rematerialization, swaps,
statistics and the errors of bad calls.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from memscale import MemscaleError

try:
    from memscale._native import engine as _engine

    _engine.dtr_lib()
except (ImportError, MemscaleError) as exc:  # pragma: no cover - without the engine
    pytest.skip(f"the DTR engine is unavailable: {exc}", allow_module_level=True)

from memscale._native import crossing as _crossing  # noqa: E402
from memscale._native.engine import ACTION_DROP, ACTION_SWAP, STEP_RERUN, STEP_SWAP_IN, Engine

MB = 1 << 20


def test_register_run_evict_and_rebuild() -> None:
    with Engine({"budget": 3 * MB, "heuristic": "lru"}) as eng:
        x = eng.tensor(MB)  # pinned input
        op_a, (a,) = eng.call("mul", [x], [MB], [-1], 1000)
        op_v, (v,) = eng.call("t", [a], [MB], [0], 10)  # a view: no memory
        assert eng.stats()["usage"] == 2 * MB
        _, (b,) = eng.call("add", [a], [MB], [-1], 1000)
        _, (c,) = eng.call("add", [b], [MB], [-1], 1000)
        victims = list(eng.evict())
        assert victims == [(a, ACTION_DROP)]  # the storage root; its view goes with it
        assert eng.stats()["usage"] <= 3 * MB
        steps = eng.plan(v)
        assert steps == [(STEP_RERUN, op_a), (STEP_RERUN, op_v)]
        eng.rematerialized(op_a, 900)
        eng.rematerialized(op_v, 10)
        assert eng.plan(v) == []
        s = eng.stats()
        assert s["evictions"] == 1 and s["rematerializations"] == 2
        assert s["remat_cost_ns"] == 910 and s["base_cost_ns"] == 3010
        del b, c


def test_release_frees_and_mutate_takes_over_memory() -> None:
    with Engine({"budget": 0}) as eng:
        x = eng.tensor(MB)
        _, (a,) = eng.call("mul", [x], [MB], [-1], 1)
        _, (b,) = eng.mutate("relu_", [a], [0], 1)
        assert b != a
        assert eng.stats()["usage"] == 2 * MB  # the new version lives in a's memory
        eng.release(b)
        freed = list(eng.evict())  # storages freed by releases are handed out too
        assert freed and eng.stats()["usage"] == MB


def test_swap_when_recompute_is_not_allowed() -> None:
    with Engine({"budget": 2 * MB, "swap_bandwidth": 1e10}) as eng:
        x = eng.tensor(MB)
        _, (a,) = eng.call("mul", [x], [MB], [-1], 10, flags=_engine.NO_RECOMPUTE)
        _, (b,) = eng.call("add", [x], [MB], [-1], 10, flags=_engine.NO_RECOMPUTE)
        assert list(eng.evict()) == [(a, ACTION_SWAP)]
        assert eng.plan(a) == [(STEP_SWAP_IN, a)]
        eng.swapped_in(a)
        assert eng.stats()["swaps_in"] == 1
        del b


def test_long_plans_ask_for_a_bigger_buffer() -> None:
    with Engine({"budget": 2 * MB, "heuristic": "lru"}) as eng:
        eng._plan_kinds = (_engine._i32 * 1)()  # too small: the engine says how big (as snprintf)
        eng._plan_ids = (_engine._i64 * 1)()
        prev = eng.tensor(MB)
        ops = []
        for _ in range(5):
            op, (prev,) = eng.call("add", [prev], [MB], [-1], 10)
            ops.append(op)
            list(eng.evict())
        steps = eng.plan(prev - 2)  # an evicted tensor a few ops back
        assert len(steps) >= 2 and len(eng._plan_kinds) == len(steps)


def test_rerun_remakes_a_released_output_as_a_throw_away_copy() -> None:
    with Engine({"budget": 4 * MB, "heuristic": "lru"}) as eng:
        x = eng.tensor(MB)
        op, (vals, idx) = eng.call("topk", [x], [2 * MB, MB], [-1, -1], 1000)
        eng.release(vals)  # dropped by the program; nothing can need it
        assert list(eng.evict()) == [(vals, ACTION_DROP)]
        eng.set_budget(MB + MB // 2)
        assert list(eng.evict()) == [(idx, ACTION_DROP)]
        eng.set_budget(4 * MB)
        assert eng.plan(idx) == [(STEP_RERUN, op)]
        eng.rematerialized(op, 900)  # the re-run also re-made vals
        assert eng.stats()["usage"] == 2 * MB  # x and idx: the copy of vals is not kept
        assert list(eng.evict()) == [(vals, ACTION_DROP)]  # ... it is handed out to be freed
        assert list(eng.evict()) == []


def test_evict_keeps_asking_until_the_engine_says_done() -> None:
    with Engine({"budget": 3 * MB, "heuristic": "lru"}) as eng:
        x = eng.tensor(MB)
        _, (a,) = eng.call("mul", [x], [MB], [-1], 10)
        _, (b,) = eng.call("mul", [a], [MB], [-1], 10)
        eng.lock(b)
        eng.set_budget(MB + MB // 2)
        # a goes, then nothing else can: the wrapper reports the error rather
        # than a short answer over the budget
        with pytest.raises(MemscaleError, match="nothing evictable.*1 pinned, 1 locked"):
            list(eng.evict())
        eng.unlock(b)
        assert list(eng.evict()) == [(b, ACTION_DROP)]


def test_bad_calls_raise_with_the_engines_message() -> None:
    with pytest.raises(MemscaleError, match="unknown key"):
        Engine({"budget": 1, "bogus": 2})
    with pytest.raises(MemscaleError, match="heuristic"):
        Engine({"heuristic": "best"})
    with Engine({"budget": MB}) as eng:
        with pytest.raises(MemscaleError, match="memscale_dtr_call"):
            eng.call("add", [12345], [MB], [-1], 1)
        with pytest.raises(ValueError, match="out_alias"):
            eng.call("add", [], [MB], [], 1)
        with pytest.raises(MemscaleError, match="memscale_dtr_plan"):
            eng.plan(999)
        x = eng.tensor(4 * MB)
        with pytest.raises(MemscaleError, match="nothing evictable"):
            list(eng.evict())
        eng.set_budget(0)
        assert list(eng.evict()) == []
        del x
    eng.close()  # idempotent


def test_status_block_follows_every_call() -> None:
    with Engine({"budget": 4 * MB, "heuristic": "lru"}) as eng:
        status = eng.status
        assert (status.usage, status.budget, status.pending) == (0, 4 * MB, 0)
        x = eng.tensor(MB)
        assert status.usage == MB
        _, (a,) = eng.call("mul", [x], [MB], [-1], 10)
        assert status.usage == 2 * MB and status.peak_usage == 2 * MB
        eng.release(a)  # its last reference: queued, the engine told with its next call
        assert status.pending == 0 and eng.released == [a]
        eng.flush_releases()  # ... or now: the engine frees it and says so
        assert status.pending == 1 and eng.released == []
        assert list(eng.evict()) == [(a, ACTION_DROP)]
        assert status.pending == 0 and status.usage == MB
        eng.set_budget(0)
        assert status.budget == 0


@pytest.fixture(params=["extension", "ctypes"])
def crossing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test using it runs with memscale_dtr_op called through the C
    extension and through ctypes (the fallback)."""
    if request.param == "ctypes":
        monkeypatch.setenv(_crossing.DISABLE_ENV, "1")
    _crossing.reset_for_tests()
    yield request.param
    _crossing.reset_for_tests()


def test_op_merges_releases_call_and_freed_storages(crossing: str) -> None:
    with Engine({"budget": 4 * MB, "heuristic": "lru"}) as eng:
        assert (eng._op_fast is None) == (crossing == "ctypes"), _crossing.unavailable_reason()
        x = eng.tensor(MB)
        _, a_ids, freed = eng.op(b"mul", [x], [MB], [-1], 10, 0)
        assert freed == []
        (a,) = a_ids
        _, (b,), _ = eng.op(b"mul", [a], [MB], [-1], 10, 0)
        eng.release(a)  # b, its child, is alive: evicted eagerly once the engine knows
        op, (c, v), freed = eng.op(b"add", [b], [MB, 8], [-1, 0], 10, 0)
        assert op > 0 and freed == [a, ACTION_DROP] and eng.released == []
        assert eng.status.pending == 0 and eng.status.usage == 3 * MB
        eng.release(b)
        eng.release(b)  # once too often: the next call fails and names it
        with pytest.raises(MemscaleError, match="memscale_dtr_op: released id 1 of 2: .*no references left"):
            eng.op(b"neg", [x], [MB], [-1], 10, 0)
        del v


def test_queued_ops_cross_in_one_call_with_the_ids_predicted(crossing: str) -> None:
    with Engine({"budget": 4 * MB, "heuristic": "lru"}) as eng:
        assert (eng._ops_fast is None) == (crossing == "ctypes"), _crossing.unavailable_reason()
        x = eng.tensor(MB)
        assert (eng.status.next_op, eng.status.next_tensor) == (0, 1)
        op_a, (a,) = eng.queue(b"mul", [x], [MB], [-1], 10, 0, MB)
        op_b, (b,) = eng.queue(b"mul", [a], [MB], [-1], 10, 0, MB)
        eng.release(a)  # b, its child, is alive: evicted eagerly once the engine knows
        op_c, (c, v) = eng.queue(b"add", [b], [MB, 8], [-1, 0], 10, 0, MB)
        assert (op_a, op_b, op_c, a, b, c, v) == (0, 1, 2, 1, 2, 3, 4)
        assert eng.queued == 3 and eng.queued_bytes == 3 * MB
        assert eng.status.usage == MB and eng.status.next_op == 0  # the engine has heard of nothing yet
        assert eng.flush() == [a, ACTION_DROP]
        assert eng.queued == 0 and eng.queued_bytes == 0 and eng.released == []
        assert eng.status.usage == 3 * MB and eng.status.pending == 0
        assert (eng.status.next_op, eng.status.next_tensor) == (3, 5)
        assert eng.flush() == []  # nothing queued: no crossing
        # Any other call takes the queue first: lock() names an id only the queue knows.
        _, (d,) = eng.queue(b"neg", [c], [MB], [-1], 10, 0, MB)
        eng.lock(d)
        assert eng.queued == 0 and eng.status.usage == 4 * MB
        eng.unlock(d)
        # Registrations through op() and queue() interleave in order.
        _, (e,) = eng.queue(b"neg", [d], [8], [0], 10, 0, 0)
        _, (f,), _ = eng.op(b"neg", [e], [8], [0], 10, 0)
        assert (e, f) == (6, 7) and eng.queued == 0
        s = eng.stats()
        assert s["base_cost_ns"] == 60 and s["evictions"] == 0
        del v


def test_a_failed_batch_names_its_record() -> None:
    with Engine({"budget": 0}) as eng:
        x = eng.tensor(MB)
        eng.queue(b"mul", [x], [MB], [-1], 10, 0, MB)
        eng.queue(b"mul", [12345], [MB], [-1], 10, 0, MB)  # no such tensor
        with pytest.raises(MemscaleError, match=r"memscale_dtr_ops\(2 records\): .*record 1 of 2: op mul: .*12345"):
            eng.flush()
        assert eng.queued == 0  # not queued twice


def test_evict_makes_room_for_the_bytes_about_to_be_allocated() -> None:
    with Engine({"budget": 3 * MB, "heuristic": "lru"}) as eng:
        x = eng.tensor(MB)
        _, (a,) = eng.call("mul", [x], [MB], [-1], 10)
        _, (b,) = eng.call("mul", [a], [MB], [-1], 10)
        assert list(eng.evict()) == []  # 3 MiB fit the budget
        assert list(eng.evict(extra=MB)) == [(a, ACTION_DROP)]
        assert eng.status.usage + MB <= 3 * MB
        assert eng.status.bytes_evicted == MB == eng.stats()["bytes_evicted"]
        with pytest.raises(MemscaleError, match="larger than the whole budget"):
            list(eng.evict(extra=4 * MB, why="for a test"))
        assert eng.status.usage == 2 * MB  # nothing was evicted for an impossible request
        del b


def test_finish_keeps_the_budget_and_names_what_leaves_the_step() -> None:
    with Engine({"budget": 2 * MB, "heuristic": "lru"}) as eng:
        x = eng.tensor(MB)
        _, (a,) = eng.call("mul", [x], [MB], [-1], 10)
        eng.lock(a)
        with pytest.raises(MemscaleError, match="nothing evictable"):
            list(eng.evict(extra=MB))
        eng.finish()
        with pytest.raises(MemscaleError, match="is below what leaves this step"):
            list(eng.evict(extra=MB))  # a run never goes over its budget before raising
        stats = eng.stats()
        assert stats["finished"] and stats["min_budget"] == 3 * MB  # what the error names
        assert stats["peak_usage"] <= 2 * MB
        eng.unlock(a)


def test_region_defaults_are_the_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMSCALE_HEURISTIC", raising=False)
    monkeypatch.delenv("MEMSCALE_EVICTEE_MIN_SIZE", raising=False)

    def resolved(config: dict[str, object]) -> dict[str, object]:
        with Engine({"defaults": "region", **config}) as eng:
            stats = eng.stats()
        return {"auto": stats["auto"], **stats["config"]}

    got = resolved({"budget": MB})
    assert got["auto"] and got["heuristic"] == "auto" and got["evictee_min_size"] == 1024
    assert not resolved({})["auto"]  # nothing to tune without a budget
    assert resolved({"budget": MB, "evictee_min_size": 0})["evictee_min_size"] == 0
    assert resolved({"budget": MB, "heuristic": "dtr"})["auto"] is False
    monkeypatch.setenv("MEMSCALE_HEURISTIC", "lru")  # set after the library was loaded
    got = resolved({"budget": MB})
    assert got["heuristic"] == "lru" and not got["auto"]
    monkeypatch.setenv("MEMSCALE_HEURISTIC", "Auto")
    assert resolved({"budget": MB})["auto"]
    monkeypatch.setenv("MEMSCALE_EVICTEE_MIN_SIZE", "4096")
    assert resolved({"budget": MB})["evictee_min_size"] == 4096
    with pytest.raises(MemscaleError, match="defaults"):
        Engine({"defaults": "training"})


def test_the_extension_is_built_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSCALE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(_crossing.DISABLE_ENV, raising=False)
    _crossing.reset_for_tests()
    try:
        with Engine({}) as eng:
            assert eng._op_fast is not None, _crossing.unavailable_reason()
            built = list(tmp_path.iterdir())
            assert [p.name for p in built] == [_crossing._target().name]
            x = eng.tensor(MB)
            _, (a,), _ = eng.op(b"mul", [x], [MB], [-1], 10, 0)
            eng.release(a)
            eng.flush_releases()  # releases only, through the extension too
            assert eng.status.pending == 1
        _crossing.reset_for_tests()
        stamp = built[0].stat().st_mtime_ns
        with Engine({}) as eng:  # a later process (or engine) loads the cached build
            assert eng._op_fast is not None and built[0].stat().st_mtime_ns == stamp
    finally:
        _crossing.reset_for_tests()


def test_without_a_compiler_the_engine_goes_through_ctypes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MEMSCALE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.delenv(_crossing.DISABLE_ENV, raising=False)
    _crossing.reset_for_tests()
    try:
        with caplog.at_level(logging.WARNING, logger="memscale"), Engine({}) as eng:
            assert eng._op_fast is None
            reason = _crossing.unavailable_reason()
            assert reason is not None and "could not be built" in reason and "no-such-compiler" in reason
            assert any("through ctypes" in r.getMessage() for r in caplog.records)
            x = eng.tensor(MB)
            _, (a,), freed = eng.op(b"mul", [x], [MB], [-1], 10, 0)
            assert freed == [] and eng.status.usage == 2 * MB
        assert not any(p.suffix == ".so" for p in tmp_path.iterdir())  # nothing half-built left
    finally:
        _crossing.reset_for_tests()
