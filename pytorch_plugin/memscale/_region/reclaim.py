"""Allocation failures ask the open sessions to evict (the allocator's reclaimer).

When the memscale allocator cannot meet a request on a device (its limit, or
the card, is full even after its cache was released), it calls the reclaimer
of that device (``memscale_set_reclaimer``), without any allocator lock held,
before failing. memscale's reclaimer asks every open session whose engine
counts that device's allocator (``"usage": "allocator"``) - and every
:class:`~memscale._blocks.tracker.BlockDTR` under a device budget - newest first, to
evict about the missing bytes (``memscale_dtr_reclaim``: victims by the engine's
heuristic, whatever the budget); each session drops (or swaps out) the victims,
which frees their memory through ``memscale_free`` while the reclaimer runs, and
the allocator retries. With no threshold set on a GPU, this is the only way a
region evicts: its budget is the whole device.

The inputs of the op that is running (whose kernel is what allocates) are
locked for the duration, so they are never chosen. The callback never raises
into the allocator: an error is logged and counts as "could not help".

Holds the process-wide registry of sessions per device and the one ctypes
callback object (it must outlive every allocation).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from typing import Protocol

    class Session(Protocol):
        """What the registry asks: a region's session, or block-level DTR."""

        @property
        def closed(self) -> bool: ...

        def reclaim(self, need: int) -> int: ...

log = logging.getLogger("memscale")

_Reclaimer: Final = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p)

_lock = threading.Lock()
_sessions: dict[int, list[weakref.ref[Session]]] = {}
_installed_devices: set[int] = set()


def _reclaim(device: int, need: int, ctx: Any) -> int:
    """The allocator's reclaimer: returns the bytes the sessions freed (0: none)."""
    try:
        with _lock:
            refs = list(_sessions.get(device, ()))
        freed = 0
        for ref in reversed(refs):
            session = ref()
            if session is None or session.closed:
                continue
            freed += session.reclaim(need - freed)
            if freed >= need:
                break
        return freed
    except BaseException as exc:  # never unwind into the allocator
        log.warning("memscale: the reclaimer of device %d failed (%s); the allocation fails", device, exc)
        return 0


#: The C function pointer handed to the library; kept alive for the process.
_CALLBACK: Final = _Reclaimer(_reclaim)


def device_of(config: dict[str, Any]) -> int | None:
    """The device whose allocation failures a session of engine configuration
    ``config`` evicts for: one whose usage is that device's allocator's
    (``"usage": "allocator"``); ``None`` for the others."""
    return config.get("device") if config.get("usage") == "allocator" else None


def refused(session: Any, need: int) -> None:
    """Count an allocation on another thread that ``session`` could not evict
    for (it was busy on its own thread); the first one is logged."""
    session.reclaims_refused += 1
    if session.reclaims_refused == 1:
        log.warning(
            "memscale: an allocation of %d more bytes failed on another thread while this DTR region "
            "was busy on its own; the region did not evict for it (it cannot change its state under "
            "its own thread). Allocate from the region's thread, or set a threshold that leaves room",
            need,
        )


def register(session: Session, device: int) -> None:
    """``session`` evicts for allocation failures on ``device`` until :func:`unregister`."""
    from .._native import lib as _lib

    with _lock:
        refs = _sessions.setdefault(device, [])
        refs[:] = [r for r in refs if r() is not None]
        refs.append(weakref.ref(session))
        if device not in _installed_devices:
            _lib.check(_lib.lib().memscale_set_reclaimer(device, ctypes.cast(_CALLBACK, ctypes.c_void_p), None), "memscale_set_reclaimer")
            _installed_devices.add(device)


def unregister(session: Session, device: int) -> None:
    """Stop asking ``session`` (the callback stays installed; it finds no session)."""
    with _lock:
        refs = _sessions.get(device)
        if refs is not None:
            refs[:] = [r for r in refs if r() is not None and r() is not session]
