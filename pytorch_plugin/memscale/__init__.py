"""memscale: train PyTorch models beyond GPU memory with libmemscale.so.

Use the layer you need:

* ``python -m memscale run script.py`` (or ``memscale.enable()`` first thing in the
  script): every training step of an unmodified script runs under DTR, with
  ``MEMSCALE_EVICTION_THRESHOLD`` as the budget (see ``memscale/_dropin/enable.py``).
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

``import memscale`` is cheap: the names above are resolved on first use (torch and
the library are loaded then, not before), so ``memscale version`` and the
command line answer at once. The library is found through ``MEMSCALE_LIBRARY``,
next to this package, or in the repository's ``build/``.

The package, bottom to top (a module imports only from the layers below it;
``tests/test_layers.py`` checks it):

* ``errors``, ``_version``, ``_hooks``: no dependencies;
* ``_native/``: the binding of libmemscale.so (ctypes, the engine handle, the C
  crossing extension);
* ``config``, ``_stats``: settings, sizes, the counters and :class:`Summary`;
* ``_allocator/``: installing the allocator, its statistics, snapshots, which
  device, where a budget comes from (the eviction threshold);
* ``_region/``: the op-level DTR region and ``memscale.check``;
* ``_blocks/``: block-level DTR;
* ``_dropin/``, ``hf``, ``lightning``, ``metrics``: a region per training step
  with no code change (``enable``, ``wrap``, ``optimize``) and its integrations;
* ``trace``, ``demo``, ``_cli`` (the ``memscale`` command line), this file.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__
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

#: The public names resolved on first use: name -> the module that defines it.
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        ("Installation", "install", "installed", "set_limit", "set_threshold"), "._allocator.install"
    ),
    **dict.fromkeys(
        (
            "device_total_memory",
            "library_config",
            "max_memory_allocated",
            "max_memory_reserved",
            "memory_allocated",
            "memory_reserved",
            "memory_stats",
            "memory_summary",
            "reset_peak_memory_stats",
        ),
        "._allocator.stats",
    ),
    **dict.fromkeys(("patch_torch_memory", "restore_torch_memory", "torch_memory_patched"), "._allocator.torch_memory"),
    **dict.fromkeys(("THRESHOLD", "Budget"), "._allocator.budget"),
    "record_snapshot": "._allocator.record",
    **dict.fromkeys(("dump_snapshot", "snapshot"), "._allocator.snapshot"),
    **dict.fromkeys(("Enabled", "enable"), "._dropin.enable"),
    **dict.fromkeys(("detach", "optimize", "wrap"), "._dropin.api"),
    **dict.fromkeys(("end_step", "summary"), "._dropin.attached"),
    "Summary": "._stats",
    **dict.fromkeys(("DTRRegion", "DTRTensor", "EvictedTensorError", "dtr", "unwrap"), "._region"),
    **dict.fromkeys(("CheckReport", "check"), "._region.check"),
    **dict.fromkeys(("Plan", "plan"), "._plan"),
    "MemscaleCallback": ".hf",  # imports transformers
}

#: Names whose module is the DTR region (torch's dispatch modes): unavailable
#: where it cannot be imported, with the reason.
_REGION_NAMES = frozenset(name for name, module in _LAZY.items() if module.startswith("._region"))


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


__all__: list[str] = sorted(
    {
        "__version__",
        "blocks",
        "Config",
        "OptimizationMode",
        "parse_size",
        "AlreadyInstalledError",
        "ConfigError",
        "CUDAAlreadyInitializedError",
        "InstallError",
        "LibraryLoadError",
        "LibraryNotFoundError",
        "MemscaleError",
        *(name for name in _LAZY if name != "MemscaleCallback"),
    }
)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memscale' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    except ImportError as exc:
        if name in _REGION_NAMES:
            raise AttributeError(f"memscale.{name} is unavailable: importing the DTR region failed ({exc})") from exc
        raise
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
