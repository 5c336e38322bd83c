"""An allocation that fails asks the DTR engine to evict, retries, then fails clearly.

On the simulated device (no GPU here) with a hard limit: the allocator calls the
reclaimer installed with ``memscale_set_reclaimer``; the reclaimer asks the
engine for victims (``memscale_dtr_reclaim``) and frees their blocks; the
allocation then succeeds. When nothing is evictable the allocation fails with a
message naming the request, the limit and why the engine could not evict, and
the process allocates again afterwards. The region's side of it
(``reclaim`` of a Python or a native session, the per-device registry) is tested
on CPU tensors, through a custom op whose kernel reclaims as a failing
allocation would.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from _helpers import require_engine, run_child

torch = pytest.importorskip("torch")

from memscale import dtr  # noqa: E402

require_engine()

MB = 1 << 20


def test_allocation_succeeds_after_the_engine_evicts_then_fails_clearly() -> None:
    proc = run_child(
        """
        import ctypes
        from memscale._native import engine as _engine, lib as _lib
        from memscale._region import reclaim

        MB = 1 << 20
        lib = _lib.lib()
        _engine.dtr_lib()
        _lib.check(lib.memscale_set_limit(0, 16 * MB), "limit")
        engine = _engine.Engine({"budget": 1 << 40, "heuristic": "lru"})  # only reclaim evicts
        blocks = {}

        def alloc(n):
            return lib.memscale_malloc(n, 0, None)

        x = engine.tensor(2 * MB)
        blocks[x] = alloc(2 * MB)
        prev = x
        for _ in range(6):  # 12 MiB of recomputable tensors: 14 of 16 MiB used
            p = alloc(2 * MB)
            assert p
            _, (prev,) = engine.call("add", [prev], [2 * MB], [-1], 1000)
            blocks[prev] = p
        asked = []

        def reclaimer(device, need, ctx):
            asked.append(need)
            freed = 0
            for root, _action in engine.reclaim(need):
                lib.memscale_free(blocks.pop(root), 2 * MB, 0, None)
                freed += 2 * MB
            return freed

        callback = reclaim._Reclaimer(reclaimer)
        _lib.check(lib.memscale_set_reclaimer(0, ctypes.cast(callback, ctypes.c_void_p), None), "set")
        big = alloc(6 * MB)  # 4 MiB short: the engine evicts
        assert big, _lib.last_error()
        print("evictions", engine.stats()["evictions"], "asked", asked)
        for t in list(blocks):
            engine.lock(t)  # nothing is evictable any more
        assert not alloc(6 * MB)
        print("error:", _lib.last_error())
        lib.memscale_free(big, 6 * MB, 0, None)
        again = alloc(4 * MB)
        assert again, _lib.last_error()
        print("allocated again")
        """,
        MEMSCALE_BACKEND="sim",
        MEMSCALE_SIM_CAPACITY="1GiB",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    evictions = int(out.split("evictions ")[1].split()[0])
    assert evictions >= 2, out
    error = out.split("error:", 1)[1].split("\n", 1)[0]
    for fact in (str(6 * MB), "limit", str(16 * MB), "locked"):
        assert fact in error, f"{fact!r} not in the out-of-memory message: {error}"
    assert "allocated again" in out


def _x() -> Any:
    return torch.arange(256 * 1024, dtype=torch.float32)  # 1 MiB


class _FakeSession:
    """Stands in for a session in the registry: frees what it is told it has."""

    def __init__(self, has: int, calls: list[tuple[str, int]], name: str) -> None:
        self.closed = False
        self.has = has
        self.calls = calls
        self.name = name

    def reclaim(self, need: int) -> int:
        self.calls.append((self.name, need))
        if self.has < 0:
            raise RuntimeError("boom")
        freed = min(need, self.has)
        self.has -= freed
        return freed


def test_the_registry_asks_the_newest_session_first_and_survives_errors() -> None:
    import weakref

    from memscale._region import reclaim

    device = 12345  # the registry only: no allocator is asked for this device
    calls: list[tuple[str, int]] = []
    old, new = _FakeSession(3 * MB, calls, "old"), _FakeSession(MB, calls, "new")
    reclaim._sessions[device] = [weakref.ref(old), weakref.ref(new)]  # type: ignore[list-item]
    try:
        assert reclaim._reclaim(device, 2 * MB, None) == 2 * MB
        assert calls == [("new", 2 * MB), ("old", MB)]
        new.closed = True
        calls.clear()
        assert reclaim._reclaim(device, MB, None) == MB and calls == [("old", MB)]
        old.has = -1  # a failing session: logged, counts as "could not help"
        assert reclaim._reclaim(device, MB, None) == 0
        assert reclaim._reclaim(99999, MB, None) == 0  # no session for that device
    finally:
        reclaim._sessions.pop(device, None)


# ------------------------------------------------ both paths (Python and native)

_inside: list[Any] = []  # what the op below does while its kernel runs


@torch.library.custom_op("memscale_test::reclaim_inside", mutates_args=())
def _reclaim_inside(x: torch.Tensor) -> torch.Tensor:
    """Runs each callable of ``_inside`` while the region's op is under way
    (as an allocation that fails inside a kernel calls the reclaimer), then
    returns ``x * 2``."""
    for fn in _inside:
        fn()
    return x * 2


@_reclaim_inside.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


_reclaim_inside.register_autograd(lambda ctx, grad: grad * 2)


def _evictions(session: Any) -> int:
    return int(session.engine.stats()["evictions"])


def test_a_reclaim_evicts_about_what_was_asked_and_values_survive() -> None:
    x = _x()
    region = dtr(1 << 40, heuristic="lru")  # the budget never evicts: only reclaim does
    with region:
        session = region._session
        kept = [x * float(i + 2) for i in range(6)]
        assert _evictions(session) == 0
        freed = session.reclaim(2 * MB + 1)
        assert 2 * MB + 1 <= freed <= 3 * MB  # whole storages, no more than needed
        assert _evictions(session) == 3
        for i, k in enumerate(kept):
            assert torch.equal(k * 1, x * float(i + 2))  # rebuilt where evicted
    assert session.reclaim(MB) == 0  # a closed session frees nothing


def test_the_inputs_of_the_op_under_way_are_never_reclaimed() -> None:
    x = _x()
    region = dtr(1 << 40, heuristic="lru")
    got: list[int] = []
    with region:
        session = region._session
        a, b, c = x * 2, x * 3, x * 4
        _inside[:] = [lambda: got.append(session.reclaim(64 * MB))]  # more than there is
        try:
            y = _reclaim_inside(b)  # the kernel's thread, inside the session: it may evict
        finally:
            _inside.clear()
        assert got == [2 * MB]  # a and c: b is the running op's input
        assert torch.equal(y, x * 6) and torch.equal(a + c, x * 6)


def test_a_reclaim_from_another_thread_while_an_op_runs_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    x = _x()
    region = dtr(1 << 40, heuristic="lru")
    got: list[int] = []

    def other_thread() -> None:
        got.append(session.reclaim(MB))

    def from_another_thread() -> None:
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join(timeout=60)

    with region:
        session = region._session
        kept = [x * float(i + 2) for i in range(4)]
        _inside[:] = [from_another_thread]
        try:
            _reclaim_inside(kept[0])  # the region's thread is inside the session
        finally:
            _inside.clear()
        assert got == [0] and session.reclaims_refused == 1
        assert _evictions(session) == 0
        assert "on another thread" in caplog.text
        from_another_thread()  # the session idle: another thread may evict
        assert got[1] >= MB and _evictions(session) >= 1
        for i, k in enumerate(kept):
            assert torch.equal(k * 1, x * float(i + 2))
