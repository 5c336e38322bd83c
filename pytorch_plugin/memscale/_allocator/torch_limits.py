"""What a pluggable allocator breaks in PyTorch itself, made safe or made clear.

Once memscale is PyTorch's CUDA allocator (``CUDAPluggableAllocator``), some
PyTorch features call allocator methods the pluggable class implements only as
``TORCH_CHECK(false, "CUDAPluggableAllocator does not yet support ...")``
(torch/csrc/cuda/CUDAPluggableAllocator.cpp, every version through 2.15):

* ``cacheInfo``: cuDNN autotuning (``torch.backends.cudnn.benchmark = True``)
  asks it for the largest free block to bound the workspace of the algorithms
  it times (``getMaxWorkspaceSize`` in Conv_v7.cpp, ``get_available_workspace``
  in Conv_v8.cpp), so a CNN dies at its first convolution (pytorch #98481).
  The allocator cannot answer it (the method is not a hook), so
  :func:`guard` keeps ``benchmark`` False: the current value is turned off and
  every later ``= True`` (the ``torch.backends.cudnn.benchmark`` property and
  ``torch.backends.cudnn.flags(benchmark=True)``) is turned into False with a
  warning, once per process. cuDNN then picks algorithms by its heuristics.
* ``shareIpcHandle`` / ``getIpcDevPtr``: CUDA IPC (a CUDA tensor sent through
  ``torch.multiprocessing``) raises PyTorch's generic message; :func:`guard`
  makes it a :class:`~memscale.errors.MemscaleError` that names the limitation
  and what to do instead.

CUDA graph capture is refused in the library itself: install() sets the
allocator's begin-allocate-to-pool hook to ``memscale_begin_allocate_to_pool``,
which throws before capture starts (see memscale.h). PyTorch's
``CUDAGraph::capture_begin`` calls that hook only after it has put the CUDA
generators into capture mode, and a throw there leaves them in it: every later
random op on the device (dropout) then fails with "Offset increment outside
graph capture encountered unexpectedly" (seen on an H200, 2026-11-27). So
:func:`guard` also makes ``torch.cuda.CUDAGraph.capture_begin`` call the hook
first, before PyTorch touches any generator: the capture is refused with the
library's message and the process stays usable.

Holds no policy; :func:`guard` is idempotent.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Final

from ..errors import MemscaleError

_log = logging.getLogger("memscale")

CUDNN_BENCHMARK_WARNING: Final[str] = (
    "memscale: torch.backends.cudnn.benchmark=True cannot work under a pluggable CUDA allocator "
    "(cuDNN autotuning calls the allocator's cacheInfo, which PyTorch's CUDAPluggableAllocator "
    "raises in; pytorch issue #98481), so it is kept False: cuDNN chooses convolution "
    "algorithms by its heuristics instead of timing them"
)

IPC_MESSAGE: Final[str] = (
    "memscale: CUDA tensors cannot be shared between processes (CUDA IPC) while memscale is "
    "PyTorch's CUDA allocator: PyTorch's pluggable allocator has no IPC handles "
    "(CUDAPluggableAllocator::{}). Send tensor.cpu() instead (and move it back in the receiver), "
    "or share it from a process that does not install memscale"
)

_lock = threading.Lock()
_guarded = False
_warned = False


def _warn_benchmark() -> None:
    global _warned
    if not _warned:
        _warned = True
        _log.warning(CUDNN_BENCHMARK_WARNING)
        warnings.warn(CUDNN_BENCHMARK_WARNING, RuntimeWarning, stacklevel=3)


def _safe_setter(original: Any) -> Any:
    """A ``torch._C._set_cudnn_benchmark`` that refuses True."""

    def set_cudnn_benchmark(value: bool) -> None:
        if value:
            _warn_benchmark()
        original(False)

    set_cudnn_benchmark.__memscale_original__ = original  # type: ignore[attr-defined]
    return set_cudnn_benchmark


def _refuse_ipc(original: Any, method: str) -> Any:
    """A storage IPC method that raises memscale's message for CUDA storages."""

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        device = getattr(self, "device", None)
        if getattr(device, "type", None) == "cuda":
            raise MemscaleError(IPC_MESSAGE.format(method))
        return original(self, *args, **kwargs)

    refuse.__memscale_original__ = original  # type: ignore[attr-defined]
    return refuse


def guard(torch: Any) -> None:
    """Make cuDNN autotuning safe and CUDA IPC fail clearly; call once the
    memscale allocator is current. Idempotent."""
    global _guarded
    with _lock:
        if _guarded:
            return
        _guarded = True
        from torch.backends import ContextProp

        c = torch._C
        original = c._set_cudnn_benchmark
        safe = _safe_setter(original)
        c._set_cudnn_benchmark = safe  # torch.backends.cudnn.flags() / set_flags look it up at call time
        cudnn = torch.backends.cudnn
        type(cudnn).benchmark = ContextProp(c._get_cudnn_benchmark, safe)  # the property kept the original
        if c._get_cudnn_benchmark():
            safe(True)

        storage = torch.UntypedStorage
        storage._share_cuda_ = _refuse_ipc(storage._share_cuda_, "shareIpcHandle")
        storage._new_shared_cuda = classmethod(_refuse_new_shared_cuda)

        graph = getattr(torch.cuda, "CUDAGraph", None)
        if graph is not None:
            graph.capture_begin = _refuse_capture_first(torch, graph.capture_begin)


def _pool_id(pool: Any) -> tuple[int, int]:
    """The (int, int) id of a graph pool token, a ``torch.cuda.MemPool`` or None."""
    if isinstance(pool, tuple) and len(pool) == 2:
        return int(pool[0]), int(pool[1])
    pool_id = getattr(pool, "id", None)
    if isinstance(pool_id, tuple) and len(pool_id) == 2:
        return int(pool_id[0]), int(pool_id[1])
    return 0, 0


def _refuse_capture_first(torch: Any, original: Any) -> Any:
    """A ``CUDAGraph.capture_begin`` that asks the allocator's
    begin-allocate-to-pool hook (memscale's, which always refuses) before
    PyTorch puts the CUDA generators into capture mode."""

    def capture_begin(self: Any, pool: Any = None, *args: Any, **kwargs: Any) -> Any:
        device = torch.cuda.current_device() if torch.cuda.is_available() else 0
        torch._C._cuda_beginAllocateCurrentThreadToPool(device, _pool_id(pool))
        return original(self, pool, *args, **kwargs)  # reached only if the hook let the capture start

    capture_begin.__memscale_original__ = original  # type: ignore[attr-defined]
    return capture_begin


def _refuse_new_shared_cuda(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """Receiving a CUDA tensor from another process (``getIpcDevPtr``)."""
    raise MemscaleError(IPC_MESSAGE.format("getIpcDevPtr"))
