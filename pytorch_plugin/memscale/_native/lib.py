"""Locating and loading ``libmemscale.so`` and calling its C ABI through ctypes.

Search order (the first hit wins):

1. ``$MEMSCALE_LIBRARY`` - when set it is authoritative: a missing file there is an
   error, the other places are not tried (so a stale copy is never picked up by
   accident);
2. ``libmemscale.so`` next to this package (``memscale/libmemscale.so``, where a
   wheel or ``make install`` would put it);
3. ``build/libmemscale.so`` in the package directory and each directory above it
   (the repository's ``make lib`` output for an editable install or a checkout).

The library is opened once per process with ctypes' default flags (immediate
symbol binding, as PyTorch's ``CUDAPluggableAllocator`` opens it) and never
unloaded: a Go c-shared library cannot be unloaded. Only the allocator-side
exports are declared here; the engine side (``memscale_dtr_*``) is declared by
:mod:`memscale._native.engine`.

Note: the Go runtime inside the library copies the process environment when the
library is loaded. ``MEMSCALE_*`` variables set with ``os.environ`` afterwards are
not seen by it; that is why :func:`memscale.install` applies its settings through
calls, not the environment.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from pathlib import Path
from typing import Any, Final

from ..errors import LibraryLoadError, LibraryNotFoundError, MemscaleError

LIBRARY_ENV: Final[str] = "MEMSCALE_LIBRARY"
LIBRARY_NAME: Final[str] = "libmemscale.so"

#: The package directory (memscale/), where a wheel puts libmemscale.so.
_PACKAGE_DIR: Final[Path] = Path(__file__).resolve().parent.parent

# name -> (restype, argtypes) for every allocator-side export of the C ABI.
_PROTOTYPES: Final[dict[str, tuple[Any, list[Any]]]] = {
    "memscale_malloc": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "memscale_free": (None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "memscale_init": (None, [ctypes.c_int]),
    "memscale_empty_cache": (None, []),
    "memscale_set_memory_fraction": (None, [ctypes.c_double, ctypes.c_int]),
    "memscale_record_stream": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    # char* results are declared c_void_p so the pointer survives for
    # memscale_string_free (c_char_p would convert and lose it).
    "memscale_stats_json": (ctypes.c_void_p, [ctypes.c_int]),
    "memscale_snapshot_json": (ctypes.c_void_p, []),
    "memscale_reset_peak_stats": (ctypes.c_int, [ctypes.c_int]),
    "memscale_set_threshold": (ctypes.c_int, [ctypes.c_int, ctypes.c_int64]),
    "memscale_set_limit": (ctypes.c_int, [ctypes.c_int, ctypes.c_int64]),
    # A training step ended on the device (the allocator's step plans): memscale._allocator.boundary
    "memscale_step_boundary": (ctypes.c_int, [ctypes.c_int]),
    # (device, int64_t (*fn)(int device, int64_t need, void* ctx), ctx): see memscale._region.reclaim
    "memscale_set_reclaimer": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "memscale_allocated": (ctypes.c_int64, [ctypes.c_int]),
    # const int64_t* (NULL out of range): read with ctypes.c_int64.from_address, no call
    "memscale_allocated_address": (ctypes.c_void_p, [ctypes.c_int]),
    "memscale_config_json": (ctypes.c_void_p, []),
    # Static storage owned by the library: c_char_p is right (never freed).
    "memscale_last_error": (ctypes.c_char_p, []),
    # NULL, or why the library rejected its MEMSCALE_* configuration (static).
    "memscale_config_error": (ctypes.c_char_p, []),
    "memscale_error_count": (ctypes.c_int, []),
    "memscale_clear_error": (None, []),
    "memscale_string_free": (None, [ctypes.c_void_p]),
    "memscale_version": (ctypes.c_char_p, []),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_path: Path | None = None


def search_paths() -> list[Path]:
    """The places searched for the library, in order (see the module doc)."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return [Path(env).expanduser()]
    paths = [_PACKAGE_DIR / LIBRARY_NAME]
    for directory in (_PACKAGE_DIR, *_PACKAGE_DIR.parents):
        paths.append(directory / "build" / LIBRARY_NAME)
    return paths


def find_library() -> Path:
    """Return the path of the library that :func:`lib` would load.

    Raises:
        LibraryNotFoundError: no candidate exists; the error lists every path
            tried.
    """
    paths = search_paths()
    for path in paths:
        if path.is_file():
            return path.resolve()
    reason = f"{LIBRARY_ENV} is set and points to a missing file" if os.environ.get(LIBRARY_ENV) else ""
    raise LibraryNotFoundError(paths, reason)


def unavailable_reason() -> str | None:
    """``None`` when the library file can be found, else why not (for test skips)."""
    try:
        find_library()
    except LibraryNotFoundError as exc:
        return str(exc)
    return None


def lib() -> ctypes.CDLL:
    """The loaded library with every allocator-side prototype declared (cached).

    Raises:
        LibraryNotFoundError: the file was not found.
        LibraryLoadError: it could not be loaded or lacks an export.
    """
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = find_library()
        try:
            handle = ctypes.CDLL(str(path))
        except OSError as exc:
            raise LibraryLoadError(f"cannot load {path}: {exc}") from exc
        missing = [name for name in _PROTOTYPES if not hasattr(handle, name)]
        if missing:
            raise LibraryLoadError(
                f"{path} lacks the exports {', '.join(missing)}: it is not a (current) libmemscale.so"
            )
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(handle, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _check_version(path, handle)
        _lib_path = path
        _lib = handle
        return handle


def _check_version(path: Path, handle: ctypes.CDLL) -> None:
    """Refuse a library whose version is not this package's (one number for
    both: ``MEMSCALE_VERSION`` in ``cabi/memscale.h``)."""
    from .. import _version

    raw = handle.memscale_version()
    found = raw.decode("utf-8", "replace") if raw else ""
    expected = f"memscale {_version.__version__}"
    if found != expected:
        raise LibraryLoadError(
            f"{path} is {found or 'of an unknown version'!r} but this Python package is {expected!r}: "
            "the library and the package must be built from the same memscale (rebuild the library "
            f"with `make lib`, reinstall with `pip install ./pytorch_plugin`, or point {LIBRARY_ENV} at "
            "the matching libmemscale.so)"
        )


def is_loaded() -> bool:
    """Whether this process has loaded the library through :func:`lib`."""
    return _lib is not None


def library_path() -> Path:
    """Path of the loaded library (loads it if needed)."""
    lib()
    assert _lib_path is not None
    return _lib_path


def last_error() -> str:
    """The library's last recorded error ("" when none)."""
    raw = lib().memscale_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def error_count() -> int:
    """Number of errors the library has recorded so far."""
    return int(lib().memscale_error_count())


def clear_error() -> None:
    """Forget the library's last error."""
    lib().memscale_clear_error()


def version() -> str:
    """The library's version string."""
    raw = lib().memscale_version()
    return raw.decode("utf-8", "replace") if raw else ""


def _failure(what: str) -> MemscaleError:
    message = last_error() or "no error message recorded"
    return MemscaleError(f"{what} failed: {message}" if what else message)


def check(rc: int, what: str = "") -> int:
    """Return ``rc`` when it is ``>= 0``; raise the library's last error otherwise.

    Args:
        rc: an int-returning export's result (``-1`` on error by contract).
        what: the operation, prefixed to the error message.

    Raises:
        MemscaleError: ``rc < 0``; the message is ``memscale_last_error()``.
    """
    if rc < 0:
        raise _failure(what)
    return rc


def take_string(ptr: int | None, what: str = "") -> str:
    """Read a ``char*`` returned by the library and free it.

    Raises:
        MemscaleError: ``ptr`` is NULL (the call failed); the message is the
            library's last error.
    """
    if not ptr:
        raise _failure(what)
    try:
        data = ctypes.string_at(ptr)
    finally:
        lib().memscale_string_free(ptr)
    return data.decode("utf-8", "replace")


def take_json(ptr: int | None, what: str = "") -> Any:
    """:func:`take_string` then ``json.loads``."""
    text = take_string(ptr, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise MemscaleError(f"{what}: the library returned malformed JSON ({exc}): {text[:200]!r}") from exc


def function_address(name: str) -> int:
    """The C address of export ``name`` (for PyTorch's ``set_*_fn`` hooks)."""
    address = ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value
    if not address:
        raise LibraryLoadError(f"{library_path()}: export {name} has no address")
    return address


def check_configuration() -> None:
    """Raises ConfigError with the library's own message when it rejected its
    ``MEMSCALE_*`` configuration (read once, at the library's first call that
    needs it): every allocation would fail, so the call that installs or
    creates says so instead of the first allocation."""
    from ..errors import ConfigError

    message = lib().memscale_config_error()
    if message:
        raise ConfigError(f"libmemscale.so rejected its configuration: {message.decode(errors='replace')}")
