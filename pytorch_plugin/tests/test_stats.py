"""Statistics and snapshots read from the library, without install().

On a machine without a GPU the library runs on its simulated device; activity is
created by calling memscale_malloc/memscale_free through ctypes exactly as PyTorch
would.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import memscale
from _helpers import run_child
from memscale import MemscaleError
from memscale._native import lib as _lib

pytestmark = pytest.mark.skipif(
    _lib.unavailable_reason() is not None,
    reason=f"libmemscale.so not built: {_lib.unavailable_reason()}",
)

MiB = 1024**2




def _malloc(nbytes: int) -> int:
    ptr = _lib.lib().memscale_malloc(nbytes, 0, None)
    assert ptr, f"memscale_malloc({nbytes}) failed: {_lib.last_error()}"
    return int(ptr)


def _free(ptr: int, nbytes: int) -> None:
    _lib.lib().memscale_free(ptr, nbytes, 0, None)


def test_stats_follow_malloc_and_free() -> None:
    base = memscale.memory_allocated()
    sizes = [512, 3000, 2 * MiB, 12 * MiB]
    ptrs = [_malloc(n) for n in sizes]
    try:
        stats = memscale.memory_stats()
        assert stats["allocated_bytes.all.current"] >= base + sum(sizes)
        assert memscale.memory_allocated() == stats["allocated_bytes.all.current"]
        assert memscale.memory_allocated(0) == memscale.memory_allocated("cuda:0")
        assert memscale.max_memory_allocated() >= memscale.memory_allocated()
        assert memscale.memory_reserved() >= memscale.memory_allocated()
        assert memscale.max_memory_reserved() >= memscale.memory_reserved()
        assert list(stats) == sorted(stats)
        assert all(isinstance(v, int) for v in stats.values())
    finally:
        for ptr, n in zip(ptrs, sizes, strict=True):
            _free(ptr, n)
    assert memscale.memory_allocated() == base
    assert memscale.max_memory_allocated() >= base + sum(sizes)
    memscale.reset_peak_memory_stats()
    assert memscale.max_memory_allocated() == memscale.memory_allocated()


def test_torch_key_names() -> None:
    stats = memscale.memory_stats()
    for key in (
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "reserved_bytes.all.current",
        "active_bytes.all.current",
        "num_ooms",
        "num_alloc_retries",
    ):
        assert key in stats, f"memory_stats() lacks {key}: {sorted(stats)}"


def test_memory_summary_is_a_table() -> None:
    ptr = _malloc(5 * MiB)
    try:
        text = memscale.memory_summary()
    finally:
        _free(ptr, 5 * MiB)
    assert "memscale memory summary, device ID 0" in text
    assert "Allocated memory" in text and "Reserved memory" in text
    assert "Cur Usage" in text and "Peak Usage" in text
    assert "from large pool" in text
    assert "from large pool" not in memscale.memory_summary(abbreviated=True)


def test_bad_device_raises() -> None:
    with pytest.raises(MemscaleError):
        memscale.memory_stats(1000)
    with pytest.raises(ValueError, match="CUDA devices only"):
        memscale.memory_stats("cpu")
    with pytest.raises(ValueError, match="negative"):
        memscale.memory_allocated(-1)


def test_snapshot_has_the_torch_shape() -> None:
    ptr = _malloc(3 * MiB)
    try:
        snap = memscale.snapshot()
    finally:
        _free(ptr, 3 * MiB)
    assert set(snap) >= {"segments", "device_traces"}
    holding = [s for s in snap["segments"] if s["address"] <= ptr < s["address"] + s["total_size"]]
    assert len(holding) == 1, f"no single segment holds {ptr:#x}"
    segment = holding[0]
    for key in ("device", "address", "total_size", "allocated_size", "active_size", "stream", "segment_type", "blocks"):
        assert key in segment
    assert sum(b["size"] for b in segment["blocks"]) == segment["total_size"]
    states = {b["state"] for b in segment["blocks"]}
    assert "active_allocated" in states
    assert states <= {"active_allocated", "active_pending_free", "inactive"}


def test_dump_snapshot_round_trip_with_trace(tmp_path: Path) -> None:
    # The alloc/free trace is recorded only with MEMSCALE_TRACE_CAPACITY set
    # when the library loads, hence a fresh interpreter.
    out = tmp_path / "snap.pickle"
    proc = run_child(
        f"""
        import memscale
        from memscale._native import lib as _lib
        lib = _lib.lib()
        ptrs = [lib.memscale_malloc(n, 0, None) for n in (4096, 1 << 20, 30 << 20)]
        assert all(ptrs), _lib.last_error()
        lib.memscale_free(ptrs[1], 1 << 20, 0, None)
        path = memscale.dump_snapshot({str(out)!r})
        print(path)
        """,
        MEMSCALE_TRACE_CAPACITY="1000",
        MEMSCALE_BACKEND="sim",
    )
    assert proc.returncode == 0, proc.stderr
    with open(out, "rb") as f:
        data = pickle.load(f)
    assert data["segments"], "no segments"
    events = [e for trace in data["device_traces"] for e in trace]
    actions = [e["action"] for e in events]
    assert actions.count("alloc") >= 3, actions
    assert "free_requested" in actions or "free_completed" in actions, actions
    for event in events:
        assert {"action", "addr", "size", "stream", "frames"} <= set(event)
    # PyTorch's own tooling for these pickles accepts it.
    from torch.cuda import _memory_viz

    assert "segments: " in _memory_viz.segsum(data)
    assert "TOTAL MEM" in _memory_viz.trace(data)
    assert "<script" in _memory_viz.trace_plot(data)
