"""The allocator's statistics, in ``torch.cuda``'s names.

These functions (:func:`memory_stats`, :func:`memory_summary`, ...) replace the
``torch.cuda`` ones, which raise under a pluggable allocator. They read the
library directly and work whether or not :func:`memscale.install` was called.

Holds no state.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

from .._native import lib as _lib
from .._stats import GRANULE_KEYS
from ..config import format_bytes
from ..errors import MemscaleError
from .device import device_index as _device_index

def library_config() -> dict[str, Any]:
    """The library's effective configuration (``memscale_config_json``)."""
    value = _lib.take_json(_lib.lib().memscale_config_json(), "memscale_config_json")
    if not isinstance(value, dict):
        raise MemscaleError(f"memscale_config_json: expected an object, got {value!r:.200}")
    return value


def device_total_memory(device: Any = None) -> int | None:
    """Total memory of ``device`` in bytes, without initializing PyTorch's CUDA.

    Asked from the library first (``device_total_bytes``: the real card, or the
    simulated one; asking opens the device in the library), then from
    ``torch.cuda`` only if CUDA is already initialized. ``None`` when neither
    can tell.
    """
    index = _device_index(device)
    total = memory_stats(index).get("device_total_bytes")
    if total:
        return int(total)
    import torch

    if torch.cuda.is_initialized():
        return int(torch.cuda.get_device_properties(index).total_memory)
    return None


def memory_stats(device: Any = None) -> OrderedDict[str, int]:
    """The allocator's statistics with ``torch.cuda.memory_stats`` key names.

    Keys such as ``allocated_bytes.all.current``, ``reserved_bytes.large_pool.peak``,
    ``num_alloc_retries``, ``num_ooms``; sorted like torch's.
    """
    index = _device_index(device)
    raw = _lib.take_json(_lib.lib().memscale_stats_json(index), f"memscale_stats_json(device={index})")
    if not isinstance(raw, dict):
        raise MemscaleError(f"memscale_stats_json: expected an object, got {raw!r:.200}")
    return OrderedDict(sorted(raw.items()))


#: The allocator's granule counters (running totals) and the names summaries
#: give their differences (memscale._stats.GRANULE_KEYS): 2 MiB granules mapped, unmapped, and moved from one
#: place to another (unmapped from a free block, mapped where a request needed
#: them) - remaps are what a cache under a budget tries to avoid -; and the
#: large requests the step plans placed, or missed (fell back to best fit).
GRANULE_COUNTERS: Final[dict[str, str]] = dict(
    zip(
        ("num_map", "num_unmap", "num_remap", "num_step_plan_placed", "num_step_plan_missed"),
        GRANULE_KEYS,
        strict=True,
    )
)


def granule_counters(device: int | None) -> dict[str, int] | None:
    """The allocator's granule counters on ``device`` now, by summary name (0
    for a counter the library does not report); ``None`` for no device, or
    when the library cannot say (a summary then reports no granules)."""
    if device is None:
        return None
    try:
        stats = memory_stats(int(device))
    except MemscaleError:
        return None
    return {name: int(stats.get(key, 0)) for key, name in GRANULE_COUNTERS.items()}


class Granules:
    """What the allocator did to its granules over stretches of a program (a
    region's entries, a model's steps): :meth:`start` on a device, :meth:`stop`
    to add the stretch to the totals; :meth:`totals` includes a running one.
    Not started (no GPU, or the allocator is not counted): all zero."""

    def __init__(self) -> None:
        self._totals = dict.fromkeys(GRANULE_KEYS, 0)
        self._device: int | None = None
        self._start: dict[str, int] | None = None

    @property
    def device(self) -> int | None:
        """The device of the latest stretch (``None``: none counted)."""
        return self._device

    @property
    def running(self) -> bool:
        """Whether a stretch is being counted."""
        return self._start is not None

    def start(self, device: int | None) -> None:
        """Count from now on ``device`` (``None``: count nothing)."""
        self._device, self._start = device, granule_counters(device)

    def _since_start(self) -> dict[str, int]:
        now = granule_counters(self._device) if self._start is not None else None
        if self._start is None or now is None:
            return {}
        return {name: now[name] - self._start[name] for name in self._start}

    def stop(self) -> None:
        """End the running stretch, adding it to the totals."""
        for name, value in self._since_start().items():
            self._totals[name] += value
        self._start = None

    def totals(self) -> dict[str, int]:
        """The totals by summary name (``granules_mapped``, ...), the running stretch included."""
        running = self._since_start()
        return {name: value + running.get(name, 0) for name, value in self._totals.items()}


def _stat(device: Any, key: str) -> int:
    stats = memory_stats(device)
    if key not in stats:
        raise MemscaleError(f"libmemscale.so reports no {key!r} statistic")
    return int(stats[key])


def memory_allocated(device: Any = None) -> int:
    """Bytes currently allocated to tensors (``allocated_bytes.all.current``)."""
    index = _device_index(device)
    return _lib.check(int(_lib.lib().memscale_allocated(index)), f"memscale_allocated(device={index})")


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last peak reset."""
    return _stat(device, "allocated_bytes.all.peak")


def memory_reserved(device: Any = None) -> int:
    """Bytes the allocator holds from the device (``reserved_bytes.all.current``)."""
    return _stat(device, "reserved_bytes.all.current")


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved` since start or the last peak reset."""
    return _stat(device, "reserved_bytes.all.peak")


def reset_peak_memory_stats(device: Any = None) -> None:
    """Reset the ``*.peak`` statistics to their current values."""
    index = _device_index(device)
    _lib.check(_lib.lib().memscale_reset_peak_stats(index), f"memscale_reset_peak_stats(device={index})")


_SUMMARY_ROWS: Final[tuple[tuple[str, str, bool], ...]] = (
    # (stats prefix, label, is bytes)
    ("allocated_bytes", "Allocated memory", True),
    ("active_bytes", "Active memory", True),
    ("requested_bytes", "Requested memory", True),
    ("reserved_bytes", "Reserved memory", True),
    ("inactive_split_bytes", "Non-releasable memory", True),
    ("allocation", "Allocations", False),
    ("active", "Active allocs", False),
    ("segment", "Reserved segments", False),
    ("inactive_split", "Non-releasable allocs", False),
)
_POOLS: Final[tuple[tuple[str, str], ...]] = (
    ("all", ""),
    ("large_pool", "      from large pool"),
    ("small_pool", "      from small pool"),
)
_COLUMNS: Final[tuple[str, ...]] = ("current", "peak", "allocated", "freed")


def _format_summary(stats: dict[str, Any], device: int, version: str, abbreviated: bool) -> str:
    width = 79
    rule = "|" + "=" * (width - 2) + "|"
    thin = "|" + "-" * (width - 2) + "|"
    lines = [
        rule,
        f"|{f'memscale memory summary, device ID {device:<3d}':^{width - 2}}|",
        f"|{version:^{width - 2}}|",
        thin,
        f"|{'  Metric':<25}|{'Cur Usage':>12} |{'Peak Usage':>12} |{'Tot Alloc':>11} |{'Tot Freed':>9} |",
        rule,
    ]
    used: set[str] = set()
    for prefix, label, is_bytes in _SUMMARY_ROWS:
        if not any(k.startswith(prefix + ".") for k in stats):
            continue
        for pool, pool_label in _POOLS if not abbreviated else _POOLS[:1]:
            cells = []
            for column in _COLUMNS:
                key = f"{prefix}.{pool}.{column}"
                used.add(key)
                value = stats.get(key)
                if value is None:
                    cells.append("-")
                else:
                    cells.append(format_bytes(value).replace(" ", "") if is_bytes else str(value))
            name = pool_label or label
            lines.append(f"| {name:<24}|{cells[0]:>12} |{cells[1]:>12} |{cells[2]:>11} |{cells[3]:>9} |")
        lines.append(thin)
    other = {k: v for k, v in stats.items() if k not in used}
    for key, value in sorted(other.items()):
        shown = format_bytes(value) if key.endswith("_bytes") and isinstance(value, int) else str(value)
        lines.append(f"| {key:<48}{shown:>27} |")
    lines.append(rule)
    return "\n".join(lines) + "\n"


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A readable table of :func:`memory_stats`, laid out like ``torch.cuda.memory_summary``."""
    index = _device_index(device)
    return _format_summary(memory_stats(index), index, _lib.version(), abbreviated)
