"""Allocator snapshots in the shape of ``torch.cuda.memory._snapshot()``.

Under a pluggable allocator PyTorch's own ``_snapshot()`` raises, so memscale
produces the same structure from the library: ``{"segments": [...],
"device_traces": [[...], ...]}``. :func:`dump_snapshot` pickles it exactly like
``torch.cuda.memory._dump_snapshot`` does, so https://pytorch.org/memory_viz and
``torch.cuda._memory_viz`` render it. The alloc/free trace is only recorded when
the library runs with ``MEMSCALE_TRACE_CAPACITY`` > 0; otherwise
``device_traces`` holds empty lists.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from .._native import lib as _lib
from ..errors import MemscaleError

Snapshot = dict[str, Any]


def _normalize(raw: Any) -> Snapshot:
    """Check the library's JSON and fill the optional keys the viewers read.

    The Go side produces the torch shape; this only adds defaults (empty
    ``frames``, ``requested_size`` = ``size``, stream 0) so that a field the
    library leaves out never breaks ``memory_viz`` or ``_memory_viz.segsum``.
    """
    if not isinstance(raw, dict) or not isinstance(raw.get("segments"), list):
        raise MemscaleError(f"memscale_snapshot_json: expected an object with a 'segments' list, got {raw!r:.200}")
    traces = raw.get("device_traces")
    if traces is None:
        traces = []
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise MemscaleError("memscale_snapshot_json: 'device_traces' must be a list of lists")
    for seg in raw["segments"]:
        if not isinstance(seg, dict) or "address" not in seg or "total_size" not in seg:
            raise MemscaleError(f"memscale_snapshot_json: malformed segment {seg!r:.200}")
        seg.setdefault("device", 0)
        seg.setdefault("stream", 0)
        seg.setdefault("segment_type", "large")
        blocks = seg.setdefault("blocks", [])
        for block in blocks:
            block.setdefault("frames", [])
            block.setdefault("requested_size", block.get("size", 0))
            block.setdefault("state", "inactive")
        active = sum(b.get("size", 0) for b in blocks if b["state"] != "inactive")
        seg.setdefault("allocated_size", sum(b.get("size", 0) for b in blocks if b["state"] == "active_allocated"))
        seg.setdefault("active_size", active)
        seg.setdefault("requested_size", sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"))
    for trace in traces:
        for event in trace:
            event.setdefault("frames", [])
            event.setdefault("stream", 0)
            event.setdefault("time_us", 0)
    raw["device_traces"] = traces
    return raw


def snapshot() -> Snapshot:
    """The library's current segments and recorded alloc/free trace (torch shape).

    Works whether or not :func:`memscale.install` was called.
    """
    return _normalize(_lib.take_json(_lib.lib().memscale_snapshot_json(), "memscale_snapshot_json"))


def dump_snapshot(path: str | os.PathLike[str] = "memscale_snapshot.pickle") -> Path:
    """Pickle :func:`snapshot` to ``path`` (open it at https://pytorch.org/memory_viz).

    Returns:
        The path written.
    """
    target = Path(path)
    data = snapshot()
    with open(target, "wb") as f:
        pickle.dump(data, f)
    return target
