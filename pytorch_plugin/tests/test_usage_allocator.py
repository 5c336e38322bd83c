"""A region whose usage is the allocator's allocated bytes (``usage="allocator"``,
the default on CUDA with the memscale allocator), on the CPU: the engine reads
the sim allocator of device 0, which the test fills through ``memscale_malloc``
to stand for memory allocated outside the region.

The per-op check reads the allocated bytes the allocator publishes
(``memscale_allocated_address``) instead of calling the engine after every op.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import deadline, native_region, python_region_only

from memscale import MemscaleError

torch = pytest.importorskip("torch")

try:
    from memscale import dtr
    from memscale._native import engine as _engine, lib as _lib

    _engine.dtr_lib()
except (ImportError, MemscaleError) as exc:  # pragma: no cover - without the engine
    pytest.skip(f"the DTR engine is unavailable: {exc}", allow_module_level=True)

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _cpu_as_device_0(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``usage="allocator"`` names the current CUDA device: device 0 (the sim) here."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with deadline(120):
        yield


class _Outside:
    """Bytes allocated through the memscale allocator, outside any region."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.ptr = _lib.lib().memscale_malloc(nbytes, 0, None)
        assert self.ptr, _lib.last_error()

    def free(self) -> None:
        _lib.lib().memscale_free(self.ptr, self.nbytes, 0, None)


def _count_evict_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = _engine.Engine.evict

    def evict(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(_engine.Engine, "evict", evict)
    return calls


def _chain(n: int = 12) -> list[Any]:
    x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(0))
    ys = [x]
    for i in range(n):
        ys.append((ys[-1] * 1.01 + float(i)).sin())
    return ys


@python_region_only("Python session's published usage (usage_live, usage_now) or Engine.evict calls to count")
def test_room_is_checked_without_an_engine_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Usage well within the budget: no op calls the engine's budget loop."""
    calls = _count_evict_calls(monkeypatch)
    region = dtr(1 << 40, usage="allocator", heuristic="lru")
    with region:
        s = region._session
        assert s is not None and s.usage_live is not None and s.usage_known
        assert s.usage_now() == _lib.lib().memscale_allocated(0)
        ys = _chain()
        del ys
    assert calls == [], "an engine call per op although the published usage was within the budget"


@python_region_only("Python session's published usage (usage_live, usage_now) or Engine.evict calls to count")
def test_the_published_usage_follows_the_allocator() -> None:
    region = dtr(1 << 40, usage="allocator", heuristic="lru")
    with region:
        s = region._session
        assert s is not None
        before = s.usage_now()
        outside = _Outside(8 * MiB)
        try:
            assert s.usage_now() >= before + 8 * MiB
        finally:
            outside.free()
        assert s.usage_now() == before


def test_memory_outside_the_region_over_the_budget_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Allocated memory the region does not hold puts usage over the budget:
    the next op asks the engine, which names that memory instead of failing
    silently or evicting what cannot help."""
    calls = _count_evict_calls(monkeypatch)
    outside = _Outside(64 * MiB)
    try:
        region = dtr(16 * MiB, usage="allocator", heuristic="lru")
        with pytest.raises(MemscaleError, match="is memory this engine does not hold"):
            with region:
                _chain(2)
        # The native region asks the engine through the C ABI, not Engine.evict.
        assert calls or native_region(), "usage over the budget must reach the engine"
    finally:
        outside.free()
