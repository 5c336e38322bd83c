"""Where a region's budget comes from: an explicit value, or the eviction threshold.

The eviction threshold is the product's one setting: ``MEMSCALE_EVICTION_THRESHOLD``
(or ``memscale.install(threshold=...)`` / ``memscale.set_threshold``) is the budget
of every region that is not given one (``memscale.dtr()``, ``wrap()``,
``optimize()``, the Trainer integration, ``memscale.enable()`` and
``python -m memscale run``). An explicit budget, ``Config.threshold`` or an explicit
``Config.mode`` wins over it. A :class:`Budget` carries its bytes and, for the
summaries, where they came from.

Order, for a device:

1. the threshold in force in the installed allocator (``install`` applied the
   argument or the environment variable; ``set_threshold`` may have changed it);
2. without the allocator installed, ``MEMSCALE_EVICTION_THRESHOLD`` itself: bytes
   (``"12GiB"``) anywhere, a percentage only where there is a GPU to take it of;
3. none. On a GPU with the allocator installed, a region then still protects the
   run: its budget is the device's memory, so the engine keeps every tensor's
   lineage and evicts only when an allocation would otherwise fail (the
   allocator's reclaimer asks it to).

Holds no state; reads the environment and the installed allocator when asked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from ._distributed import local_device
from .config import format_bytes, is_percentage, parse_size
from .errors import ConfigError

THRESHOLD_ENV: Final[str] = "MEMSCALE_EVICTION_THRESHOLD"


@dataclass(frozen=True)
class Budget:
    """A region budget and where it came from.

    Attributes:
        nbytes: the budget in bytes (0 = unlimited).
        source: where it came from, for summaries and logs
            (``"MEMSCALE_EVICTION_THRESHOLD=4GiB"``, ``"dtr(budget=...)"``...).
        on_demand: the budget is the device's whole memory because no threshold
            is set: the engine evicts only when an allocation would fail.
    """

    nbytes: int
    source: str
    on_demand: bool = False

    def __str__(self) -> str:
        amount = "unlimited" if self.nbytes == 0 else format_bytes(self.nbytes)
        return f"{amount} ({self.source})"


class _Threshold:
    """The default budget of :func:`memscale.dtr`: the eviction threshold."""

    def __repr__(self) -> str:
        return "memscale.THRESHOLD"


#: ``memscale.dtr(budget=THRESHOLD)`` (the default): the eviction threshold in
#: force (see :func:`default_budget`); ``budget=None`` is explicitly unbudgeted.
THRESHOLD: Final = _Threshold()


def _env_threshold() -> str | None:
    value = os.environ.get(THRESHOLD_ENV, "").strip()
    return value or None


def _cuda_device(device: int | None) -> int | None:
    """``device``, or the current CUDA device when there is one (``None`` on the CPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    if device is not None:
        return device
    # This process's device (its local rank's under torchrun / SLURM / Open MPI),
    # without initializing CUDA before memscale.install().
    return local_device()


def threshold_budget(device: int | None = None) -> Budget | None:
    """The eviction threshold in force for ``device`` (default: the current
    CUDA device), or ``None`` when no threshold is set.

    Raises:
        ConfigError: ``MEMSCALE_EVICTION_THRESHOLD`` is malformed, or a
            percentage where there is no GPU to take it of (on the CPU give
            bytes, such as ``4GiB``).
    """
    from .allocator import device_total_memory, installed, memory_stats

    installation = installed()
    if installation is not None:
        index = _cuda_device(device)
        index = local_device() if index is None else index
        nbytes = int(memory_stats(index).get("eviction_threshold_bytes", 0))
        if nbytes <= 0:
            return None
        passed = installation.arguments[0]
        source = f"install(threshold={passed!r})" if passed is not None else f"{THRESHOLD_ENV}={_env_threshold()}"
        return Budget(nbytes, source)
    raw = _env_threshold()
    if raw is None:
        return None
    total = None
    if is_percentage(raw):
        index = _cuda_device(device)
        total = device_total_memory(index) if index is not None else None
        if total is None:
            raise ConfigError(
                f"{THRESHOLD_ENV}={raw}: a percentage needs a GPU's memory size and there is no GPU "
                "here; give bytes (for example 4GiB)"
            )
    nbytes = parse_size(raw, name=THRESHOLD_ENV, total=total)
    if nbytes <= 0:
        raise ConfigError(f"{THRESHOLD_ENV}={raw}: must be positive (unset it for no threshold)")
    return Budget(nbytes, f"{THRESHOLD_ENV}={raw}")


def default_budget(device: int | None = None) -> Budget:
    """The budget of a region that was given none: the threshold, else on a GPU
    with the memscale allocator the device's memory (evict on demand), else
    unlimited."""
    threshold = threshold_budget(device)
    if threshold is not None:
        return threshold
    from .allocator import device_total_memory, installed

    index = _cuda_device(device)
    if index is not None and installed() is not None:
        total = device_total_memory(index)
        if total:
            return Budget(
                int(total),
                f"no {THRESHOLD_ENV}: the device's memory, evicting only when an allocation would fail",
                on_demand=True,
            )
    return Budget(0, f"no {THRESHOLD_ENV} set")
