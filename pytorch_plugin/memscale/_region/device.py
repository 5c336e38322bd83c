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
  On CUDA the copy out goes straight into pinned memory (PyTorch's caching
  host allocator, which reuses a pinned block once the copies recorded on it
  finished: the staging pool), asynchronously on the current stream; before
  the device storage is dropped it is ``record_stream``-ed on that stream, so
  its block (cached on the stream that allocated it) is not reused by another
  stream before the copy has read it; the copy back waits for an event
  recorded after the copy out, whatever stream it runs on. The CUDA calls go
  through :class:`SwapOps`, so a test can check their order on the CPU.
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
    """Approximate device time per op from CUDA events, read without syncing,
    on a sample of the ops.

    The engine wants the cost when the op is registered, before its events
    completed, so the cost of an op is the device time last measured for the
    same (op, output size); for a size not measured yet, the op's measured
    device time per output byte times this size; with nothing measured for the
    op, the host launch time.

    Recording two events costs more than the rest of the region's work on an
    op (``Event.record`` looks the current stream up in Python), and a
    training step runs the same ops with the same sizes again and again, so
    an op is timed only while it has fewer than :attr:`SAMPLES` measurements
    and then once every :attr:`STRIDE` calls (new sizes and drift are still
    learned). :meth:`start` says whether this call is timed.
    """

    #: Events still waited for beyond this are dropped (their op's time is not learned).
    MAX_PENDING = 256
    #: Calls of an op timed before sampling starts.
    SAMPLES = 4
    #: After that, one call in this many is timed.
    STRIDE = 32

    def __init__(self) -> None:
        self.device_ns: dict[tuple[Any, int], int] = {}
        self.pending: deque[tuple[tuple[Any, int], Any, Any]] = deque()
        self.spare: list[Any] = []
        self.calls: dict[Any, int] = {}  # per op: calls seen
        self.rate: dict[Any, tuple[int, int]] = {}  # per op: (device ns, output bytes) measured
        self._stream: Any = None  # the current stream object, cached
        self._raw = -1  # its handle

    def _event(self) -> Any:
        if self.spare:
            return self.spare.pop()
        return torch.cuda.Event(enable_timing=True)

    def _current_stream(self) -> Any:
        """``torch.cuda.current_stream()`` without its Python lookups when
        the current stream did not change (one C call)."""
        raw = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
        if raw != self._raw:
            self._stream, self._raw = torch.cuda.current_stream(), raw
        return self._stream

    def start(self, func: Any) -> Any:
        """Record and return the start event of a call of ``func`` about to be
        launched, or ``None`` when this call is not timed."""
        n = self.calls.get(func, 0)
        self.calls[func] = n + 1
        if n >= self.SAMPLES and n % self.STRIDE:
            return None
        event = self._event()
        event.record(self._current_stream())
        return event

    def stop(self, key: tuple[Any, int], start: Any, host_ns: int) -> int:
        """The op of ``key`` (op, output bytes) was launched after ``start``
        (``None``: not timed); returns its cost (ns)."""
        pending = self.pending
        if start is not None:
            end = self._event()
            end.record(self._current_stream())
            pending.append((key, start, end))
        while pending and pending[0][2].query():
            done, s, e = pending.popleft()
            ns = int(s.elapsed_time(e) * 1e6)
            self.device_ns[done] = ns
            total_ns, total_bytes = self.rate.get(done[0], (0, 0))
            self.rate[done[0]] = (total_ns + ns, total_bytes + done[1])
            self.spare += (s, e)
        if len(pending) > self.MAX_PENDING:
            _, s, e = pending.popleft()
            self.spare += (s, e)
        known = self.device_ns.get(key)
        if known is None:
            total_ns, total_bytes = self.rate.get(key[0], (0, 0))
            known = total_ns * key[1] // total_bytes if total_bytes else 0
        return max(host_ns, known)


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


class SwapOps:
    """The CUDA calls a swap makes, one method each (a test substitutes a recorder)."""

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def pinned(self, nbytes: int) -> Any:
        """``nbytes`` of pinned host memory, no pageable buffer in between."""
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).untyped_storage()

    def device_storage(self, nbytes: int, device: torch.device) -> Any:
        return torch.UntypedStorage(nbytes, device=device)

    def copy(self, dst: Any, src: Any) -> None:
        """Asynchronous on the current stream."""
        dst.copy_(src, non_blocking=True)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def event(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)


CUDA_OPS = SwapOps()


def copy_to_host(group: StorageGroup, ops: SwapOps | None = None) -> None:
    """Copy the group's storage to host memory and forget the device data.

    ``ops`` (default: CUDA when the storage is on CUDA, else a plain copy)
    makes the device-side calls."""
    views: dict[Any, Geometry] = {}
    storage = None
    tensor = None
    for cell in group.cells:
        t = cell.tensor
        if t is not None:
            if storage is None:
                storage, tensor = t.untyped_storage(), t
            views[cell] = geometry(t)
    if storage is None or tensor is None:
        return
    if ops is None and storage.device.type == "cuda":
        ops = CUDA_OPS
    ready = None
    if ops is None:
        host = torch.UntypedStorage(storage.nbytes(), device="cpu")
        host.copy_(storage)
    else:
        stream = ops.current_stream(storage.device)
        host = ops.pinned(storage.nbytes())
        ops.copy(host, storage)
        # The block returns to the cache of the stream that allocated it:
        # without this, work queued there could overwrite it before the copy
        # on this stream has read it.
        ops.record_stream(tensor, stream)
        ready = ops.event(stream)
    group.host_copy = (host, storage.device, ready)
    group.swapped_views = views
    for cell in group.cells:
        cell.tensor = None


def copy_to_device(group: StorageGroup, ops: SwapOps | None = None) -> list[Any]:
    """Copy a swapped-out storage back; returns the cells it re-made."""
    assert group.host_copy is not None and group.swapped_views is not None
    host, device, ready = group.host_copy
    if ops is None and device.type == "cuda":
        ops = CUDA_OPS
    if ops is None:
        storage = torch.UntypedStorage(host.nbytes(), device=device)
        storage.copy_(host)
    else:
        stream = ops.current_stream(device)
        if ready is not None:
            ops.wait(stream, ready)  # the copy out may have run on another stream
        storage = ops.device_storage(host.nbytes(), device)
        ops.copy(storage, host)
    cells = []
    for cell, g in group.swapped_views.items():
        cell.tensor = storage_view(storage, g)
        cells.append(cell)
    group.host_copy = None
    group.swapped_views = None
    return cells
