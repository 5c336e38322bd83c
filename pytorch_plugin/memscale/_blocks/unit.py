"""One call of a model block: what it saved for backward, and how to make it again.

A :class:`Unit` is created when a tracked block starts a forward pass with
gradients enabled. While the block runs, autograd hands every tensor it saves
for backward to :meth:`Unit.pack` (``torch.autograd.graph.saved_tensors_hooks``):

* a tensor on a storage the block did not make - its inputs, parameters and
  buffers (the *entry* storages) - is returned as it is: autograd keeps it, as
  without memscale;
* any other tensor (an activation made inside the block) is kept by the unit,
  and autograd gets a :class:`Slot` naming it.

The unit's kept tensors are what the engine may evict: dropping them frees the
block's activations, and :meth:`Unit.recompute` makes them again by running the
block once more on the same inputs, with the random-number state, autocast state
and mutated buffers of the first run, capturing what it saves in the same order
(checked against the first run's shapes, dtypes and strides). The recompute
stops as soon as it has saved as many tensors as the first run did (PyTorch's
checkpoint does the same, ``set_checkpoint_early_stop``): what the block
computes after its last saved tensor - in a transformer block the MLP's output
projection, a third of its linear layers' work - is never needed. A slot unpacked
while its unit is evicted asks the unit's owner (:class:`~memscale._blocks.tracker.BlockDTR`)
to rebuild it first.

What makes a recompute impossible raises a :class:`~memscale.errors.MemscaleError`
naming the block instead of computing something else: an input changed in place
after the block ran, or a block that saves other tensors the second time.

Holds no policy: which unit to evict is the engine's decision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.utils._pytree import tree_leaves

from ..errors import MemscaleError

if TYPE_CHECKING:
    from .device import DeviceShare

_Tensor = torch.Tensor
_AUTOCAST_DEVICES = ("cpu", "cuda")


class BlockOwner(Protocol):
    """What a unit asks of the tracker that owns it
    (:class:`~memscale._blocks.tracker.BlockDTR`, which sits above this module)."""

    device_share: DeviceShare | None

    def rebuild(self, unit: Unit) -> None: ...

    def recomputing(self, unit: Unit | None, hooks: Any) -> None: ...

    def unit_done(self, unit: Unit) -> None: ...


#: ``(size, dtype, stride, storage offset)`` of a saved tensor.
Meta = tuple[torch.Size, torch.dtype, tuple[int, ...], int]


def storage_ptr(t: _Tensor) -> int:
    """The data pointer of ``t``'s storage; 0 for a tensor without one."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0


def tensors_in(*trees: Any) -> list[_Tensor]:
    """Every tensor in (nested) arguments."""
    return [x for x in tree_leaves(trees) if isinstance(x, _Tensor)]


def _cuda_index(t: _Tensor) -> int:
    """The index of the CUDA device ``t`` is on."""
    index = t.device.index
    return index if index is not None else torch.cuda.current_device()


def meta_of(t: _Tensor) -> Meta:
    """What a recomputed tensor must match."""
    return (t.size(), t.dtype, t.stride(), t.storage_offset())


class Slot:
    """What autograd holds in place of a tensor the unit keeps.

    When autograd drops it (the node that saved the tensor ran its backward,
    or the graph was freed), the unit forgets the tensor; when the unit's
    last slot goes, the unit is released to the engine.
    """

    __slots__ = ("unit", "index")

    def __init__(self, unit: Unit, index: int) -> None:
        self.unit = unit
        self.index = index

    def __del__(self) -> None:
        unit = self.unit
        unit.alive[self.index] = False
        unit.saved[self.index] = None
        unit.live -= 1
        if unit.live == 0:
            unit.forget_inputs()  # no recompute any more: its inputs may go now
            unit.owner.unit_done(unit)


class Unit:
    """One forward call of a tracked block (see the module doc).

    Attributes:
        owner: the :class:`~memscale._blocks.tracker.BlockDTR` that tracks the block.
        block: the module.
        name: the block's name in the model (for messages).
        args / kwargs: the call's arguments, as the block's hooks got them
            (a recompute calls the block with them again).
        entry: data pointers of the storages the block did not make.
        saved: per slot, the kept tensor (``None`` once its slot died or
            while the unit is evicted).
        meta: per slot, what a recomputed tensor must match.
        alive: per slot, whether autograd still holds it.
        live: how many slots autograd still holds.
        shared: slots whose tensor is also an output of the block (never
            dropped: the program holds it anyway).
        nbytes: bytes of the distinct storages kept.
        resident: the kept tensors are in memory.
        tensor_id: the engine's id of the unit's activations (-1: not registered).
        op_id: the engine's op that makes them.
    """

    __slots__ = (
        "owner", "block", "name", "args", "kwargs", "entry", "saved", "meta", "alive", "live", "shared", "nbytes", "ptrs",
        "resident", "tensor_id", "op_id", "inputs", "input_versions", "buffer_versions", "buffers_before",
        "rng", "cuda_rng", "autocast", "hooks", "started_ns", "released", "signature", "entry_versions", "__weakref__",
    )

    def __init__(self, owner: BlockOwner, block: torch.nn.Module, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.owner = owner
        self.block = block
        self.name = name
        self.args = args
        self.kwargs = kwargs
        self.inputs = tensors_in(args, kwargs)
        #: What makes two calls alike (the room made before a call is what the last alike call kept).
        self.signature = (id(block), *(tuple(t.shape) for t in self.inputs))
        self.entry = {storage_ptr(t) for t in self.inputs}
        params = list(block.parameters())
        self.entry.update(storage_ptr(p) for p in params)
        buffers = list(block.buffers())
        self.entry.update(storage_ptr(b) for b in buffers)
        self.entry.discard(0)
        #: Versions of the inputs when the block started, then (``finished``) when it returned.
        self.input_versions = [t._version for t in self.inputs]
        self.entry_versions = self.input_versions
        self.buffer_versions = [(b, b._version) for b in buffers]
        #: Buffers the block is known to update in place, with their values before this call.
        self.buffers_before: list[tuple[_Tensor, _Tensor]] | None = None
        self.saved: list[_Tensor | None] = []
        self.meta: list[Meta] = []
        self.alive: list[bool] = []
        self.shared: set[int] = set()
        self.ptrs: set[int] = set()
        self.live = 0
        self.nbytes = 0
        self.resident = True
        self.released = False
        self.tensor_id = -1
        self.op_id = -1
        self.rng = torch.get_rng_state()
        # Every CUDA device the call touches (its inputs' or its parameters'):
        # a dropout mask drawn there is replayed from that device's generator.
        devices = sorted({_cuda_index(t) for t in (*self.inputs, *params) if t.is_cuda})
        self.cuda_rng = [(d, torch.cuda.get_rng_state(d)) for d in devices]
        self.autocast = [
            (dt, torch.is_autocast_enabled(dt), torch.get_autocast_dtype(dt)) for dt in _AUTOCAST_DEVICES
        ]
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, unpack)
        self.started_ns = 0

    # ------------------------------------------------------------ first run

    def pack(self, t: _Tensor) -> Any:
        """``saved_tensors_hooks`` pack hook of the block's first run.

        What is kept is detached: the tensor may be the output of the node
        saving it, whose grad_fn would then hold it - a cycle through C++ that
        the collector cannot see. Autograd gives an unpacked tensor its grad_fn
        back itself.
        """
        ptr = storage_ptr(t)
        if ptr == 0:
            return t
        if ptr in self.entry:
            return t.detach()
        index = len(self.saved)
        self.saved.append(t.detach())
        self.meta.append(meta_of(t))
        self.alive.append(True)
        if ptr not in self.ptrs:
            self.ptrs.add(ptr)
            self.nbytes += t.untyped_storage().nbytes()
        self.live += 1
        return Slot(self, index)

    def finished(self, output: Any) -> None:
        """The block's forward returned ``output``: what the unit keeps is known.

        Saved tensors that are also the block's outputs stay resident with the
        program's references (evicting them would free nothing); the rest are
        the unit's activations. Records the versions a recompute will check.
        """
        out_ptrs = {storage_ptr(t) for t in tensors_in(output)}
        shared = self.ptrs & out_ptrs
        if shared:
            self.ptrs -= shared
            self.nbytes = 0
            seen: set[int] = set()
            for k, t in enumerate(self.saved):
                if t is None:
                    continue
                ptr = storage_ptr(t)
                if ptr in shared:
                    self.shared.add(k)
                elif ptr not in seen:
                    seen.add(ptr)
                    self.nbytes += t.untyped_storage().nbytes()
        self.input_versions = [t._version for t in self.inputs]

    def buffer_bytes(self) -> int:
        """Bytes of the block's buffers."""
        return sum(b.nbytes for b, _ in self.buffer_versions)

    def forget_inputs(self) -> None:
        """The unit is released: drop what only a recompute needed."""
        self.args = ()
        self.kwargs = {}
        self.inputs = []
        self.buffers_before = None
        self.saved = [None] * len(self.saved)

    def mutated_inputs(self) -> bool:
        """Whether the block changed one of its inputs in place (after :meth:`finished`)."""
        return self.input_versions != self.entry_versions

    def mutated_buffers(self) -> list[_Tensor]:
        """The block's buffers it changed in place (BatchNorm's running statistics)."""
        return [b for b, v in self.buffer_versions if b._version != v]

    # ------------------------------------------------------------ eviction

    def drop(self) -> None:
        """The engine evicted the unit: forget its activations."""
        if not self.resident:
            return
        self.resident = False
        for k in range(len(self.saved)):
            if k not in self.shared:
                self.saved[k] = None

    def recompute(self) -> None:
        """Run the block again on the same inputs and keep what it saves.

        Raises:
            MemscaleError: an input changed in place since the block ran, or
                the block saved different tensors this time.
        """
        for t, v in zip(self.inputs, self.input_versions):
            if t._version != v:
                raise MemscaleError(
                    f"memscale.blocks: the activations of {self.name} were evicted and cannot be recomputed: "
                    f"one of its inputs (a {tuple(t.shape)} {t.dtype} tensor) was changed in place after the "
                    "block ran. Do not modify a block's inputs in place before backward, or raise the budget "
                    "so that nothing is evicted"
                )
        captured: list[_Tensor] = []
        entry = self.entry
        wanted = len(self.meta)

        def capture(t: _Tensor) -> None:
            # The recompute's own graph is dropped unused: it keeps nothing
            # (a kept tensor could hold its own grad_fn, see pack).
            ptr = storage_ptr(t)
            if ptr == 0 or ptr in entry or len(captured) >= wanted:
                return  # (past the count: forward code that swallowed the stop)
            captured.append(t.detach())
            if meta_of(captured[-1]) != self.meta[len(captured) - 1]:
                raise self._differs(len(captured))
            if len(captured) == wanted:
                raise _Recomputed  # the rest of the forward is not needed

        with self._replayed_state():
            self.owner.recomputing(self, torch.autograd.graph.saved_tensors_hooks(capture, _never_unpacked))
            try:
                with torch.enable_grad():
                    self.block(*self.args, **self.kwargs)
            except _Recomputed:
                pass
            finally:
                self.owner.recomputing(None, None)
        if len(captured) != wanted:
            raise self._differs(len(captured))
        for k, t in enumerate(captured):
            if self.alive[k] and k not in self.shared:
                self.saved[k] = t
        self.resident = True

    def _differs(self, count: int) -> MemscaleError:
        """The recompute's saved tensors are not the first run's (``count`` so far)."""
        return MemscaleError(
            f"memscale.blocks: recomputing {self.name} saved other tensors for backward than its first run "
            f"({count} so far, the last of another shape, dtype or stride, or {count} in all where the first run "
            f"saved {len(self.meta)}): its forward does not repeat (data-dependent control flow, or state it "
            "changes, as a key/value cache it appends to - set model.config.use_cache = False for training); "
            "leave it out of modules=[...] otherwise"
        )

    @contextlib.contextmanager
    def _replayed_state(self) -> Iterator[None]:
        """The random-number, autocast and buffer state of the first run."""
        devices = [d for d, _ in self.cuda_rng]
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=devices))
            torch.set_rng_state(self.rng)
            for d, state in self.cuda_rng:
                torch.cuda.set_rng_state(state, d)
            for dt, enabled, dtype in self.autocast:
                if enabled or torch.is_autocast_enabled(dt):
                    stack.enter_context(torch.autocast(device_type=dt, dtype=dtype, enabled=enabled))
            after: list[tuple[_Tensor, _Tensor]] = []
            if self.buffers_before:
                with torch.no_grad():
                    for b, before in self.buffers_before:
                        after.append((b, b.clone()))
                        b.copy_(before)
            try:
                yield
            finally:
                if after:
                    with torch.no_grad():
                        for b, value in after:
                            b.copy_(value)


class _Recomputed(Exception):
    """Raised by a recompute's pack hook once it has every tensor the first
    run saved: it ends the block's forward there (caught in :meth:`Unit.recompute`)."""


def _never_unpacked(packed: Any) -> Any:
    raise MemscaleError("memscale.blocks: a recompute's own graph was used for backward (it is dropped unused)")


def unpack(x: Any) -> Any:
    """``saved_tensors_hooks`` unpack hook: a slot's tensor, rebuilt if evicted."""
    if type(x) is not Slot:
        return x
    unit = x.unit
    owner = unit.owner
    share = owner.device_share
    if share is not None and share.in_tail:
        share.unpacked()
    if not unit.resident:
        owner.rebuild(unit)
    t = unit.saved[x.index]
    if t is None:  # an invariant broken: say so rather than hand autograd nothing
        raise MemscaleError(f"memscale.blocks: {unit.name}'s saved tensor {x.index} is gone while autograd holds it")
    return t
