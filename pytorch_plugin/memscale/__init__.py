"""memscale: train PyTorch models beyond GPU memory with libmemscale.so.

Four layers, use the one you need:

* ``python -m memscale run script.py`` (or ``memscale.enable()`` first thing in the
  script): every training step of an unmodified script runs under DTR, with
  ``MEMSCALE_EVICTION_THRESHOLD`` as the budget (see ``memscale/_enable.py``).
* ``memscale.install(threshold=..., limit=...)``: make libmemscale.so PyTorch's CUDA
  allocator (call it first thing, before any CUDA use). ``memory_stats()``,
  ``memory_summary()``, ``snapshot()``, ``dump_snapshot()`` replace the
  ``torch.cuda`` versions that raise under a pluggable allocator;
  ``record_snapshot(path)`` records a run under PyTorch's own allocator as a
  snapshot pickle for ``memscale bench replay``.
* ``with memscale.dtr(budget="8GiB"): ...``: a Dynamic Tensor Rematerialization
  region; tensors are evicted and rebuilt as the Go engine decides
  (``memscale.DTRRegion``, ``memscale.DTRTensor``, ``memscale.unwrap``; the
  design is in ``memscale/_region/__init__.py``).
* ``memscale.blocks(model, budget="50%")``: block-level DTR - the activations of
  whole blocks (transformer layers) are evicted and recomputed as the engine
  decides, with no per-op interception (``memscale/_blocks/__init__.py``).
* ``memscale.wrap(model_or_trainer, memscale.Config(mode="balanced"))``,
  ``memscale.optimize(model, optimizer)``, ``memscale.detach(...)``,
  ``memscale.summary(...)``: run every training step under a region.

Everything importable without torch works without it; the library is loaded on
first use (``MEMSCALE_LIBRARY``, next to this package, or the repository's
``build/libmemscale.so``).
"""

from __future__ import annotations

from typing import Any

from .allocator import (
    Installation,
    device_total_memory,
    install,
    installed,
    library_config,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
    set_limit,
    set_threshold,
)
from ._torch_memory import patch_torch_memory, restore_torch_memory, torch_memory_patched
from ._budget import THRESHOLD, Budget
from ._enable import Enabled, enable
from .api import Summary, detach, end_step, optimize, summary, wrap
from .config import Config, OptimizationMode, parse_size
from .errors import (
    AlreadyInstalledError,
    ConfigError,
    CUDAAlreadyInitializedError,
    InstallError,
    LibraryLoadError,
    LibraryNotFoundError,
    MemscaleError,
)
from .record import record_snapshot
from .snapshot import dump_snapshot, snapshot

from ._version import __version__



def blocks(
    model: Any,
    budget: int | str | None = None,
    *,
    modules: list[Any] | None = None,
    heuristic: str | None = None,
    allocated: Any = None,
) -> Any:
    """Block-level DTR on ``model``: returns a :class:`memscale._blocks.BlockDTR`.

    Each forward call of a block (``modules``, or the entries of the model's
    outermost lists of same-class modules: its transformer layers) is one unit;
    the activations it saves for backward are evicted as the engine decides
    and recomputed from the block's inputs when backward needs them, with its
    random-number, autocast and buffer state.

    Args:
        model: the model (hooks are put on its blocks; ``detach()`` removes them).
        budget: bytes of block activations (``int`` or ``"2GiB"``), or a
            percentage of what the first step's blocks held (that step runs
            with no budget to measure it). ``None``: the eviction threshold
            (``MEMSCALE_EVICTION_THRESHOLD`` or ``install(threshold=)``) - on a
            GPU a bound of the device's allocated memory (what is allocated
            outside the blocks is measured at each decision and left out of
            the blocks' share), on the CPU of the blocks' activations.
        modules: the blocks to track (default: found in ``model``).
        heuristic: the engine's eviction heuristic (default: the engine's).
        allocated: ``() -> bytes in use``: makes a byte ``budget`` a bound of
            that memory, as the threshold is on a GPU (default there:
            ``torch.cuda.memory_allocated`` of the model's device).

    Raises:
        ConfigError: a malformed budget, no budget and no threshold, or no
            blocks found.
    """
    from ._blocks import BlockDTR

    return BlockDTR(model, budget, modules, heuristic, allocated)


__all__: list[str] = [
    "AlreadyInstalledError",
    "Budget",
    "Enabled",
    "THRESHOLD",
    "CUDAAlreadyInitializedError",
    "Config",
    "ConfigError",
    "InstallError",
    "Installation",
    "LibraryLoadError",
    "LibraryNotFoundError",
    "MemscaleError",
    "OptimizationMode",
    "Summary",
    "__version__",
    "blocks",
    "detach",
    "device_total_memory",
    "dump_snapshot",
    "enable",
    "end_step",
    "install",
    "installed",
    "library_config",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "optimize",
    "parse_size",
    "patch_torch_memory",
    "record_snapshot",
    "restore_torch_memory",
    "torch_memory_patched",
    "reset_peak_memory_stats",
    "set_limit",
    "set_threshold",
    "snapshot",
    "summary",
    "wrap",
]


_REGION_NAMES = ("CheckReport", "DTRRegion", "DTRTensor", "EvictedTensorError", "check", "dtr", "unwrap")
_region_import_error: ImportError | None = None
try:
    from ._region import DTRRegion, DTRTensor, EvictedTensorError, dtr, unwrap
    from ._check import CheckReport, check
except ImportError as exc:  # the region cannot load here
    _region_import_error = exc
else:
    __all__ += list(_REGION_NAMES)


def __getattr__(name: str) -> Any:
    if name in _REGION_NAMES and _region_import_error is not None:
        raise AttributeError(f"memscale.{name} is unavailable: importing the DTR region failed ({_region_import_error})")
    if name == "MemscaleCallback":  # imports transformers, so only on demand
        from .hf import MemscaleCallback

        return MemscaleCallback
    raise AttributeError(f"module 'memscale' has no attribute {name!r}")
