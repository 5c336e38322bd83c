"""Which CUDA device: this process's (its launcher's local rank), or the one named.

:func:`local_device` reads ``LOCAL_RANK`` (torchrun), then ``SLURM_LOCALID``, then
``OMPI_COMM_WORLD_LOCAL_RANK``, then falls back to the current CUDA device (0
before CUDA is initialized). ``memscale.install`` opens only that device in the
library and resolves percentages against its memory; the statistics functions
default to it. :func:`device_index` maps what users pass (``None``, ``1``,
``"cuda:1"``, a ``torch.device``) to an ordinal; :func:`module_device_index`
says which GPU a model is on.

Holds no state.
"""

from __future__ import annotations

import os
from typing import Any, Final

from ..errors import ConfigError

#: Environment variables naming the local rank, in the order they are read.
LOCAL_RANK_ENVS: Final[tuple[str, ...]] = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")


def local_rank() -> tuple[int, str] | None:
    """``(local rank, the variable it came from)``, or ``None`` when no launcher set one.

    Raises:
        ConfigError: the variable is not a non-negative integer.
    """
    for name in LOCAL_RANK_ENVS:
        raw = os.environ.get(name, "").strip()
        if not raw:
            continue
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value < 0:
            raise ConfigError(f"{name}={raw!r}: expected the local rank, an integer >= 0")
        return value, name
    return None


def local_device() -> int:
    """The CUDA device this process uses: its local rank's, else the current one.

    A process that sees one device (a launcher that gives each process its GPU
    through ``CUDA_VISIBLE_DEVICES``) or none (the simulated device) uses
    device 0.

    Raises:
        ConfigError: the local rank is malformed, or names a device this
            process cannot see while it sees several.
    """
    import torch

    found = local_rank()
    if found is None:
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    rank, name = found
    count = torch.cuda.device_count()
    if rank < count:
        return rank
    if count <= 1:
        return 0  # one visible device per process, or none (the simulated device 0)
    raise ConfigError(
        f"{name}={rank}: this process sees {count} CUDA devices (0..{count - 1}); set CUDA_VISIBLE_DEVICES "
        "so each rank sees its own GPU, or launch at most one rank per visible device"
    )


def device_index(device: Any) -> int:
    """Map ``None`` / int / ``"cuda:1"`` / ``torch.device`` to a device ordinal
    (``None``: this process's device, :func:`local_device`)."""
    if device is None:
        return local_device()
    if isinstance(device, bool):
        raise ConfigError(f"device={device!r}: expected a device index, 'cuda:N' or torch.device")
    if isinstance(device, int):
        if device < 0:
            raise ConfigError(f"device={device!r}: must not be negative")
        return device
    if isinstance(device, str):
        import torch

        device = torch.device(device)
    index = getattr(device, "index", None)
    dtype = getattr(device, "type", None)
    if dtype is None:
        raise ConfigError(f"device={device!r}: expected a device index, 'cuda:N' or torch.device")
    if dtype != "cuda":
        raise ConfigError(f"device={device!r}: memscale manages CUDA devices only")
    return local_device() if index is None else int(index)


def module_device_index(module: Any) -> int | None:
    """The CUDA device holding ``module``'s first parameter (None: CPU or unknown)."""
    if module is None:
        return None
    tensor = next(module.parameters(), None)
    if tensor is None:
        tensor = next(module.buffers(), None)
    if tensor is None or tensor.device.type != "cuda":
        return None
    return tensor.device.index or 0
