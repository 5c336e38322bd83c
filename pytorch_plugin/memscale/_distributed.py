"""memscale under ``torch.distributed``: each rank's device, DDP and FSDP2.

**The local device.** A rank uses one GPU: the one its launcher names.
:func:`local_device` reads ``LOCAL_RANK`` (torchrun), then ``SLURM_LOCALID``,
then ``OMPI_COMM_WORLD_LOCAL_RANK``, then falls back to the current CUDA device
(0 before CUDA is initialized). ``memscale.install`` opens only that device in
the library and resolves percentages against its memory; the statistics
functions default to it.

**DDP.** ``DistributedDataParallel.forward`` rebuilds its gradient buckets in
C++ code that reads the buckets' data directly, so a step's region must not be
open yet when it runs: the step opens at the wrapped module's forward instead
(:func:`step_module`, :func:`opens_no_step`). Its gradient all-reduce runs in
backward, inside the region, through ``c10d`` ops, which the region never
re-runs (``UNREPLAYABLE_NAMESPACES`` in :mod:`memscale._region.schema`).

**FSDP2** (``fully_shard``). Its hooks all-gather parameters into buffers and
free them again by resizing storages, which a region's tensors cannot be; so
the hooks of every ``FSDPParamGroup`` run with the region's mode suspended
(:func:`patch_fsdp`), and the unsharded parameters they produce are marked
volatile (:mod:`memscale._region.volatile`): an op that read one is never
re-run, because by then FSDP may have freed it.

Holds the one-time FSDP patch; no policy.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any, Final

from .errors import ConfigError

#: Environment variables naming the local rank, in the order they are read.
LOCAL_RANK_ENVS: Final[tuple[str, ...]] = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")

#: ``FSDPParamGroup`` methods that run with the region's mode suspended.
_FSDP_METHODS: Final[tuple[str, ...]] = (
    "pre_forward",
    "post_forward",
    "pre_backward",
    "post_backward",
    "finalize_backward",
    "unshard",
    "wait_for_unshard",
    "reshard",
)
_FSDP_GROUP_MODULE: Final[str] = "torch.distributed.fsdp._fully_shard._fsdp_param_group"

_lock = threading.Lock()
_fsdp_patched = False


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


def _is_ddp(module: Any) -> bool:
    ddp = sys.modules.get("torch.nn.parallel.distributed")
    return ddp is not None and isinstance(module, ddp.DistributedDataParallel)


def step_module(module: Any) -> Any:
    """The module whose forward opens a step: a DDP model's wrapped module, else ``module``."""
    return module.module if _is_ddp(module) else module


def opens_no_step(module: Any) -> bool:
    """Whether a step must not open at ``module``'s forward (DDP: the wrapped
    module's forward, which follows, opens it)."""
    return _is_ddp(module)


def _suspended(method: Any) -> Any:
    from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack

    from ._region import volatile
    from ._region.mode import RegionMode

    @functools.wraps(method)
    def run_plain(self: Any, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(mode, RegionMode) for mode in _get_current_dispatch_mode_stack()):
            with _disable_current_modes():
                result = method(self, *args, **kwargs)
        else:  # no region open: FSDP runs as it would without memscale
            result = method(self, *args, **kwargs)
        for fsdp_param in getattr(self, "fsdp_params", ()):
            param = getattr(fsdp_param, "_unsharded_param", None)
            if param is not None:
                volatile.mark(getattr(param, "_local_tensor", param))
        return result

    run_plain.__memscale_original__ = method  # type: ignore[attr-defined]
    return run_plain


def patch_fsdp() -> bool:
    """Run FSDP2's parameter-group hooks outside the region's mode (once per
    process, when FSDP2 is imported; harmless without a region). Returns
    whether the patch is in place."""
    global _fsdp_patched
    if _fsdp_patched:
        return True
    group_module = sys.modules.get(_FSDP_GROUP_MODULE)
    if group_module is None:
        return False
    with _lock:
        if not _fsdp_patched:
            cls = group_module.FSDPParamGroup
            for name in _FSDP_METHODS:
                method = getattr(cls, name, None)
                if method is not None and not hasattr(method, "__memscale_original__"):
                    setattr(cls, name, _suspended(method))
            _fsdp_patched = True
    return True
