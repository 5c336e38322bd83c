"""Device timing and swap copies: what the region measures and moves.

* **Op costs.** On the CPU an op's cost is its wall time
  (``time.perf_counter_ns``). On CUDA kernels run asynchronously, so the cost of
  an op is the device time last measured with CUDA events for the same (op,
  output size), read without synchronizing, or the host launch time when none
  is known yet (:class:`CudaTimer`).
* **Swap bandwidth.** The engine's swap-or-recompute decision needs the
  host<->device copy bandwidth (:func:`host_bandwidth`, measured once).
* **Swap copies.** :func:`copy_to_host` and :func:`copy_to_device` move one
  storage between device and host memory, keeping the geometry of every view.
* **Synchronizations.** Nothing on the hot path waits for the device: op costs
  come from events read when they completed, copies are asynchronous. What
  does wait (measuring the bandwidth once, the fingerprints of
  ``memscale.check``) goes through :func:`synchronize` or :func:`host_int`,
  which count it: ``summary()["synchronizations"]``.

Holds no residency bookkeeping; the session decides what to swap.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

from .cells import Geometry, StorageGroup, geometry, storage_view

perf_ns = time.perf_counter_ns

#: Synchronizations with the device the region made in this process (see
#: :func:`synchronize`, :func:`host_int`); sessions report their share.
_syncs = 0


def sync_count() -> int:
    """How many synchronizations the region's code made so far in this process."""
    return _syncs


def synchronize() -> None:
    """``torch.cuda.synchronize()``, counted."""
    global _syncs
    _syncs += 1
    torch.cuda.synchronize()


def host_int(t: torch.Tensor) -> int:
    """The value of one-element tensor ``t`` read by the host: a
    synchronization on a GPU (counted on every device, so tests on the CPU
    see it)."""
    global _syncs
    _syncs += 1
    return int(t)


class CudaTimer:
    """Approximate device time per op from CUDA events, read without syncing.

    The engine wants the cost when the op is registered, before its events
    completed, so the cost of an op is the device time last measured for the same
    (op, output size), or the host launch time when none is known yet.
    """

    #: Events still waited for beyond this are dropped (their op's time is not learned).
    MAX_PENDING = 256

    def __init__(self) -> None:
        self.device_ns: dict[tuple[Any, int], int] = {}
        self.pending: deque[tuple[tuple[Any, int], Any, Any]] = deque()
        self.spare: list[Any] = []

    def _event(self) -> Any:
        if self.spare:
            return self.spare.pop()
        return torch.cuda.Event(enable_timing=True)

    def start(self) -> Any:
        """Record and return the start event of an op about to be launched."""
        event = self._event()
        event.record()
        return event

    def stop(self, key: tuple[Any, int], start: Any, host_ns: int) -> int:
        """The op of ``key`` was launched after ``start``; returns its cost (ns)."""
        end = self._event()
        end.record()
        pending = self.pending
        pending.append((key, start, end))
        while pending and pending[0][2].query():
            done, s, e = pending.popleft()
            self.device_ns[done] = int(s.elapsed_time(e) * 1e6)
            self.spare += (s, e)
        if len(pending) > self.MAX_PENDING:
            _, s, e = pending.popleft()
            self.spare += (s, e)
        return max(host_ns, self.device_ns.get(key, 0))


_bandwidth: float | None = None


def host_bandwidth() -> float:
    """Host<->device copy bandwidth for the engine's swap decision (bytes/s),
    measured once per process (a nominal PCIe-like figure on the CPU)."""
    global _bandwidth
    if _bandwidth is not None:
        return _bandwidth
    if torch.cuda.is_available():
        n = 64 << 20
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host.copy_(dev, non_blocking=True)  # warm-up
        synchronize()
        t0 = time.perf_counter()
        for _ in range(4):
            host.copy_(dev, non_blocking=True)
        synchronize()
        _bandwidth = 4 * n / max(time.perf_counter() - t0, 1e-9)
    else:
        _bandwidth = 10e9
    return _bandwidth


def copy_to_host(group: StorageGroup) -> None:
    """Copy the group's storage to host memory and forget the device data."""
    views: dict[Any, Geometry] = {}
    storage = None
    for cell in group.cells:
        t = cell.tensor
        if t is not None:
            if storage is None:
                storage = t.untyped_storage()
            views[cell] = geometry(t)
    if storage is None:
        return
    on_cuda = storage.device.type == "cuda"
    host = torch.UntypedStorage(storage.nbytes(), device="cpu")
    if on_cuda:
        host = host.pin_memory()
    host.copy_(storage, non_blocking=on_cuda)
    group.host_copy = (host, storage.device)
    group.swapped_views = views
    for cell in group.cells:
        cell.tensor = None


def copy_to_device(group: StorageGroup) -> list[Any]:
    """Copy a swapped-out storage back; returns the cells it re-made."""
    assert group.host_copy is not None and group.swapped_views is not None
    host, device = group.host_copy
    storage = torch.UntypedStorage(host.nbytes(), device=device)
    storage.copy_(host, non_blocking=True)
    cells = []
    for cell, g in group.swapped_views.items():
        cell.tensor = storage_view(storage, g)
        cells.append(cell)
    group.host_copy = None
    group.swapped_views = None
    return cells
