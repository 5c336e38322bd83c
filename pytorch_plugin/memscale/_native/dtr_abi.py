"""The DTR engine's C ABI declared for ctypes: its constants, the status block,
the ``memscale_dtr_*`` prototypes and the library's errors as
:class:`~memscale.errors.MemscaleError`.

The declarations only; :class:`memscale._native.engine.Engine` is the binding that
calls them (and re-exports the public names of this module).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Final

from . import lib as _lib
from ..errors import LibraryLoadError, MemscaleError

#: ``flags`` bit of :meth:`Engine.call`: the op cannot be re-run (its outputs are
#: never evicted by dropping; they may still be swapped out).
NO_RECOMPUTE: Final[int] = 1

#: Eviction actions written by ``memscale_dtr_evict``.
ACTION_DROP: Final[int] = 0
ACTION_SWAP: Final[int] = 1

#: Plan step kinds written by ``memscale_dtr_plan``.
STEP_RERUN: Final[int] = 0
STEP_SWAP_IN: Final[int] = 1

_i64 = ctypes.c_int64
_i32 = ctypes.c_int32
_P64 = ctypes.POINTER(ctypes.c_int64)
_P32 = ctypes.POINTER(ctypes.c_int32)


class Status(ctypes.Structure):
    """``memscale_dtr_status``: what the engine looks like after its last call.

    Attributes:
        usage: bytes in use (with ``"usage": "allocator"``, the allocator's count
            when the last call ended; allocations since are not in it).
        budget: bytes, 0 = unlimited.
        pending: storages the engine freed (released, banished, throw-away
            copies) that :meth:`Engine.evict` has not handed out yet.
        bytes_evicted: bytes of budget victims so far (drops and swaps).
        peak_usage: the highest count of resident registered bytes so far (the
            engine's own count, also with ``"usage": "allocator"``).
        next_op / next_tensor: the ids the next registered op and tensor get
            (ids run in sequence; what :meth:`Engine.queue` predicts from).
    """

    _fields_ = [
        ("usage", ctypes.c_int64),
        ("budget", ctypes.c_int64),
        ("pending", ctypes.c_int64),
        ("bytes_evicted", ctypes.c_int64),
        ("peak_usage", ctypes.c_int64),
        ("next_op", ctypes.c_int64),
        ("next_tensor", ctypes.c_int64),
    ]


# name -> (restype, argtypes) of every engine-side export.
_PROTOTYPES: Final[dict[str, tuple[Any, list[Any]]]] = {
    "memscale_dtr_create": (_i64, [ctypes.c_char_p]),
    "memscale_dtr_destroy": (ctypes.c_int, [_i64]),
    "memscale_dtr_status_of": (ctypes.c_void_p, [_i64]),
    "memscale_dtr_set_budget": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_finish": (ctypes.c_int, [_i64]),
    "memscale_dtr_tensor": (_i64, [_i64, _i64, _i32]),
    "memscale_dtr_call": (_i64, [_i64, ctypes.c_char_p, _P64, _i32, _P64, _P32, _i32, _i64, _i32, _P64]),
    "memscale_dtr_op": (_i64, [_i64, ctypes.c_char_p, ctypes.c_void_p]),
    "memscale_dtr_name": (_i64, [_i64, ctypes.c_char_p]),
    "memscale_dtr_ops": (_i64, [_i64, ctypes.c_void_p]),
    "memscale_dtr_mutate": (_i64, [_i64, ctypes.c_char_p, _P64, _i32, _P32, _i32, _i64, _i32, _P64]),
    "memscale_dtr_access": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_lock": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_unlock": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_pin": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_release": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_evict": (_i32, [_i64, _i64, _P64, _P32, _i32]),
    "memscale_dtr_reclaim": (_i32, [_i64, _i64, _P64, _P32, _i32]),
    "memscale_dtr_plan": (_i32, [_i64, _i64, _P32, _P64, _i32]),
    "memscale_dtr_abandon_plans": (ctypes.c_int, [_i64]),
    "memscale_dtr_park": (ctypes.c_int, [_i64, _i64]),
    "memscale_dtr_rematerialized": (ctypes.c_int, [_i64, _i64, _i64]),
    "memscale_dtr_swapped_in": (ctypes.c_int, [_i64, _i64]),
    # char*: declared c_void_p so the pointer survives for memscale_string_free.
    "memscale_dtr_stats_json": (ctypes.c_void_p, [_i64]),
    "memscale_dtr_tune": (ctypes.c_void_p, [_i64]),
}

_lock = threading.Lock()
_declared: ctypes.CDLL | None = None

def dtr_lib() -> ctypes.CDLL:
    """The library with the ``memscale_dtr_*`` prototypes declared (cached).

    Raises:
        LibraryNotFoundError: the library file was not found.
        LibraryLoadError: it could not be loaded or lacks an engine export (a
            library older than this package).
    """
    global _declared
    if _declared is not None:
        return _declared
    with _lock:
        if _declared is not None:
            return _declared
        handle = _lib.lib()
        missing = [name for name in _PROTOTYPES if not hasattr(handle, name)]
        if missing:
            raise LibraryLoadError(
                f"{_lib.library_path()} lacks the DTR engine exports {', '.join(missing)}: "
                "it is older than this package; rebuild it (make lib)"
            )
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(handle, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _declared = handle
        return handle


def unavailable_reason() -> str | None:
    """``None`` when the engine exports can be loaded, else why not (test skips)."""
    try:
        dtr_lib()
    except MemscaleError as exc:
        return str(exc)
    return None


def last_error() -> str:
    """The library's last recorded error ("" when none)."""
    return _lib.last_error()


def fail(what: str) -> MemscaleError:
    """A MemscaleError for the failed call ``what``, with the library's last error."""
    message = last_error() or "no error message recorded"
    return MemscaleError(f"{what}: {message}")


def json_object(ptr: Any, what: str) -> dict[str, Any]:
    """The JSON object behind a ``char*`` result of ``what`` (freed), or the
    library's error when it is NULL."""
    if not ptr:
        raise fail(what)
    result = _lib.take_json(ptr, what)
    if not isinstance(result, dict):
        raise MemscaleError(f"{what} returned {type(result).__name__}, expected an object")
    return result
