"""memscale under ``torch.distributed``: DDP and FSDP2.

(Each rank's device, its launcher's local rank, is
:func:`memscale._allocator.device.local_device`.)

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
import sys
import threading
from typing import Any, Final


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

    from .._region import volatile
    from .._region.mode import RegionMode

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
