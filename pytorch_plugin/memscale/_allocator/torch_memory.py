"""``torch.cuda.memory_*`` answered by memscale while its allocator is installed.

Under a pluggable allocator PyTorch's own ``torch.cuda.memory_stats``,
``memory_allocated``, ``max_memory_allocated``, ``reset_peak_memory_stats``,
``memory_summary``, ``memory_snapshot`` and ``_snapshot`` raise, so third-party
code (Lightning's device stats, Hugging Face's memory metrics, profilers)
breaks. :func:`patch_torch_memory` (called by :func:`memscale.install`) replaces
them, in ``torch.cuda.memory`` and in ``torch.cuda``, with functions of the same
signature that read libmemscale.so: the same key names, the same snapshot
shape. :func:`restore_torch_memory` puts torch's functions back (they raise
again while the pluggable allocator is current).

Holds the saved originals; no policy.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Final

_lock = threading.Lock()
#: (module, name) -> torch's function, while patched.
_saved: dict[tuple[Any, str], Any] = {}


def _nested(device: Any = None) -> dict[str, Any]:
    """``memory_stats_as_nested_dict``: the flat keys split at their dots."""
    from .stats import memory_stats

    out: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # a key that is also a prefix: keep the value flat
                node = None
                break
            node = child
        if node is None:
            out[key] = value
        else:
            node[parts[-1]] = value
    return out


#: The functions replaced, as torch names them.
PATCHED: Final[tuple[str, ...]] = (
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "memory_summary",
    "memory_snapshot",
    "_snapshot",
    "_dump_snapshot",
)


def _replacements() -> dict[str, Callable[..., Any]]:
    from . import stats as allocator
    from .snapshot import dump_snapshot, snapshot

    def memory_stats(device: Any = None) -> OrderedDict[str, int]:
        return allocator.memory_stats(device)

    def memory_allocated(device: Any = None) -> int:
        return allocator.memory_allocated(device)

    def max_memory_allocated(device: Any = None) -> int:
        return allocator.max_memory_allocated(device)

    def memory_reserved(device: Any = None) -> int:
        return allocator.memory_reserved(device)

    def max_memory_reserved(device: Any = None) -> int:
        return allocator.max_memory_reserved(device)

    def reset_peak_memory_stats(device: Any = None) -> None:
        allocator.reset_peak_memory_stats(device)

    def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
        return allocator.memory_summary(device, abbreviated)

    def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
        return list(snapshot()["segments"])

    def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
        return snapshot()

    def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
        dump_snapshot(filename)

    functions: dict[str, Callable[..., Any]] = {
        "memory_stats": memory_stats,
        "memory_stats_as_nested_dict": _nested,
        "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_reserved,
        "max_memory_reserved": max_memory_reserved,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_max_memory_allocated": reset_peak_memory_stats,
        "reset_max_memory_cached": reset_peak_memory_stats,
        "memory_summary": memory_summary,
        "memory_snapshot": memory_snapshot,
        "_snapshot": _snapshot,
        "_dump_snapshot": _dump_snapshot,
    }
    assert tuple(functions) == PATCHED
    return functions


def patch_torch_memory() -> None:
    """Make the ``torch.cuda`` memory functions return memscale's numbers
    (idempotent; :func:`memscale.install` calls it)."""
    import torch
    import torch.cuda.memory as torch_memory

    with _lock:
        if _saved:
            return
        for name, replacement in _replacements().items():
            original = getattr(torch_memory, name, None)
            if original is None:
                continue
            replacement.__name__ = name
            replacement.__doc__ = f"memscale's answer to torch.cuda.{name} (see memscale.restore_torch_memory)"
            for module in (torch_memory, torch.cuda):
                if getattr(module, name, None) is original:
                    _saved[(module, name)] = original
                    setattr(module, name, replacement)


def restore_torch_memory() -> None:
    """Put torch's own memory functions back (no-op when not patched)."""
    with _lock:
        for (module, name), original in _saved.items():
            setattr(module, name, original)
        _saved.clear()


def torch_memory_patched() -> bool:
    """Whether the ``torch.cuda`` memory functions are memscale's now."""
    return bool(_saved)
