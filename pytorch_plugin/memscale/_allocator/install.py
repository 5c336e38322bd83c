"""Installing libmemscale.so as PyTorch's CUDA allocator.

:func:`install` swaps memscale in through ``torch.cuda.memory.CUDAPluggableAllocator``.
PyTorch allows that only before CUDA is initialized (its native caching allocator
is created at CUDA's lazy initialization, and once an allocator is in use it can
never be swapped), so ``install()`` must be the first CUDA-related thing a program
does. It checks that up front and raises a :class:`~memscale.errors.InstallError`
that changes nothing; if the swap itself still fails, whatever it set is restored.

A second ``install()`` with the same (or no) settings is a no-op that returns the
same :class:`Installation`; one with different settings raises
:class:`~memscale.errors.AlreadyInstalledError` - change the threshold or limit of a
running allocator with :func:`set_threshold` / :func:`set_limit` instead.

The statistics are in :mod:`memscale._allocator.stats`.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .._native import lib as _lib
from . import torch_limits as _torch_limits
from .device import device_index as _device_index, local_device
from .stats import device_total_memory, library_config, memory_stats
from .torch_memory import patch_torch_memory
from ..config import SizeLike, is_percentage, parse_size
from ..errors import (
    AlreadyInstalledError,
    ConfigError,
    CUDAAlreadyInitializedError,
    InstallError,
)

THRESHOLD_ENV: Final[str] = "MEMSCALE_EVICTION_THRESHOLD"
LIMIT_ENV: Final[str] = "MEMSCALE_MEMORY_LIMIT"
BACKEND_ENV: Final[str] = "MEMSCALE_BACKEND"
BACKENDS: Final[tuple[str, ...]] = ("auto", "cuda", "sim")

# The optional PyTorch hooks and the library exports behind them.
_HOOKS: Final[tuple[tuple[str, str], ...]] = (
    ("set_init_fn", "memscale_init"),
    ("set_reset_fn", "memscale_empty_cache"),
    ("set_memory_fraction_fn", "memscale_set_memory_fraction"),
    ("set_record_stream_fn", "memscale_record_stream"),
    # Throws before a CUDA graph capture (or a torch.cuda.MemPool) starts:
    # memscale has no private pools, so memory freed inside a graph would be
    # reused while the graph still uses it.
    ("set_begin_allocate_to_pool", "memscale_begin_allocate_to_pool"),
)


@dataclass(frozen=True)
class Installation:
    """What :func:`install` did. Kept alive for the life of the process.

    Attributes:
        library: path of the library PyTorch now allocates through.
        backend: the backend requested (``None``: the library's default /
            ``MEMSCALE_BACKEND``).
        thresholds: eviction threshold in bytes applied to each device
            (``None``: not set by install).
        limits: hard limit in bytes applied to each device (``None``: not set).
        allocator: the ``torch.cuda.memory.CUDAPluggableAllocator`` object.
        arguments: ``(threshold, limit, backend)`` as passed, to recognise a
            repeated call.
    """

    library: Path
    backend: str | None
    thresholds: dict[int, int] | None
    limits: dict[int, int] | None
    allocator: Any
    arguments: tuple[SizeLike | None, SizeLike | None, str | None]


_install_lock = threading.Lock()
_installed: Installation | None = None


def installed() -> Installation | None:
    """The current :class:`Installation`, or ``None`` if :func:`install` has not run."""
    return _installed


def _resolve(value: SizeLike, name: str, devices: list[int]) -> dict[int, int]:
    """Convert a size to bytes for every device (a percentage per device)."""
    out: dict[int, int] = {}
    for device in devices:
        total = device_total_memory(device) if is_percentage(value) else None
        if is_percentage(value) and total is None:
            raise ConfigError(
                f"{name}={value!r}: a percentage needs the device's memory size, which "
                f"libmemscale.so does not report for device {device}; pass bytes instead"
            )
        out[device] = parse_size(value, name=name, total=total)
    return out


def _env_value(var: str) -> str | None:
    value = os.environ.get(var)
    return value if value not in (None, "") else None


def _check_torch_ready() -> Any:
    """Every refusal of :func:`install`, before anything is changed."""
    try:
        import torch
    except ImportError as exc:
        raise InstallError("memscale.install() needs PyTorch; install torch") from exc
    if not hasattr(torch._C, "_cuda_customAllocator"):
        raise InstallError(
            f"this PyTorch build ({torch.__version__}) has no CUDA support, so it has no CUDA "
            "allocator to replace; install a CUDA build of torch"
        )
    current = torch._C._cuda_getAllocator()
    if current is not None:
        raise AlreadyInstalledError(
            "another pluggable CUDA allocator is already current in this process; PyTorch cannot swap allocators twice"
        )
    if torch.cuda.is_initialized():
        raise CUDAAlreadyInitializedError(
            "CUDA is already initialized in this process, so PyTorch's native caching "
            "allocator is in use and cannot be replaced; call memscale.install() at the very "
            "start of the program, before any CUDA tensor or call (torch.cuda.* queries, "
            ".cuda(), .to('cuda'))"
        )
    return torch


def _check_running_backend(backend: str) -> None:
    """Refuse a backend the already-loaded library cannot switch to."""
    cfg = library_config()
    configured = str(cfg.get("backend", ""))
    opened = {str(d.get("backend")) for d in cfg.get("devices") or [] if isinstance(d, dict)}
    if backend in ("auto", configured) or opened == {backend}:
        return
    running = ", ".join(sorted(opened)) if opened else configured
    raise InstallError(
        f"backend={backend!r}: libmemscale.so is already running with backend {running!r} "
        f"(it reads {BACKEND_ENV} once, when first loaded); call install() before any other "
        "memscale call"
    )


def install(
    threshold: SizeLike | None = None,
    limit: SizeLike | None = None,
    backend: str | None = None,
) -> Installation:
    """Make libmemscale.so PyTorch's CUDA allocator.

    Args:
        threshold: eviction threshold: bytes, ``"12GiB"`` or ``"75%"`` of each
            device's memory. ``None``: ``$MEMSCALE_EVICTION_THRESHOLD`` if set,
            else none.
        limit: hard cap on reserved memory, same syntax. ``None``:
            ``$MEMSCALE_MEMORY_LIMIT`` if set, else the device capacity.
        backend: ``"auto"``, ``"cuda"`` or ``"sim"``. Only takes effect if the
            library has not been loaded yet in this process (its Go runtime reads
            ``MEMSCALE_BACKEND`` once, at load); otherwise it must match the
            running backend.

    A threshold or limit is applied with ``memscale_set_threshold`` /
    ``memscale_set_limit`` to this process's device only
    (:func:`memscale._allocator.device.local_device`: ``LOCAL_RANK``,
    ``SLURM_LOCALID``, ``OMPI_COMM_WORLD_LOCAL_RANK``, else the current device),
    which opens it in the library (on CUDA: its primary context); a percentage
    is taken of that device's memory. No other device is opened.

    While installed, the ``torch.cuda`` memory functions that raise under a
    pluggable allocator return memscale's numbers
    (:func:`memscale.patch_torch_memory`; :func:`memscale.restore_torch_memory`
    puts torch's back).

    Returns:
        The :class:`Installation`; calling again with the same settings returns it
        unchanged.

    Raises:
        CUDAAlreadyInitializedError: CUDA is already initialized (too late).
        AlreadyInstalledError: installed before with other settings, or another
            pluggable allocator is current.
        ConfigError: a malformed argument or environment variable (named).
        InstallError: no CUDA support in this torch build, or the swap failed.
        LibraryNotFoundError: libmemscale.so was not found.
    """
    global _installed
    arguments = (threshold, limit, backend)
    with _install_lock:
        if _installed is not None:
            if arguments == (None, None, None) or arguments == _installed.arguments:
                return _installed
            raise AlreadyInstalledError(
                f"memscale is already installed with threshold={_installed.arguments[0]!r}, "
                f"limit={_installed.arguments[1]!r}, backend={_installed.arguments[2]!r}; use "
                "memscale.set_threshold() / memscale.set_limit() to change a running allocator"
            )
        # Validate everything before changing anything: arguments first (the
        # same error whatever the process state), then the process state.
        if backend is not None and backend not in BACKENDS:
            raise ConfigError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)}")
        threshold_name, limit_name = "threshold", "limit"
        if threshold is None and (env := _env_value(THRESHOLD_ENV)) is not None:
            threshold, threshold_name = env, THRESHOLD_ENV
        if limit is None and (env := _env_value(LIMIT_ENV)) is not None:
            limit, limit_name = env, LIMIT_ENV
        for value, name in ((threshold, threshold_name), (limit, limit_name)):
            if value is not None:
                parse_size(value, name=name, total=1)  # syntax; percentages resolved below
        torch = _check_torch_ready()

        saved_backend = os.environ.get(BACKEND_ENV)
        restore: list[tuple[str, int, int]] = []
        try:
            if backend is not None:
                if _lib.is_loaded():
                    _check_running_backend(backend)
                else:
                    os.environ[BACKEND_ENV] = backend
            path = _lib.library_path()
            _lib.check_configuration()  # a rejected MEMSCALE_* variable fails here, not at the first malloc
            devices = [local_device()]
            thresholds = _resolve(threshold, threshold_name, devices) if threshold is not None else None
            limits = _resolve(limit, limit_name, devices) if limit is not None else None

            # memscale_malloc_or_throw: an allocation that fails (after the
            # reclaimer asked the DTR engine to evict) throws a C++ exception
            # PyTorch turns into a Python error, instead of returning a NULL
            # PyTorch's pluggable path would not check.
            alloc = torch.cuda.memory.CUDAPluggableAllocator(str(path), "memscale_malloc_or_throw", "memscale_free")
            for setter, export in _HOOKS:
                getattr(alloc._allocator, setter)(_lib.function_address(export))

            for setting, export, key in (
                (limits, "memscale_set_limit", "limit_bytes"),
                (thresholds, "memscale_set_threshold", "eviction_threshold_bytes"),
            ):
                for device, nbytes in (setting or {}).items():
                    old = int(memory_stats(device).get(key, 0))
                    rc = getattr(_lib.lib(), export)(device, nbytes)
                    _lib.check(rc, f"{export}(device={device}, bytes={nbytes})")
                    restore.append((export, device, old))
            try:
                torch.cuda.memory.change_current_allocator(alloc)
            except RuntimeError as exc:
                if "already initialized" in str(exc):
                    raise CUDAAlreadyInitializedError(
                        f"PyTorch refused the swap ({exc}): CUDA memory was already allocated by "
                        "its native allocator; call memscale.install() before any CUDA use"
                    ) from exc
                raise InstallError(f"PyTorch refused the allocator swap: {exc}") from exc
        except BaseException:
            for export, device, old in reversed(restore):
                getattr(_lib.lib(), export)(device, old)
            if backend is not None:
                if saved_backend is None:
                    os.environ.pop(BACKEND_ENV, None)
                else:
                    os.environ[BACKEND_ENV] = saved_backend
            raise
        _torch_limits.guard(torch)  # cudnn.benchmark kept off, CUDA IPC refused clearly
        patch_torch_memory()
        _installed = Installation(
            library=path,
            backend=backend,
            thresholds=thresholds,
            limits=limits,
            allocator=alloc,
            arguments=arguments,
        )
        return _installed


def set_threshold(threshold: SizeLike, device: Any = None) -> int:
    """Change the eviction threshold of ``device`` (bytes, ``"12GiB"``, ``"75%"``; 0 = none).

    Returns:
        The threshold applied, in bytes.
    """
    index = _device_index(device)
    nbytes = _resolve(threshold, "threshold", [index])[index]
    _lib.check(_lib.lib().memscale_set_threshold(index, nbytes), "memscale_set_threshold")
    return nbytes


def set_limit(limit: SizeLike, device: Any = None) -> int:
    """Change the hard memory limit of ``device`` (bytes, ``"12GiB"``, ``"75%"``).

    Returns:
        The limit applied, in bytes.
    """
    index = _device_index(device)
    nbytes = _resolve(limit, "limit", [index])[index]
    _lib.check(_lib.lib().memscale_set_limit(index, nbytes), "memscale_set_limit")
    return nbytes
