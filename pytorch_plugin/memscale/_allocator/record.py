"""Record a run's allocations as a PyTorch memory snapshot.

``with memscale.record_snapshot("snap.pickle"): train()`` writes the pickle
that ``torch.cuda.memory._dump_snapshot`` writes - ``{"segments": [...],
"device_traces": [[TraceEntry, ...]]}`` - which https://pytorch.org/memory_viz
renders and ``memscale bench replay snap.pickle`` replays under other
allocators.

* On a GPU with PyTorch's native allocator it is exactly
  ``torch.cuda.memory._record_memory_history(max_entries=...)``, the block,
  then ``_dump_snapshot(path)`` and recording off.
* Without CUDA (``device="cpu"``, or no GPU) it records the CPU allocator's
  allocations and frees: ``torch.profiler`` with ``profile_memory=True``
  reports every allocation the CPU allocator makes (address, size, the op
  that made it) and every free; they are written as ``alloc``,
  ``free_requested`` and ``free_completed`` entries on stream 0, each with one
  frame naming the op. The CPU allocator caches nothing, so the snapshot has
  no ``segment_alloc`` entries; ``segments`` lists the blocks still allocated
  at the end, one segment each. The sizes are the tensors' byte sizes, as
  the CUDA caching allocator would be asked for them.

Under memscale's own allocator (``memscale.install()``) PyTorch's history
raises; use ``MEMSCALE_TRACE_CAPACITY`` and ``memscale.dump_snapshot``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import MemscaleError

__all__ = ["record_snapshot", "cpu_snapshot_from_profile", "record_program"]


@contextlib.contextmanager
def record_snapshot(
    path: str | os.PathLike[str], *, max_entries: int = 1_000_000, device: str | None = None
) -> Iterator[None]:
    """Record every allocation and free of the block into a snapshot pickle at *path*.

    *device* ``"cuda"`` uses PyTorch's native CUDA allocator history, ``"cpu"``
    the CPU allocator through the profiler; ``None`` picks CUDA when it is
    available. The file is written when the block exits, also when it raises.
    """
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise MemscaleError(f"record_snapshot: device={device!r}: want 'cuda', 'cpu' or None")
    out = Path(path)
    if device == "cuda":
        from .install import installed

        if installed() is not None:
            raise MemscaleError(
                "record_snapshot: memscale's allocator is installed, and PyTorch's memory history "
                "needs its native allocator; set MEMSCALE_TRACE_CAPACITY and use memscale.dump_snapshot"
            )
        torch.cuda.memory._record_memory_history(max_entries=max_entries)
        try:
            yield
        finally:
            try:
                torch.cuda.memory._dump_snapshot(str(out))
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
        return

    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    prof.__enter__()
    try:
        yield
    finally:
        prof.__exit__(None, None, None)
        snap = cpu_snapshot_from_profile(prof, max_entries=max_entries)
        with open(out, "wb") as f:
            pickle.dump(snap, f)


def record_program(output: str, device: str | None, run: Any) -> int:
    """``python -m memscale record``: run a program under :func:`record_snapshot`.

    Returns the program's exit status; the snapshot is written either way.
    """
    import sys

    status = 0
    with record_snapshot(output, device=device):
        try:
            run()
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    print(f"memscale record: wrote {output}; compare allocators with: build/memscale bench replay {output}", file=sys.stderr)
    return status


def cpu_snapshot_from_profile(prof: Any, *, max_entries: int = 1_000_000) -> dict[str, Any]:
    """Build a snapshot dict from a finished ``torch.profiler.profile(profile_memory=True)``.

    Only CPU allocations are taken. When there are more than *max_entries*
    trace entries the oldest are dropped, as PyTorch's ring buffer does.
    """
    from torch._C._profiler import _EventType

    allocs: list[tuple[int, int, int, str]] = []  # (time_ns, ptr, signed size, op)
    stack = [(root, "") for root in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, parent = stack.pop()
        if node.tag == _EventType.Allocation:
            f = node.extra_fields
            if str(f.device) == "cpu" and f.ptr:
                allocs.append((node.start_time_ns, int(f.ptr), int(f.alloc_size), parent))
        stack.extend((c, node.name) for c in node.children)
    allocs.sort(key=lambda a: a[0])
    t0 = allocs[0][0] if allocs else 0

    trace: list[dict[str, Any]] = []
    live: dict[int, tuple[int, str]] = {}
    for t, ptr, size, op in allocs:
        time_us = (t - t0) // 1000
        frames = [{"filename": "<op>", "line": 0, "name": op or "<unknown>"}]
        if size > 0:
            live[ptr] = (size, op)
            trace.append({"action": "alloc", "addr": ptr, "size": size, "stream": 0, "time_us": time_us, "frames": frames})
        elif size < 0:
            # A free whose alloc the profiler did not see (made before it
            # started) is kept: the replay allocates it at the start.
            live.pop(ptr, None)
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": ptr, "size": -size, "stream": 0, "time_us": time_us, "frames": frames})
    if len(trace) > max_entries:
        trace = trace[-max_entries:]
    segments = []
    for ptr, (size, op) in sorted(live.items()):
        frames = [{"filename": "<op>", "line": 0, "name": op or "<unknown>"}]
        block = {"address": ptr, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames}
        segments.append({
            "device": 0, "address": ptr, "total_size": size, "stream": 0, "segment_type": "large" if size > 1 << 20 else "small",
            "segment_pool_id": (0, 0), "allocated_size": size, "active_size": size, "requested_size": size,
            "is_expandable": False, "frames": frames, "blocks": [block],
        })
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {"recorded_with": "memscale.record_snapshot(device='cpu')"}}
