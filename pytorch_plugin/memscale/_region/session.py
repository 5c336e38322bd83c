"""The per-step session: one entry of a region, its engine and its bookkeeping.

A :class:`Session` lives from a region's ``__enter__`` to its ``__exit__``. It
owns the engine instance of the entry and everything Python keeps next to it:
the storage groups, the recorded ops, the externals (plain tensors the region
registered), the live wrappers, and the releases queued by garbage collection.
It carries out the engine's decisions (:meth:`Session.evict`: drop or swap the
storages the engine hands out) and is where the other modules meet:

* :mod:`.dispatch` runs new ops (``Session.dispatch``);
* :mod:`.rebuild` makes evicted cells resident again;
* :meth:`Session.close` makes what escapes resident, detaches it and destroys
  the engine.

Synchronizing with the engine: the engine frees storages on its own (a last
reference released, an unlock, a re-run's throw-away copies) and says how many
wait to be handed out in its status block. Before any cell is read,
:meth:`Session.sync` fetches them when there are any (without a budget, in
batches of :data:`UNBUDGETED_DRAIN_BATCH`: Python has dropped those storages'
data itself already, see :meth:`Session._release`).

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
from typing import TYPE_CHECKING, Any, Final

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .._native import lib as _lib
from .._native.engine import ACTION_SWAP, NO_RECOMPUTE, Engine, NoRoomError
from ..errors import ConfigError, MemscaleError
from . import rebuild, reclaim, volatile
from .cells import Cell, HeldCells, RecordedOp, StorageGroup, WrapperRef
from .device import CudaTimer, copy_to_host, sync_count
from .dispatch import dispatch
from .schema import OpInfo
from .tensor import DTRTensor, hand_back, plain_of
from .verify import Verifier

if TYPE_CHECKING:
    from .region import DTRRegion

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


class Session:
    """State of one entry of a region: engine instance, cells, recorded ops."""

    def __init__(self, region: DTRRegion, config: dict[str, Any], sink: Any) -> None:
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
        self.reclaims_for: int | None = config.get("device") if config.get("usage") == "allocator" else None
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
        return self.status.usage + self.engine.queued_bytes if live is None else live.value

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
        """Run the engine's budget loop and carry out its decisions."""
        self._carry_out(self.engine.evict(extra, why))

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
            self.reclaims_refused += 1
            if self.reclaims_refused == 1:
                log.warning(
                    "memscale: an allocation of %d more bytes failed on another thread while this DTR region "
                    "was busy on its own; the region did not evict for it (it cannot change its state under "
                    "its own thread). Allocate from the region's thread, or set a threshold that leaves room",
                    need,
                )
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

    # --------------------------------------------------------- externals

    def cell_of(self, x: Any) -> Cell | None:
        """The cell of an op argument; ``None`` for a non-tensor (a wrapped
        scalar) and for a tensor without storage (an efficient zero tensor,
        as ``sgn``'s backward makes): those take part in ops as constants."""
        if type(x) is DTRTensor:
            cell = x._c
            if cell.session is self:
                return cell
            if x.grad_fn is not None:  # a graph an earlier entry built
                self._note_graph(x.grad_fn)
            return self.extern(plain_of(x))
        if isinstance(x, torch.Tensor):
            return self.extern(x)
        return None

    def _note_graph(self, root: Any) -> None:
        """Note the leaves of an autograd graph built outside this entry
        (reached from ``root``, a node of it): a backward through it
        accumulates their gradients here, though no op of the entry may read
        them (a GAN's generator, trained through the discriminator), and
        :meth:`_plain_gradients` must make those plain too. Each node is
        walked once per entry."""
        seen = self.graph_nodes
        stack = [root]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            leaf = getattr(node, "variable", None)
            if type(leaf) is torch.nn.Parameter or (isinstance(leaf, torch.Tensor) and leaf.requires_grad):
                if id(leaf) not in seen:
                    seen.add(id(leaf))
                    self.leaves.append(weakref.ref(leaf))
                    self.grad_hooks.append(leaf.register_post_accumulate_grad_hook(self._pin_gradient))
                continue
            stack.extend(next_node for next_node, _ in node.next_functions)

    def extern(self, t: torch.Tensor) -> Cell | None:
        """The cell of a plain tensor (registered pinned on first sight);
        ``None`` for a tensor without storage.

        The cell holds an alias of ``t`` (same storage), not ``t`` itself, and
        a weak reference to ``t``: when the program drops ``t`` the engine is
        told (a release), so a temporary plain tensor used in the region is
        freed like any other once nothing needs it.
        """
        ref = self.externals.get(id(t))
        if ref is not None and ref() is t and ref.cell is not None:
            return ref.cell
        if type(t) is DTRTensor:  # a wrapper detached from an earlier entry
            return self.extern(plain_of(t))
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
        except (RuntimeError, NotImplementedError) as exc:
            if t.layout == torch.strided and t._is_zerotensor():
                return None  # type: ignore[return-value]  # no storage: a constant
            raise MemscaleError(
                f"memscale.dtr: a {t.layout} tensor was passed to an op; only strided (dense) "
                f"tensors can be used in a DTR region - convert it with .to_dense() first ({exc})"
            ) from exc
        root = self.external_roots.get(ptr) if ptr else None
        if t.grad_fn is not None:  # a graph built outside the region
            self._note_graph(t.grad_fn)
        if root is not None and root.tensor is not None and not root.released:
            cell = self._register_external_alias(t, root)
        else:
            cell = self._register_external(t, storage.nbytes(), ptr)
        ref = WrapperRef(t, self.queue_release)
        ref.cell = cell
        cell.wrapper_ref = ref
        self.externals[id(t)] = ref
        if t.requires_grad and t.is_leaf:
            self.leaves.append(weakref.ref(t))
            self.grad_hooks.append(t.register_post_accumulate_grad_hook(self._pin_gradient))
        return cell

    def _register_external(self, t: torch.Tensor, nbytes: int, ptr: int) -> Cell:
        if self.budgeted and nbytes:
            # Room first, so registering never takes usage over the budget
            # (dispatch then re-checks the residency of the op's other inputs).
            self.make_room(nbytes, b"an external tensor")
            self.externals_registered += 1
        tensor_id = self.engine.tensor(nbytes, pinned=True)
        cell = Cell(tensor_id, t.detach(), tensor_id, -1, self, pinned=True)
        if volatile.is_volatile(t):
            self.volatile_roots.add(tensor_id)
        self.groups[tensor_id] = StorageGroup(cell, nbytes)
        if ptr:
            self.external_roots[ptr] = cell
        if self.sink is not None:
            self.sink.external(cell, nbytes)
        return cell

    def _register_external_alias(self, t: torch.Tensor, root: Cell) -> Cell:
        """A second external on a registered external's storage: an alias of it."""
        _, (tensor_id,) = self.engine.call(b"alias", [root.tensor_id], [t.nbytes], [0], 0, NO_RECOMPUTE)
        cell = Cell(tensor_id, t.detach(), root.root, -1, self, pinned=True)
        self.groups[root.root].add(cell)
        if self.sink is not None:
            self.sink.call(b"alias", [root], [cell], [t.nbytes], [0], 0)
        return cell

    def repoint(self, old: Cell, new: Cell) -> None:
        """Make whatever named ``old`` (a wrapper or an external) name ``new``."""
        ref = old.wrapper_ref
        if ref is not None:
            named = ref()
            if type(named) is DTRTensor:
                named._c = new
            ref.cell = new
            new.wrapper_ref = ref
            old.wrapper_ref = None
        if old.pinned and old.tensor is not None:
            ptr = old.tensor.untyped_storage().data_ptr()
            if ptr and self.external_roots.get(ptr) is old:
                self.external_roots[ptr] = new

    def _pin_gradient(self, param: torch.Tensor) -> None:
        """A parameter's ``.grad`` was accumulated: pin it for this entry.

        Gradients outlive the step and are read by the optimizer; evicting one
        would mean re-running the backward pass that produced it.
        """
        grad = param.grad
        if type(grad) is not DTRTensor or self.closed:
            return
        cell = grad._c
        if cell.session is not self or cell in self.pinned_grads:
            return
        if cell.tensor is None:
            with self.lock, _disable_current_modes(), HeldCells(self.engine) as held:
                rebuild.materialize(self, cell)
                held.adopt(cell)
                self.engine.pin(cell.tensor_id)
        else:
            self.engine.pin(cell.tensor_id)
        self.pinned_grads.add(cell)

    # -------------------------------------------------------- operations

    def dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """Run one ATen op inside this entry (see :mod:`.dispatch`)."""
        return dispatch(self, func, args, kwargs)

    def read(self, cell: Cell) -> torch.Tensor | None:
        """``cell``'s tensor, rebuilt if it was evicted (user code reading a wrapper)."""
        with self.lock, HeldCells(self.engine) as held:
            rebuild.materialize(self, cell)
            held.adopt(cell)
        self.sync()
        return cell.tensor

    # -------------------------------------------------------------- close

    def close(self, ok: bool) -> dict[str, Any]:
        """Make what escapes resident, detach it, destroy the engine instance.

        Returns the engine's final stats (empty when they could not be read).
        """
        with self.lock:
            return self._close(ok)

    def _close(self, ok: bool) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        try:
            self.flush()
            escaping = [ref.cell for ref in list(self.live.values()) if ref.cell is not None and ref() is not None]
            if ok:
                # Everything that leaves must be resident, within the budget:
                # the engine's errors now name what leaves the step.
                self.engine.finish()
                try:
                    self._room_to_leave(escaping)
                except NoRoomError as exc:
                    # The step fails at its end: nothing is handed back, and
                    # the error carries the step's stats (its minimum budget
                    # is the one the error names), which the region's exit
                    # does not get to record.
                    ok = False
                    self._plain_gradients()
                    exc.stats = self.engine.stats()  # type: ignore[attr-defined]
                    raise
                rebuild.make_all_resident(self, escaping)
            self._plain_gradients()
            stats = self.engine.stats()
            if ok and stats.get("auto"):
                self._tune()
        finally:
            self._detach_everything(ok)
        return stats

    def _room_to_leave(self, escaping: list[Cell]) -> None:
        """Under a budget: room for every escaping storage at once, before
        any is rebuilt - the resident ones locked, the others' bytes
        requested - so a budget below what leaves the step fails here, with
        that bound (the step's minimum budget), and never goes over."""
        if not self.budgeted or self.stress:
            return
        seen: set[int] = set()
        missing = 0
        with HeldCells(self.engine) as held:
            for cell in escaping:
                group = self.groups.get(cell.root)
                if group is None or cell.root in seen:
                    continue
                seen.add(cell.root)
                resident = [c for c in group.cells if c.tensor is not None]
                if not resident:
                    missing += group.nbytes
                    continue
                lockable = next((c for c in resident if not c.released and c.session is self), None)
                if lockable is not None:
                    held.lock(lockable)
            if missing:
                self.make_room(missing, b"what leaves the step")

    def _plain_gradients(self) -> None:
        """``.grad`` of the parameters seen in the entry: plain tensors again."""
        with torch.no_grad(), _disable_current_modes():
            for ref in self.leaves:
                param = ref()
                if param is not None and type(param.grad) is DTRTensor:
                    param.grad = param.grad._c.tensor

    def _tune(self) -> None:
        """Have the engine choose the configuration of later entries
        (``memscale_dtr_tune``); a failure is kept, not raised: the step
        itself succeeded."""
        try:
            self.tuning = self.engine.tune()
        except MemscaleError as exc:
            self.tune_error = str(exc)

    def synchronizations(self) -> int:
        """How many times the entry's code waited for the device."""
        end = self._sync_end if self._sync_end is not None else sync_count()
        return end - self.sync_mark

    def _detach_everything(self, ok: bool = False) -> None:
        self._sync_end = sync_count()
        self.closed = True
        escaping: set[Cell] = set()
        handed = self._detach_wrappers(escaping, ok)
        # A cell and the weak reference that names it refer to each other: a
        # cycle the collector would free only on its own schedule, holding the
        # cell's tensor until then (a GPT-2 step touched ~50 MiB of fresh
        # memory per step that way). Nothing reads a cell no live wrapper
        # names after the exit: drop its data and the cycle now.
        for group in self.groups.values():
            for cell in group.cells:
                if cell not in escaping:
                    cell.wrapper_ref = None
                    cell.tensor = None
                    cell.session = None
        for hook in self.grad_hooks:
            hook.remove()
        self.grad_hooks.clear()
        self.pinned_grads.clear()
        for ref in self.externals.values():
            cell = ref.cell
            if cell is not None:
                cell.session = None
                cell.tensor = None
            ref.cell = None
        for container in (self.ops, self.groups, self.externals, self.external_roots):
            container.clear()
        self.leaves.clear()
        self.graph_nodes.clear()
        self.released.clear()
        if self.reclaims_for is not None:
            reclaim.unregister(self, self.reclaims_for)
        self.engine.close()
        # A view's wrapper references its base's (autograd's view base): the
        # base is handed back once its views were, so go round until a round
        # hands back nothing.
        while handed:
            left = [(w, t) for w, t in handed if not hand_back(w, t)]
            if len(left) == len(handed):
                break
            handed = left

    def _detach_wrappers(self, escaping: set[Cell], ok: bool) -> list[tuple[DTRTensor, torch.Tensor]]:
        """Detach every live wrapper from the entry (its cell into ``escaping``);
        returns those to hand back as plain tensors (:func:`.tensor.hand_back`:
        the entry succeeded, the data is resident, nothing needs the wrapper's
        autograd history), their weak references already dropped."""
        handed: list[tuple[DTRTensor, torch.Tensor]] = []
        for ref in list(self.live.values()):
            cell = ref.cell
            if cell is not None:
                cell.session = None
                cell.tensor_id = -1
                escaping.add(cell)
                if ok and cell.tensor is not None:
                    wrapper = ref()
                    if wrapper is not None and not wrapper.requires_grad:
                        handed.append((wrapper, cell.tensor))
                        cell.wrapper_ref = None
            ref.cell = None
        self.live.clear()
        return handed

