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
   (``"12GiB"``) anywhere; a percentage of the GPU's memory, or on a machine
   without a GPU a percentage of the step's peak, measured by a first step that
   runs unbudgeted (:func:`percentage_of_peak`: the drop-in API's steps do that);
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

from .device import local_device
from ..config import format_bytes, is_percentage, parse_size
from ..errors import ConfigError

THRESHOLD_ENV: Final[str] = "MEMSCALE_EVICTION_THRESHOLD"

#: ``memscale run --threshold``: the value the command line put into
#: ``MEMSCALE_EVICTION_THRESHOLD``, so messages name the flag the user typed.
THRESHOLD_FLAG: Final[str] = "--threshold"
_flag_value: str | None = None


def set_from_flag(value: str) -> None:
    """``memscale run --threshold VALUE``: set the threshold for this process
    (and the processes it starts) and remember that the flag gave it."""
    global _flag_value
    os.environ[THRESHOLD_ENV] = value
    _flag_value = value


def threshold_name() -> str:
    """Where the threshold in the environment came from, for messages:
    ``--threshold`` when :func:`set_from_flag` put it there, else the variable."""
    raw = os.environ.get(THRESHOLD_ENV)
    return THRESHOLD_FLAG if _flag_value is not None and raw == _flag_value else THRESHOLD_ENV


def check_threshold(raw: str, name: str) -> None:
    """Raises ConfigError naming ``name`` when ``raw`` is not a threshold at all:
    malformed, zero, or a percentage outside (0, 100]. Needs no device: a
    percentage is resolved later."""
    nbytes = parse_size(raw, name=name, total=100)
    if nbytes <= 0:
        raise ConfigError(
            f"{name}={raw}: a threshold must be positive (leave it unset for no threshold; "
            "a run without one prints the peak it measured)"
        )


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


def percentage_of_peak(device: int | None = None) -> str | None:
    """The threshold when it is a percentage that has no GPU to be taken of
    (no CUDA device, no memscale allocator): then it is a percentage of the
    training step's peak, which the drop-in API measures with a first step
    that runs unbudgeted. ``None`` otherwise.

    Raises:
        ConfigError: ``MEMSCALE_EVICTION_THRESHOLD`` (or ``--threshold``) is
            malformed.
    """
    from .install import installed

    raw = _env_threshold()
    if raw is None or not is_percentage(raw) or installed() is not None or _cuda_device(device) is not None:
        return None
    check_threshold(raw, threshold_name())
    return raw


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
    from .install import installed
    from .stats import device_total_memory, memory_stats

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
    name = threshold_name()
    check_threshold(raw, name)
    total = None
    if is_percentage(raw):
        index = _cuda_device(device)
        total = device_total_memory(index) if index is not None else None
        if total is None:
            raise ConfigError(
                f"{name}={raw}: a percentage is of the GPU's memory, and this budget has no GPU to take it "
                "of; give bytes (for example 4GiB), or use it in memscale run / memscale.enable(), where "
                "on a machine without a GPU it is a percentage of the step's measured peak"
            )
    nbytes = parse_size(raw, name=name, total=total)
    return Budget(nbytes, f"{name} {raw}" if name == THRESHOLD_FLAG else f"{name}={raw}")


def default_budget(device: int | None = None) -> Budget:
    """The budget of a region that was given none: the threshold, else on a GPU
    with the memscale allocator the device's memory (evict on demand), else
    unlimited."""
    threshold = threshold_budget(device)
    if threshold is not None:
        return threshold
    from .install import installed
    from .stats import device_total_memory

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
