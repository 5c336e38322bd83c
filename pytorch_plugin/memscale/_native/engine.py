"""The DTR engine's C ABI (``memscale_dtr_*``): the one ctypes layer over it.

The engine (Go, packages ``evict`` and ``recompute`` behind ``cabi/engine.go``) owns
every decision: which tensor to evict, drop or swap, how many bytes are in use,
and which ops to re-run to rebuild a tensor. Python reports what happened (an
op ran, a reference was dropped) and executes the engine's answers.
:class:`Engine` is the only binding of those calls: the region's hot path calls
its methods, which reuse preallocated argument buffers and raise
:class:`~memscale.errors.MemscaleError` with the engine's message on failure.
The ctypes declarations themselves (prototypes, the status block, constants)
are :mod:`._dtr_abi`'s; the names callers use are re-exported here.

Contract of the calls (``cabi/memscale.h``): every int-returning call returns
``>= 0`` on success and ``-1`` on error, with the message in
``memscale_last_error()``; ``char*`` results are freed with
``memscale_string_free``. :attr:`Engine.status` is the engine's status block
(usage, budget, storages waiting to be handed out, bytes evicted, peak), kept
current by the engine after every call, so the caller can skip calls that would
do nothing.

Crossings are the cost of this layer (a ctypes call is about 0.5 us, more than
the engine's own work for an op): :meth:`Engine.release` only queues the id,
and the queue goes to the engine with the next call - with the next op's
registration (:meth:`Engine.op`, ``memscale_dtr_op``: releases, the op and the
storages it freed in one crossing), or first thing in any other call, so the
engine sees every event in the order it happened. Until then the status block
does not show what those releases free. ``memscale_dtr_op`` itself is called
through a tiny C extension built at first use (:mod:`._crossing`; ctypes when
it cannot be built), which halves its cost.

Ops can be queued the same way (:meth:`Engine.queue`): the engine gives ids in
sequence and publishes the next ones in the status block (``next_op``,
``next_tensor``), so the caller predicts the ids of a queued op and the engine
checks each prediction when the queue arrives (:meth:`Engine.flush`,
``memscale_dtr_ops``: many ops, their releases and the storages they freed in
one crossing). Like releases, the queue goes first in any other call;
:attr:`Engine.queued_bytes` are the queued ops' fresh bytes, which the status
block's ``usage`` does not show yet.
"""

from __future__ import annotations

import ctypes
import json
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, Final

from . import crossing as _crossing
from .dtr_abi import (
    ACTION_DROP,
    ACTION_SWAP,
    NO_RECOMPUTE,
    STEP_RERUN,
    STEP_SWAP_IN,
    Status,
    _i32,
    _i64,
    dtr_lib,
    last_error,
    unavailable_reason,
)
from .dtr_abi import fail as _fail
from .dtr_abi import json_object as _json_object
from ..errors import MemscaleError

#: ``memscale_dtr_op``'s frame: header fields, and the storages handed out per call.
_FRAME_HEADER: Final[int] = 6
_FRAME_HAND_OUT: Final[int] = 64
#: ``memscale_dtr_ops``' frame header: the number of records, the room for storages handed out.
_BATCH_HEADER: Final[int] = 2


class _Buffers:
    """Argument arrays of one engine, reused by every call (grown on demand)."""

    __slots__ = ("capacity", "inputs", "sizes", "aliases", "outputs", "mutated")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.inputs = (_i64 * capacity)()
        self.sizes = (_i64 * capacity)()
        self.aliases = (_i32 * capacity)()
        self.outputs = (_i64 * capacity)()
        self.mutated = (_i32 * capacity)()


#: The text of the engine's error when nothing more can be evicted (Go's
#: ``evict.ErrNoEvictable``).
_NOTHING_EVICTABLE: Final[str] = "nothing evictable"


class NoRoomError(MemscaleError):
    """The budget loop found nothing (more) to evict for what was asked: every
    resident storage is pinned, locked or too small. Raised by
    :meth:`Engine.evict`; a rebuild whose plans nested may start over after it
    (:func:`~memscale._region.rebuild.make_resident`)."""


class Engine:
    """One DTR engine instance (a ``memscale_dtr_create`` handle).

    Args:
        config: the engine configuration (keys of ``memscale_dtr_create``:
            ``budget``, ``heuristic``, ``recomp_time_factor``,
            ``recomp_memory_factor``, ``evictee_min_size``, ``swap_bandwidth``,
            ``usage``, ``device``, ``defaults``, ...). ``None`` values are left
            out so the engine applies its defaults.

    Raises:
        MemscaleError: the engine rejected the configuration (the message names
            the key and value).
    """

    #: Victims asked for per ``memscale_dtr_evict`` call.
    EVICT_BATCH: Final[int] = 256

    def __init__(self, config: dict[str, Any]) -> None:
        lib = dtr_lib()
        payload = json.dumps({k: v for k, v in config.items() if v is not None}).encode()
        h = int(lib.memscale_dtr_create(payload))
        if h <= 0:
            raise _fail(f"memscale_dtr_create({payload.decode()})")
        self.handle: int = h
        address = lib.memscale_dtr_status_of(h)
        if not address:
            lib.memscale_dtr_destroy(h)
            raise _fail("memscale_dtr_status_of")
        #: The engine's status block (valid until :meth:`close`).
        self.status: Status = Status.from_address(address)
        self._destroy = lib.memscale_dtr_destroy
        self._set_budget = lib.memscale_dtr_set_budget
        self._finish = lib.memscale_dtr_finish
        self._tensor = lib.memscale_dtr_tensor
        self._call = lib.memscale_dtr_call
        self._mutate = lib.memscale_dtr_mutate
        self._access = lib.memscale_dtr_access
        self._lock = lib.memscale_dtr_lock
        self._unlock = lib.memscale_dtr_unlock
        self._pin = lib.memscale_dtr_pin
        self._release = lib.memscale_dtr_release
        self._evict = lib.memscale_dtr_evict
        self._reclaim = lib.memscale_dtr_reclaim
        self._plan = lib.memscale_dtr_plan
        self._abandon_plans = lib.memscale_dtr_abandon_plans
        self._park = lib.memscale_dtr_park
        self._rematerialized = lib.memscale_dtr_rematerialized
        self._swapped_in = lib.memscale_dtr_swapped_in
        self._stats_json = lib.memscale_dtr_stats_json
        self._tune = lib.memscale_dtr_tune
        self._op = lib.memscale_dtr_op
        #: memscale_dtr_op without ctypes (the C extension of :mod:`._crossing`), or None.
        self._op_fast = _crossing.op_function(ctypes.cast(lib.memscale_dtr_op, ctypes.c_void_p).value or 0)
        self._name = lib.memscale_dtr_name
        self._ops = lib.memscale_dtr_ops
        self._ops_fast = _crossing.ops_function(ctypes.cast(lib.memscale_dtr_ops, ctypes.c_void_p).value or 0)
        #: Ops queued by :meth:`queue`, not told to the engine yet: their
        #: records (``memscale_dtr_ops``' layout), how many, and the bytes of
        #: their fresh outputs (not in ``status.usage`` yet).
        self._records = array("q")
        self.queued = 0
        self.queued_bytes = 0
        self._next_op = 0
        self._next_tensor = 0
        self._name_ids: dict[bytes, int] = {}
        self._batch_frame = (_i64 * 0)()
        self._buffers = _Buffers(64)
        #: Released ids not told to the engine yet (see the module doc).
        self.released: list[int] = []
        self._frame_size = 0
        self._new_frame(256)
        self._victim_ids = (_i64 * self.EVICT_BATCH)()
        self._victim_actions = (_i32 * self.EVICT_BATCH)()
        self._plan_kinds = (_i32 * 1024)()
        self._plan_ids = (_i64 * 1024)()

    # Lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Destroy the engine instance (idempotent); :attr:`status` is invalid after."""
        if self.handle > 0:
            h, self.handle = self.handle, 0
            if self._destroy(h) < 0:
                raise _fail("memscale_dtr_destroy")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Settings -------------------------------------------------------------

    def set_budget(self, nbytes: int) -> None:
        """Change the budget (bytes; 0 = unlimited)."""
        if self.released or self.queued:
            self.flush_releases()
        if self._set_budget(self.handle, int(nbytes)) < 0:
            raise _fail(f"memscale_dtr_set_budget({nbytes})")

    def finish(self) -> None:
        """The step is over: from now on the budget loop never fails for lack of
        candidates (what escapes the region is made resident even when it does
        not fit the budget; ``peak_usage`` shows by how much)."""
        if self.released or self.queued:
            self.flush_releases()
        if self._finish(self.handle) < 0:
            raise _fail("memscale_dtr_finish")

    # Registration ---------------------------------------------------------

    def tensor(self, nbytes: int, pinned: bool = True) -> int:
        """Register an external tensor (input, parameter); returns its id."""
        if self.released or self.queued:
            self.flush_releases()
        t = self._tensor(self.handle, nbytes, 1 if pinned else 0)
        if t < 0:
            raise _fail(f"memscale_dtr_tensor({nbytes})")
        return int(t)

    def _grow(self, n: int) -> _Buffers:
        capacity = self._buffers.capacity
        while capacity < n:
            capacity *= 2
        self._buffers = _Buffers(capacity)
        return self._buffers

    def call(
        self,
        name: bytes | str,
        inputs: Sequence[int],
        out_sizes: Sequence[int],
        out_alias: Sequence[int],
        cost_ns: int,
        flags: int = 0,
    ) -> tuple[int, list[int]]:
        """Register an op that ran; returns ``(op id, output tensor ids)``.

        ``out_alias[i]`` is ``-1`` for fresh storage or the index into ``inputs``
        whose storage output ``i`` shares; ``out_sizes[i]`` is the storage's
        bytes for a fresh output, the view's bytes for an alias.
        """
        if self.released or self.queued:
            self.flush_releases()
        n_in = len(inputs)
        n_out = len(out_sizes)
        if len(out_alias) != n_out:
            raise ValueError(f"out_alias has {len(out_alias)} entries for {n_out} outputs")
        b = self._buffers
        if n_in > b.capacity or n_out > b.capacity:
            b = self._grow(max(n_in, n_out))
        b.inputs[:n_in] = inputs
        b.sizes[:n_out] = out_sizes
        b.aliases[:n_out] = out_alias
        if type(name) is str:
            name = name.encode()
        op = self._call(self.handle, name, b.inputs, n_in, b.sizes, b.aliases, n_out, cost_ns, flags, b.outputs)
        if op < 0:
            raise _fail(f"memscale_dtr_call({name.decode()})")
        return op, b.outputs[:n_out]

    def mutate(
        self, name: bytes | str, inputs: Sequence[int], mutated: Sequence[int], cost_ns: int, flags: int = 0
    ) -> tuple[int, list[int]]:
        """Register an in-place op that wrote ``inputs[i]`` for each ``i`` in
        ``mutated``; returns ``(op id, new version ids)``."""
        if self.released or self.queued:
            self.flush_releases()
        n_in = len(inputs)
        n_mut = len(mutated)
        b = self._buffers
        if n_in > b.capacity:
            b = self._grow(n_in)
        b.inputs[:n_in] = inputs
        b.mutated[:n_mut] = mutated
        if type(name) is str:
            name = name.encode()
        op = self._mutate(self.handle, name, b.inputs, n_in, b.mutated, n_mut, cost_ns, flags, b.outputs)
        if op < 0:
            raise _fail(f"memscale_dtr_mutate({name.decode()})")
        return op, b.outputs[:n_mut]

    def access(self, t: int) -> None:
        """Tensor ``t`` was read (staleness clock)."""
        if self.released or self.queued:
            self.flush_releases()
        if self._access(self.handle, t) < 0:
            raise _fail(f"memscale_dtr_access({t})")

    def lock(self, t: int) -> None:
        """Tensor ``t`` must not be evicted until :meth:`unlock` (counted)."""
        if self.released or self.queued:
            self.flush_releases()
        if self._lock(self.handle, t) < 0:
            raise _fail(f"memscale_dtr_lock({t})")

    def unlock(self, t: int) -> None:
        """Undo one :meth:`lock` (may free a storage nothing references)."""
        if self.released or self.queued:
            self.flush_releases()
        if self._unlock(self.handle, t) < 0:
            raise _fail(f"memscale_dtr_unlock({t})")

    def pin(self, t: int) -> None:
        """Tensor ``t`` is never evicted."""
        if self.released or self.queued:
            self.flush_releases()
        if self._pin(self.handle, t) < 0:
            raise _fail(f"memscale_dtr_pin({t})")

    def release(self, t: int) -> None:
        """The program dropped its reference to ``t``: queued, told to the
        engine with the next call (a bad id fails that call)."""
        self.released.append(t)

    def flush_releases(self) -> None:
        """Tell the engine the queued ops and releases now (one crossing); what
        they free waits in the engine (``status.pending``)."""
        if self.queued:
            self.flush(0)
            return
        released = self.released
        if not released:
            return
        self.released = []
        n = len(released)
        if _FRAME_HEADER + n > self._frame_size:
            self._new_frame(_FRAME_HEADER + n)
        self._words[0 : _FRAME_HEADER + n] = array("q", [n, -1, 0, 0, 0, 0, *released])
        if self._cross(None) < 0:
            raise _fail(f"memscale_dtr_op({n} releases)")

    def _cross(self, name: bytes | None) -> int:
        """``memscale_dtr_op`` on the frame, through the extension when built."""
        if self._op_fast is not None:
            return self._op_fast(self.handle, name, self._frame_address)
        return int(self._op(self.handle, name, self._frame))

    def _new_frame(self, words: int) -> None:
        words = max(words, 1 + 2 * _FRAME_HAND_OUT + 64)
        self._frame = (_i64 * words)()
        self._frame_address = ctypes.addressof(self._frame)
        self._frame_size = words
        self._words = memoryview(self._frame).cast("B").cast("q")

    def op(
        self, name: bytes, inputs: list[int], out_sizes: list[int], out_alias: list[int], cost_ns: int, flags: int
    ) -> tuple[int, list[int], list[int]]:
        """Register an op that ran, with the queued releases before it, in one
        crossing (``memscale_dtr_op``); returns ``(op id, output ids, freed)``.

        Arguments as :meth:`call`'s. ``freed`` is ``[root, action, root,
        action, ...]``: storages the engine freed (as :meth:`evict` hands
        them out first), now the caller's to free; more may be pending
        (``status.pending``).
        """
        if self.queued:
            self.flush(0)
        released = self.released
        if released:
            self.released = []
        n_rel = len(released)
        n_in = len(inputs)
        n_out = len(out_sizes)
        words = _FRAME_HEADER + n_rel + n_in + 2 * n_out
        if words > self._frame_size:
            self._new_frame(words)
        w = self._words
        w[0:words] = array("q", [n_rel, n_in, n_out, cost_ns, flags, _FRAME_HAND_OUT, *released, *inputs, *out_sizes, *out_alias])
        fast = self._op_fast
        op = fast(self.handle, name, self._frame_address) if fast is not None else self._op(self.handle, name, self._frame)
        if op < 0:
            raise _fail(f"memscale_dtr_op({name.decode()})")
        k = w[n_out]
        if k:
            return op, w[0:n_out].tolist(), w[n_out + 1 : n_out + 1 + 2 * k].tolist()
        return op, w[0:n_out].tolist(), _NONE_FREED

    def queue(
        self, name: bytes, inputs: list[int], out_sizes: list[int], out_alias: list[int], cost_ns: int, flags: int,
        fresh_bytes: int,
    ) -> tuple[int, list[int]]:
        """Register an op that ran, later: queued with the releases before it,
        told to the engine by :meth:`flush` (or first thing in any other
        call), in one crossing for many ops (``memscale_dtr_ops``). Returns
        the ``(op id, output ids)`` the engine will give it: ids run in
        sequence from the status block's ``next_op`` / ``next_tensor``, and
        the engine checks each one. Arguments as :meth:`call`'s;
        ``fresh_bytes``: the bytes of its fresh outputs, counted in
        :attr:`queued_bytes` (usage the status block does not show yet).
        """
        name_id = self._name_ids.get(name)
        if name_id is None:
            name_id = self._name(self.handle, name)
            if name_id < 0:
                raise _fail(f"memscale_dtr_name({name.decode()})")
            self._name_ids[name] = name_id
        if not self.queued:
            status = self.status
            self._next_op = status.next_op
            self._next_tensor = status.next_tensor
        op = self._next_op
        first = self._next_tensor
        n_out = len(out_sizes)
        released = self.released
        if released:
            self.released = []
        self._records.extend(
            (name_id, len(released), len(inputs), n_out, cost_ns, flags, op, first, *released, *inputs, *out_sizes, *out_alias)
        )
        self._next_op = op + 1
        self._next_tensor = first + n_out
        self.queued += 1
        self.queued_bytes += fresh_bytes
        return op, list(range(first, first + n_out))

    def flush(self, hand_out: int = _FRAME_HAND_OUT) -> list[int]:
        """Tell the engine the queued ops (:meth:`queue`) and releases in one
        crossing; returns up to ``hand_out`` storages it freed as ``[root,
        action, ...]`` (as :meth:`op`), now the caller's to free."""
        records = self._records
        n = self.queued
        released = self.released
        if released:
            self.released = []
            records.extend((0, len(released), -1, 0, 0, 0, 0, 0, *released))
            n += 1
        if not n:
            return _NONE_FREED
        self._records = array("q")
        self.queued = 0
        self.queued_bytes = 0
        words = _BATCH_HEADER + len(records)
        frame = self._batch_frame
        if len(frame) < max(words, 1 + 2 * hand_out):
            frame = self._batch_frame = (_i64 * max(2 * words, 1 + 2 * _FRAME_HAND_OUT, 1024))()
        w = memoryview(frame).cast("B").cast("q")
        w[0] = n
        w[1] = hand_out
        w[_BATCH_HEADER:words] = records
        address = ctypes.addressof(frame)
        fast = self._ops_fast
        done = fast(self.handle, address) if fast is not None else self._ops(self.handle, address)
        if done < 0:
            raise _fail(f"memscale_dtr_ops({n} records)")
        k = w[0]
        return w[1 : 1 + 2 * k].tolist() if k else _NONE_FREED

    # Decisions ------------------------------------------------------------

    def evict(self, extra: int = 0, why: str = "") -> Iterator[tuple[int, int]]:
        """The budget loop: yields ``(storage-root id, action)`` pairs to free.

        First the storages the engine freed since the last call, then victims,
        until usage + ``extra`` (bytes about to be allocated) fits the budget.
        Victims come in batches, one ``memscale_dtr_evict`` call each; a batch
        is yielded whole before the next call, so a caller that frees each
        victim as it comes has freed a batch before the engine looks at usage
        again (what ``"usage": "allocator"`` needs). Exhaust the iterator.

        Raises:
            NoRoomError: usage + ``extra`` is over the budget and nothing
                (more) can be evicted.
            MemscaleError: ``extra`` alone is larger than the budget, or
                another failure; ``why`` is added to the engine's message. Victims
                yielded before the error are gone in the engine's count.
        """
        if self.released or self.queued:
            self.flush_releases()
        ids = self._victim_ids
        actions = self._victim_actions
        cap = self.EVICT_BATCH
        while True:
            n = self._evict(self.handle, extra, ids, actions, cap)
            if n <= 0:
                if n < 0:
                    error = _fail(f"memscale_dtr_evict{' ' + why if why else ''}")
                    if _NOTHING_EVICTABLE in str(error):
                        raise NoRoomError(str(error))
                    raise error
                return
            for j in range(n):
                yield ids[j], actions[j]
            # A short batch is not the end when the engine ran out of
            # candidates after taking some: the next call returns 0 or fails.

    def reclaim(self, need: int) -> Iterator[tuple[int, int]]:
        """Victims to free for an allocation that failed: yields ``(storage-root
        id, action)`` pairs, whatever the budget, until their bytes reach
        ``need`` or nothing more is evictable (not an error: the engine keeps
        why, and the allocator's out-of-memory message says it). Exhaust the
        iterator; like :meth:`evict`, each batch is yielded before the next call.
        """
        if self.released or self.queued:
            self.flush_releases()
        ids = self._victim_ids
        actions = self._victim_actions
        cap = self.EVICT_BATCH
        while True:
            n = self._reclaim(self.handle, need, ids, actions, cap)
            if n < 0:
                raise _fail(f"memscale_dtr_reclaim({need})")
            for j in range(n):
                yield ids[j], actions[j]
            if n < cap:
                return

    def plan(self, t: int) -> list[tuple[int, int]]:
        """Steps that make ``t`` resident: ``(kind, id)``, ancestors first.

        Run them in order. The engine holds (locks) the inputs of the first
        re-run step not reported yet, and only those: reporting it with
        :meth:`rematerialized` moves the hold to the next re-run step. An input
        of a later step may therefore be evicted meanwhile; rebuild it with a
        plan of its own before running that step.
        """
        if self.released or self.queued:
            self.flush_releases()
        while True:
            cap = len(self._plan_kinds)
            n = self._plan(self.handle, t, self._plan_kinds, self._plan_ids, cap)
            if n < 0:
                raise _fail(f"memscale_dtr_plan({t})")
            if n <= cap:
                return list(zip(self._plan_kinds[:n], self._plan_ids[:n]))
            # As snprintf: n steps do not fit; nothing was committed.
            self._plan_kinds = (_i32 * n)()
            self._plan_ids = (_i64 * n)()

    def abandon_plans(self) -> int:
        """Forget every plan :meth:`plan` committed and not run to the end:
        their locks and holds go (nothing is evicted or rebuilt). Returns
        how many there were."""
        n = int(self._abandon_plans(self.handle))
        if n < 0:
            raise _fail("memscale_dtr_abandon_plans")
        return n

    def park(self, t: int) -> bool:
        """Park the storage of ``t`` in host memory although it may be locked
        (``memscale_dtr_park``): ``True`` when the engine took it out, and the
        caller then copies it to host memory. ``False``: parking is off, or the
        storage is not resident, pinned, or over the offload limit."""
        if self.released or self.queued:
            self.flush_releases()
        n = int(self._park(self.handle, t))
        if n < 0:
            raise _fail(f"memscale_dtr_park({t})")
        return n == 1

    def rematerialized(self, op: int, cost_ns: int) -> None:
        """Op ``op`` was re-run; its outputs are resident, except those the program
        released for good, whose re-made copies the next :meth:`evict` hands out
        (as drops) to be freed."""
        if self.released or self.queued:
            self.flush_releases()
        if self._rematerialized(self.handle, op, cost_ns) < 0:
            raise _fail(f"memscale_dtr_rematerialized({op})")

    def swapped_in(self, t: int) -> None:
        """Tensor ``t`` was copied back from host memory."""
        if self.released or self.queued:
            self.flush_releases()
        if self._swapped_in(self.handle, t) < 0:
            raise _fail(f"memscale_dtr_swapped_in({t})")

    def stats(self) -> dict[str, Any]:
        """The engine's counters and configuration (``memscale_dtr_stats_json``)."""
        if self.released or self.queued:
            self.flush_releases()
        return _json_object(self._stats_json(self.handle), "memscale_dtr_stats_json")

    def tune(self) -> dict[str, Any]:
        """The engine's choice of configuration for the steps to come
        (``memscale_dtr_tune``).

        Replays the program this engine recorded (created with ``"heuristic":
        "auto"`` or ``"record": true``) under its budget with every candidate
        configuration; runs for as long as the replays take, so call it when
        the step is over. Keys: ``config`` (the keys to merge into the next
        engine's configuration), ``choice``, ``feasible``, ``overhead``,
        ``default_overhead``, ``budget``, ``instructions``, ``wall_ns``,
        ``trials``.

        Raises:
            MemscaleError: the engine does not record, has no budget, or its
                recording could not be replayed (the message says which).
        """
        if self.released or self.queued:
            self.flush_releases()
        return _json_object(self._tune(self.handle), "memscale_dtr_tune")


_NONE_FREED: Final[list[int]] = []
