"""The per-step session's state: one entry's engine, tables, budget, evictions, releases.

:class:`SessionState` is the bottom of a session (:class:`~.session.Session`
is built on it in layers, each a module): it owns the engine instance of the
entry and everything Python keeps next to it - the storage groups, the
recorded ops, the externals' tables, the live wrappers, and the releases
queued by garbage collection - and carries out the engine's decisions
(:meth:`SessionState.evict`: drop or swap the storages the engine hands out).
:mod:`.rebuild` works on it; :mod:`.externals` adds the externals,
:mod:`.session` the op path and the exit.

Synchronizing with the engine: the engine frees storages on its own (a last
reference released, an unlock, a re-run's throw-away copies) and says how many
wait to be handed out in its status block. Before any cell is read,
:meth:`SessionState.sync` fetches them when there are any (without a budget,
in batches of :data:`UNBUDGETED_DRAIN_BATCH`: Python has dropped those
storages' data itself already, see :meth:`SessionState.release_cell`).

Holds no policy: the engine decides what is evicted, when, and how much room
an op needs.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Final, Protocol

import torch

from .._native import lib as _lib
from .._native.engine import ACTION_SWAP, Engine, NoRoomError
from ..errors import ConfigError, MemscaleError
from . import reclaim
from .cells import Cell, HeldCells, RecordedOp, StorageGroup, WrapperRef
from .device import CudaTimer, copy_to_host, sync_count
from .schema import OpInfo
from .verify import Verifier, Where

log = logging.getLogger("memscale")

#: Without a budget, freed storages are fetched from the engine once this many
#: are waiting (their data is dropped at release already).
UNBUDGETED_DRAIN_BATCH: Final[int] = 256

#: Ops registered per engine call by default (``MEMSCALE_OP_BATCH``): a
#: pure op's registration is queued (:meth:`Engine.queue`, the ids predicted)
#: and the queue crosses into the engine once this many ops wait, or first
#: thing in any other engine call - a plan, a lock, the budget loop - so the
#: engine sees every event in order before it decides anything. A batch
#: costs one crossing instead of one per op; what it delays is only the
#: engine's frees of released storages (without a budget Python drops their
#: data at release anyway; under a budget the room check counts the queued
#: ops' outputs and never the releases, so it errs towards asking the
#: engine, which takes the queue first). 1: one crossing per op.
OP_BATCH: Final[int] = 32
OP_BATCH_ENV: Final[str] = "MEMSCALE_OP_BATCH"
#: The largest batch the library accepts (internal/config).
OP_BATCH_MAX: Final[int] = 65536


def op_batch_from_env() -> int:
    """:data:`OP_BATCH`, or ``MEMSCALE_OP_BATCH`` when set (an integer >= 1).

    Raises:
        ConfigError: the variable is set to anything else.
    """
    raw = os.environ.get(OP_BATCH_ENV, "").strip()
    if not raw:
        return OP_BATCH
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= OP_BATCH_MAX:
        raise ConfigError(
            f"{OP_BATCH_ENV}={raw!r}: expected an integer from 1 to {OP_BATCH_MAX} (ops registered per engine "
            "call; 1: one call per op)"
        )
    return n


class RegionSettings(Protocol):
    """What an entry reads of its region (:class:`~.region.DTRRegion`, which
    sits above every session module)."""

    recompute: bool
    op_infos: dict[Any, OpInfo]
    verify_where: Where | None


class SessionState:
    """State of one entry of a region: engine instance, cells, recorded ops;
    its budget, evictions and releases (:class:`~.session.Session` adds the
    rest: :class:`~.externals.SessionExternals` first)."""

    def __init__(self, region: RegionSettings, config: dict[str, Any], sink: Any) -> None:
        self.region = region
        self.config = config
        self.engine = Engine(config)
        self.status = self.engine.status
        self.sink = sink
        self.closed = False
        #: Whether ops are recorded (only needed to re-run them).
        self.recording: bool = region.recompute
        self.infos: dict[Any, OpInfo] = region.op_infos
        self.ops: dict[int, RecordedOp] = {}
        self.groups: dict[int, StorageGroup] = {}
        self.externals: dict[int, WrapperRef] = {}  # id(plain tensor) -> its reference
        self.external_roots: dict[int, Cell] = {}  # storage data_ptr -> external root cell
        self.externals_registered = 0  # under a budget: tells dispatch to re-check residency
        self.leaves: list[weakref.ref[torch.Tensor]] = []  # externals that are autograd leaves
        self.grad_hooks: list[Any] = []
        #: ids of the autograd nodes and leaves :meth:`_note_graph` walked.
        self.graph_nodes: set[int] = set()
        self.pinned_grads: set[Cell] = set()
        #: Roots of externals whose storage is freed behind the region's back
        #: (:mod:`.volatile`): ops reading them are not recomputable.
        self.volatile_roots: set[int] = set()
        self.live: dict[int, WrapperRef] = {}  # id(reference) -> reference of a live wrapper
        self.released: list[Cell] = []  # queued by weakref callbacks
        self.cuda_timer: CudaTimer | None = None
        self.tuning: dict[str, Any] | None = None  # the engine's report, when it tuned
        self.tune_error: str | None = None
        self.usage_exact = config.get("usage") == "engine"
        #: With usage "allocator": the allocator's allocated bytes, published
        #: by every malloc and free (``memscale_allocated_address``), read
        #: per op without a call; ``None`` with usage "engine".
        self.usage_live: ctypes.c_int64 | None = None
        if config.get("usage") == "allocator":
            address = _lib.lib().memscale_allocated_address(int(config.get("device") or 0))
            if address:
                self.usage_live = ctypes.c_int64.from_address(address)
        #: Whether a per-op check can tell that usage is within the budget
        #: without asking the engine: it counts the usage itself, or the
        #: allocator publishes it.
        self.usage_known = self.usage_exact or self.usage_live is not None
        #: Bytes the op under way allocated that the engine has not heard of
        #: yet (copies on write of pinned storages, registered after the op
        #: ran): in :meth:`usage_now` and in every room asked meanwhile, so
        #: the op's results (or a second copy) do not take their room again.
        self.unregistered = 0
        #: Inputs of the op whose kernel is running (locked if the allocator
        #: asks this session to evict meanwhile, see :mod:`.reclaim`).
        self.running: list[Cell] = []
        #: Bytes of the outputs of re-runs so far (the room a rebuild needed,
        #: at most; as a difference).
        self.rebuilt_bytes = 0
        #: Rebuilds started over after nested plans ran out of room
        #: (:data:`.rebuild.NESTED_RESTARTS`).
        self.nested_restarts = 0
        #: The cells whose nested rebuilds just failed for room, innermost
        #: first (appended on the way out, read by the outermost rebuild).
        self.room_failed_for: list[Cell] = []
        #: The cells each open level of a rebuild reads, outermost first:
        #: the running op's inputs (:func:`.rebuild.make_resident`), then
        #: the inputs of each plan step being re-run (:func:`.rebuild.run_step`).
        #: When the innermost level finds no room, the storages the outer
        #: levels hold are parked in host memory (:meth:`make_room`).
        self.levels: list[list[Cell]] = []
        #: Whether the engine parks (its configuration's ``park``).
        self.parking = bool(config.get("park"))
        #: The device whose allocation failures this session evicts for.
        self.reclaims_for = reclaim.device_of(config)
        self.budgeted = False
        self.drain_at = UNBUDGETED_DRAIN_BATCH
        #: Fingerprints checking every rebuild (:mod:`.verify`), when on.
        self.verifier: Verifier | None = Verifier(region.verify_where) if region.verify_where is not None else None
        #: The stress setting: the budget loop runs after every op.
        self.stress = bool(config.get("stress"))
        #: Ops registered per engine call (:data:`OP_BATCH`); the stress
        #: setting runs the budget loop after every op, so it takes each op
        #: at once.
        self.op_batch: int = 1 if self.stress else op_batch_from_env()
        self._set_budgeted(int(config.get("budget") or 0))
        self.queue_release = self._queue_release  # bound once: every wrapper's callback
        #: Held by the thread inside the session (an op, a rebuild of a read,
        #: the exit); the allocator's reclaimer, which an allocation on any
        #: thread may call, only acquires it without waiting (:meth:`reclaim`).
        self.lock = threading.RLock()
        self.reclaims_refused = 0
        #: :func:`.device.sync_count` when the entry began, and when it closed.
        self.sync_mark = sync_count()
        self._sync_end: int | None = None
        if self.reclaims_for is not None:
            reclaim.register(self, self.reclaims_for)

    # ------------------------------------------------------------ budget

    def _set_budgeted(self, budget: int) -> None:
        self.budgeted = budget > 0 or self.stress
        self.drain_at = 1 if self.budgeted else UNBUDGETED_DRAIN_BATCH

    def set_budget(self, budget: int) -> None:
        """Change the running entry's budget (bytes, 0 = unlimited)."""
        self.engine.set_budget(budget)
        self._set_budgeted(budget)

    def make_room(self, extra: int, what: bytes) -> None:
        """Evict until ``extra`` more bytes fit the budget (before allocating them).

        Inside a nested rebuild, when nothing is evictable, the storages the
        outer levels hold are parked first (:meth:`park_outer_levels`).
        """
        if self.usage_known and self.usage_now() + extra <= self.status.budget:
            return
        why = f"making room for {extra} bytes of {what.decode()}"
        try:
            self.evict(extra, why)
        except NoRoomError:
            if not self.park_outer_levels(extra):
                raise
            self.evict(extra, why)

    def park_outer_levels(self, extra: int) -> bool:
        """Park in host memory what the outer levels of a rebuild hold, until
        ``extra`` more bytes fit; returns whether anything was parked.

        The innermost level (the cells the running step reads) keeps its
        storages; the outer levels do not read theirs before it is done and
        re-check residency when they go on (a parked storage comes back as a
        swap-in step of a plan). Outermost first: it reads its storages last.
        """
        if not self.parking or len(self.levels) < 2:
            return False
        seen = {c.root for c in self.levels[-1]}  # the innermost level's, then each one tried
        parked = False
        for level in self.levels[:-1]:
            for cell in level:
                root = cell.root
                if root in seen or cell.tensor is None:
                    continue
                seen.add(root)
                group = self.groups.get(root)
                if group is None or not self.engine.park(root):
                    continue
                copy_to_host(group)
                parked = True
                if self.usage_known and self.usage_now() + extra <= self.status.budget:
                    return True
        return parked

    def usage_now(self) -> int:
        """The usage the budget is compared with, as far as it is known
        without an engine call (see :attr:`usage_known`)."""
        live = self.usage_live
        if live is not None:
            return live.value
        return self.status.usage + self.engine.queued_bytes + self.unregistered

    # --------------------------------------------------------- evictions

    def sync(self) -> None:
        """Tell the engine the queued releases and carry out its pending
        frees, if any are waiting (before anything asks the engine for a plan)."""
        if self.engine.released or self.engine.queued:
            self.engine.flush_releases()
        if self.status.pending >= self.drain_at:
            self.evict()

    def after_op(self) -> None:
        """After an op registered its outputs: keep usage within the budget."""
        status = self.status
        if status.pending >= self.drain_at or (
            self.budgeted and (not self.usage_known or self.usage_now() > status.budget)
        ):
            self.evict()

    def evict(self, extra: int = 0, why: str = "") -> None:
        """Run the engine's budget loop and carry out its decisions: room for
        ``extra`` bytes and for what the op under way allocated that the engine
        has not heard of yet (:attr:`unregistered`)."""
        self._carry_out(self.engine.evict(extra + self.unregistered, why))

    def drop_freed(self, freed: list[int]) -> None:
        """Free the storages an op's registration handed out
        (``[root, action, ...]``, see :meth:`Engine.op`)."""
        groups = self.groups
        for i in range(0, len(freed), 2):
            group = groups.get(freed[i])
            if group is None:
                raise MemscaleError(f"memscale.dtr: the engine freed unknown storage {freed[i]}")
            if freed[i + 1] == ACTION_SWAP:
                copy_to_host(group)
            else:
                group.drop_data()

    def _carry_out(self, victims: Iterator[tuple[int, int]]) -> int:
        """Drop (or swap out) each victim the engine hands out; returns their bytes."""
        groups = self.groups
        freed = 0
        for root, action in victims:
            group = groups.get(root)
            if group is None:
                raise MemscaleError(f"memscale.dtr: the engine evicted unknown storage {root}")
            if action == ACTION_SWAP:
                copy_to_host(group)
            else:
                group.drop_data()
            freed += group.nbytes
        return freed

    def reclaim(self, need: int) -> int:
        """An allocation failed for ``need`` bytes: evict about that much,
        whatever the budget; returns the bytes of the storages freed.

        Only while no other thread is inside this session (:attr:`lock`): an
        allocation on another thread that fails while this session runs an
        op, rebuilds or closes gets 0 (could not help) instead of changing
        the session's state under it. The thread running the op - whose
        kernel's allocation is what usually fails - holds the lock already
        and reclaims.
        """
        if self.closed or need <= 0:
            return 0
        if not self.lock.acquire(blocking=False):
            reclaim.refused(self, need)
            return 0
        try:
            with HeldCells(self.engine) as held:
                held.lock_all([c for c in self.running if c.tensor is not None and c.session is self])
                return self._carry_out(self.engine.reclaim(need))
        finally:
            self.lock.release()

    # ---------------------------------------------------------- releases

    def _queue_release(self, ref: WrapperRef) -> None:
        # Weakref callback: may run at any point (any thread); only queue.
        self.live.pop(id(ref), None)
        cell = ref.cell
        if cell is not None and not self.closed:
            self.released.append(cell)

    def flush(self) -> None:
        """Release the cells whose wrappers died since the last op.

        The engine is told with its next call (the next op's registration,
        or :meth:`sync` before a plan): it frees nothing before then, so no
        cell it would free is read meanwhile.
        """
        while self.released:
            batch, self.released = self.released, []
            for cell in batch:
                if not cell.released and cell.session is self:
                    self.release_cell(cell)
                    if self.sink is not None:
                        self.sink.release(cell)

    def release_cell(self, cell: Cell) -> None:
        """Tell the engine no wrapper names ``cell`` any more."""
        cell.released = True
        cell.wrapper_ref = None
        self.engine.release(cell.tensor_id)
        group = self.groups.get(cell.root)
        if group is None:
            return
        group.live_refs -= 1
        if not self.budgeted and group.live_refs <= 0:
            # Without a budget the engine frees a storage as soon as its last
            # reference goes; drop its data now and let sync() fetch the
            # engine's list of such storages in batches.
            group.drop_data()
