"""torch.cuda.memory_* under memscale, and torch's snapshot viewer on memscale's snapshots.

The allocator is swapped in a fresh interpreter on the simulated device (no GPU
needed: the CUDA build of torch installs a pluggable allocator without one);
activity comes from memscale_malloc / memscale_free through ctypes, as PyTorch
would call them.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers import run_child
from memscale._native import lib as _lib

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(_lib.unavailable_reason() is not None, reason=f"{_lib.unavailable_reason()}"),
    pytest.mark.skipif(
        not hasattr(torch._C, "_cuda_customAllocator"), reason="torch has no CUDA support (no pluggable allocator)"
    ),
]


def test_third_party_calls_return_memscale_numbers_and_restore() -> None:
    proc = run_child(
        """
        import torch, memscale
        from memscale._native import lib as _lib
        original = torch.cuda.max_memory_allocated
        memscale.install(backend="sim")
        assert memscale.torch_memory_patched()
        lib = _lib.lib()
        ptr = lib.memscale_malloc(3 << 20, 0, None)
        assert ptr, _lib.last_error()
        # What a third-party library would call: memscale's numbers, no exception.
        peak = torch.cuda.max_memory_allocated()
        assert peak == memscale.max_memory_allocated() >= 3 << 20, peak
        assert torch.cuda.memory.max_memory_allocated(0) == peak
        assert torch.cuda.memory_allocated() == memscale.memory_allocated() >= 3 << 20
        assert torch.cuda.memory_reserved() == memscale.memory_reserved() >= 3 << 20
        assert torch.cuda.memory_stats()["allocated_bytes.all.peak"] == peak
        assert torch.cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["peak"] == peak
        assert "memscale memory summary" in torch.cuda.memory_summary()
        lib.memscale_free(ptr, 3 << 20, 0, None)
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == memscale.memory_allocated() < peak
        assert torch.cuda.memory_snapshot() == memscale.snapshot()["segments"]
        assert set(torch.cuda.memory._snapshot()) >= {"segments", "device_traces"}
        memscale.restore_torch_memory()
        assert torch.cuda.max_memory_allocated is original
        assert not memscale.torch_memory_patched()
        print("ok")
        """,
        MEMSCALE_BACKEND=None,
        MEMSCALE_EVICTION_THRESHOLD=None,
        MEMSCALE_MEMORY_LIMIT=None,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert proc.stdout.strip() == "ok"


def test_torch_memory_viz_reads_a_snapshot_with_an_oom(tmp_path: Path) -> None:
    before, after = tmp_path / "before.pickle", tmp_path / "after.pickle"
    proc = run_child(
        f"""
        import memscale
        from memscale._native import lib as _lib
        lib = _lib.lib()
        memscale.set_limit(64 << 20, 0)
        a = lib.memscale_malloc(4 << 20, 0, None)
        memscale.dump_snapshot({str(before)!r})
        b = lib.memscale_malloc(1 << 20, 0, None)
        assert a and b, _lib.last_error()
        assert not lib.memscale_malloc(1 << 30, 0, None), "1 GiB fit under a 64 MiB limit"
        lib.memscale_free(a, 4 << 20, 0, None)
        memscale.dump_snapshot({str(after)!r})
        print("ok")
        """,
        MEMSCALE_TRACE_CAPACITY="100",
        MEMSCALE_BACKEND="sim",
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    with open(after, "rb") as f:
        data = pickle.load(f)
    ooms = [e for trace in data["device_traces"] for e in trace if e["action"] == "oom"]
    assert len(ooms) == 1, ooms
    assert ooms[0]["size"] >= 1 << 30 and isinstance(ooms[0]["device_free"], int), ooms[0]

    def viz(*args: str) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "torch.cuda._memory_viz", *args], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, f"_memory_viz {args[0]}: {run.stderr}"
        return run.stdout

    trace = viz("trace", str(after))
    assert "raise OutOfMemoryError" in trace and "free in CUDA" in trace, trace
    assert "segments: " in viz("stats", str(after))
    # segments / memory / compare build a flamegraph's folded stacks from the
    # snapshot, then render them with flamegraph.pl, which torch downloads
    # (no network here): the folded stacks are what is checked.
    from torch.cuda import _memory_viz

    with open(before, "rb") as f:
        earlier = pickle.load(f)

    def folded(lines: str) -> str:
        return lines

    for name, text in (
        ("segments", _memory_viz.segments(data, format_flamegraph=folded)),
        ("memory", _memory_viz.memory(data, format_flamegraph=folded)),
        ("compare", _memory_viz.compare(earlier["segments"], data["segments"], format_flamegraph=folded)),
    ):
        stacks = [line.rsplit(" ", 1) for line in text.splitlines()]
        assert stacks and all(size.isdigit() for _, size in stacks), f"{name}: {text!r:.300}"
        assert sum(int(size) for _, size in stacks) > 0, name
