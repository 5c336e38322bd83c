"""Registration of an op's outputs, and their wrappers.

The last two steps of an op inside a region (:mod:`.dispatch`, :mod:`.inplace`):
:func:`register` tells the engine of an op that ran (queued, :meth:`Engine.queue`:
the engine hears of it with the next batch or any other call, see
:data:`.state.OP_BATCH`) and makes a cell per output - an output sharing an
input's storage (known from the schema for view ops, else found by storage
pointer, which also catches ``_unsafe_view`` and ``lift_fresh``) is
registered as an alias of that input; :func:`wrap_outputs` returns a wrapper
per output cell, released to the engine when it dies.

Holds no state of its own; all of it is the session's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import torch

from .._native.engine import NO_RECOMPUTE
from ..errors import MemscaleError
from .cells import Cell, StorageGroup, WrapperRef
from .schema import OpInfo
from .tensor import DTRTensor

if TYPE_CHECKING:
    from .externals import SessionExternals

_Tensor = torch.Tensor
_make_wrapper = torch.Tensor._make_wrapper_subclass
_set_conj = torch._C._set_conj
_set_neg = torch._C._set_neg

#: ``Session.running`` while no op's kernel runs.
NOTHING_RUNNING: Final[list[Cell]] = []


class Storageless(Exception):
    """An op returned a tensor without storage (see :func:`.dispatch._run_and_register`)."""


def register(s: SessionExternals, info: OpInfo, inputs: list[Cell], outs: list[_Tensor], cost: int) -> tuple[list[Cell], int]:
    """Register an op that ran (queued, or ``memscale_dtr_op`` with a batch of
    1); returns its output cells and the bytes of its fresh (non-alias)
    outputs."""
    n_in = len(inputs)
    sizes: list[int] = []
    aliases: list[int] = []
    fresh = 0
    if info.views_first and n_in:
        # The schema says every result views the first argument.
        for o in outs:
            aliases.append(0)
            sizes.append(o.nbytes)
    else:
        input_ptrs: list[int] | None = None
        for o in outs:
            storage, ptr = _storage_of(o, info)
            k = -1
            if ptr and n_in:
                if input_ptrs is None:
                    input_ptrs = [c.tensor.untyped_storage().data_ptr() for c in inputs]  # type: ignore[union-attr]
                if ptr in input_ptrs:
                    k = input_ptrs.index(ptr)
            aliases.append(k)
            if k < 0:
                size = storage.nbytes()
                fresh += size
            else:
                size = o.nbytes
            sizes.append(size)
    engine = s.engine
    if s.op_batch > 1:
        op, out_ids = engine.queue(info.name, [c.tensor_id for c in inputs], sizes, aliases, cost, flags(s, info, inputs), fresh)
        freed = engine.flush() if engine.queued >= s.op_batch else None
    else:
        op, out_ids, freed = engine.op(info.name, [c.tensor_id for c in inputs], sizes, aliases, cost, flags(s, info, inputs))
    if freed:
        s.drop_freed(freed)
    groups = s.groups
    cells = []
    for tensor_id, o, k, size in zip(out_ids, outs, aliases, sizes):
        if k < 0:
            cell = Cell(tensor_id, o, tensor_id, op, s)
            groups[tensor_id] = StorageGroup(cell, size)
        else:
            source = inputs[k]
            cell = Cell(tensor_id, o, source.root, op, s, pinned=source.pinned)
            groups[source.root].add(cell)
        cells.append(cell)
    if s.sink is not None:
        s.sink.call(info.name, inputs, cells, sizes, aliases, cost)
    return cells, fresh


def flags(s: SessionExternals, info: OpInfo, inputs: list[Cell]) -> int:
    """The engine flags of an op's registration: the schema's (collectives are
    never re-run), and ``NO_RECOMPUTE`` when it read a storage that is freed
    behind the region's back (:mod:`.volatile`: FSDP's unsharded parameters)."""
    if s.volatile_roots and any(c.root in s.volatile_roots for c in inputs):
        return info.flags | NO_RECOMPUTE
    return info.flags


def _storage_of(t: _Tensor, info: OpInfo) -> tuple[Any, int]:
    """``t``'s storage and its data pointer."""
    try:
        storage = t.untyped_storage()
        return storage, storage.data_ptr()
    except (RuntimeError, NotImplementedError) as exc:
        if t._is_zerotensor():
            raise Storageless from exc
        raise MemscaleError(
            f"memscale.dtr: {info.label()} returned a {t.layout} tensor; only strided "
            f"(dense) tensors can live in a DTR region ({exc})"
        ) from exc


def wrap_outputs(s: SessionExternals, cells: list[Cell], outs: list[_Tensor]) -> list[DTRTensor]:
    """A wrapper per output cell, each released to the engine when it dies."""
    queue = s.queue_release
    live = s.live
    wrappers = []
    for cell, real in zip(cells, outs):
        # Strided (register refused any other layout), no grad: the defaults.
        offset = real.storage_offset()
        if offset:
            wrapper = _make_wrapper(
                DTRTensor, real.size(), strides=real.stride(), storage_offset=offset, dtype=real.dtype, device=real.device
            )
        else:
            wrapper = _make_wrapper(DTRTensor, real.size(), strides=real.stride(), dtype=real.dtype, device=real.device)
        if real.is_conj():  # lazily conjugated / negated views: the wrapper
            _set_conj(wrapper, True)  # carries the bit, so PyTorch resolves it
        if real.is_neg():  # before an op that reads the data (see module doc)
            _set_neg(wrapper, True)
        wrapper._c = cell
        ref = WrapperRef(wrapper, queue)
        ref.cell = cell
        cell.wrapper_ref = ref
        live[id(ref)] = ref
        wrappers.append(wrapper)
    return wrappers
