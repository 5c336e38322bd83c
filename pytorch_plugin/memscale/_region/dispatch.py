"""Dispatch of one ATen op inside a region: pure ops and in-place ops.

For every op the mode hands over (:func:`dispatch`):

1. **Sync.** Releases queued by garbage collection are told to the engine and
   the storages it freed are dropped (``Session.flush`` / ``Session.sync``).
2. **Inputs.** Arguments are collected into cells (:mod:`.arguments`); plain
   tensors become pinned externals. Evicted inputs are rebuilt
   (:mod:`.rebuild`) and every input stays locked until the op is registered.
3. **Room.** Under a budget, the bytes the op is about to allocate are
   predicted (:class:`.arguments.OutputSizes`) and the engine makes room for
   them first, so usage never goes above the budget.
4. **Run and register.** The op runs on the real tensors; its cost is measured
   (:mod:`.device`). It is registered (queued, :meth:`Engine.queue`: the
   engine hears of it with the next batch or any other call, see
   :data:`.session.OP_BATCH`); an output sharing an
   input's storage (known from the schema for view ops, else found by storage
   pointer, which also catches ``_unsafe_view`` and ``lift_fresh``) is
   registered as an alias of that input. The op is recorded for re-runs.
5. **Wrap.** Each output is returned as a wrapper naming its cell; the
   engine's budget loop runs if the status block says it has work.

**In-place ops** (schema ``is_mutable``) run in place, as in eager mode, and
create new versions (``memscale_dtr_mutate``: the new version takes over the old
memory): the wrapper moves to the new version's cell, and every other live
alias of the mutated storage is re-registered on top of the new version,
because it now sees the new data. The old version stays recomputable from its
own lineage (a re-run of the in-place op works on a copy, see :mod:`.replay`).
In-place ops on externals (an optimizer step, BatchNorm's
``num_batches_tracked``) mutate the user's tensor; the new version inherits the
pin. Ops that change a shape in place are :mod:`.shapes`'s; a pinned tensor an
in-place op overwrites while a recorded op still reads it is copied first
(copy-on-write, :func:`_copies_on_write`).

Holds no state of its own; all of it is the session's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .._native.engine import NO_RECOMPUTE
from ..errors import MemscaleError
from .arguments import OUTPUT_SIZES, Arguments, collect, flatten_tensors, rebuild_result, shape_stand_in
from .cells import (
    RERUN_CALL,
    RERUN_MUTATION,
    RERUN_VIEW,
    Cell,
    HeldCells,
    RecordedOp,
    StorageGroup,
    WrapperRef,
    geometry,
    storage_view,
)
from .device import CudaTimer, perf_ns
from .rebuild import make_resident
from .replay import copy_storage_of, rng_state_for, run_kernel
from .schema import OpInfo
from .shapes import dispatch_inplace_view, follow_resize
from .tensor import DTRTensor

if TYPE_CHECKING:
    from .session import Session

_Tensor = torch.Tensor
_make_wrapper = torch.Tensor._make_wrapper_subclass
_set_conj = torch._C._set_conj
_set_neg = torch._C._set_neg
_grad_enabled = torch.is_grad_enabled
_NOTHING: list[Cell] = []  # no op running
_SIZES_CHECKED = OUTPUT_SIZES.checked


def dispatch(s: Session, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Run one ATen op inside the region (the mode's ``__torch_dispatch__``)."""
    if s.released:
        s.flush()  # told to the engine with this op's registration
    if s.status.pending >= s.drain_at:
        s.evict()
    info = s.infos.get(func)
    if info is None:
        info = s.infos[func] = OpInfo(func, s.recording)
    if info.mutable:
        if info.pure is None or not info.writes_nothing(args, kwargs):
            return _dispatch_mutating(s, func, info, args, kwargs)
        info = info.pure
    if info.shape_only is not None:
        stand_in = shape_stand_in(args, kwargs)
        if stand_in is not None:
            args, kwargs = stand_in
            info = info.shape_only
    registered = s.externals_registered
    a = collect(s, info, args, kwargs)
    if registered != s.externals_registered and not a.missing:
        # Making room for a new external may have evicted an input collected before it.
        a.missing = any(c.tensor is None for c in a.cells)
    size_key = None
    extra = 0
    if not s.budgeted:
        if func not in _SIZES_CHECKED and not info.all_views and not a.missing:
            # Once per op overload: does its meta kernel report what it allocates?
            size_key, _ = OUTPUT_SIZES.predict(func, info, a.args, a.kwargs)
    elif not info.all_views and not a.missing:
        size_key, extra = OUTPUT_SIZES.predict(func, info, a.args, a.kwargs)
        status = s.status
        live = s.usage_live
        if s.usage_known and (status.usage + s.engine.queued_bytes if live is None else live.value) + extra <= status.budget:
            extra = 0  # room already
    if a.missing or extra:
        with HeldCells(s.engine) as held:
            if a.missing:
                a.args, a.kwargs = [], {}  # a parked input must not stay referenced here
                make_resident(s, a.cells, held)
                a.refill(info)
                if s.budgeted and not info.all_views:
                    size_key, extra = OUTPUT_SIZES.predict(func, info, a.args, a.kwargs)
            if extra:
                if not held.cells:
                    held.lock_all(a.cells)
                s.make_room(extra, info.name)
            out, cells, outs, partial = _run_and_register(s, func, info, a, size_key)
    else:
        out, cells, outs, partial = _run_and_register(s, func, info, a, size_key)
    if cells is None:
        return out
    wrappers = wrap_outputs(s, cells, outs)
    status = s.status  # s.after_op(), inlined: most ops leave it nothing to do
    if status.pending >= s.drain_at or (
        s.budgeted
        and (
            not s.usage_known
            or (status.usage + s.engine.queued_bytes if (live := s.usage_live) is None else live.value) > status.budget
        )
    ):
        s.evict()
    if partial:
        return rebuild_result(out, _wrappers_and_constants(out, wrappers))
    if len(wrappers) == 1 and isinstance(out, _Tensor):
        return wrappers[0]
    return rebuild_result(out, iter(wrappers))


class _Storageless(Exception):
    """An op returned a tensor without storage (see :func:`_run_and_register`)."""


def _wrappers_and_constants(out: Any, wrappers: list[DTRTensor]) -> Iterator[_Tensor]:
    """Per tensor of ``out``: itself if it has no storage, else the next wrapper."""
    flat: list[_Tensor] = []
    flatten_tensors(out, flat)
    it = iter(wrappers)
    for t in flat:
        yield t if t._is_zerotensor() else next(it)


def _run_and_register(
    s: Session, func: Any, info: OpInfo, a: Arguments, size_key: Any
) -> tuple[Any, list[Cell] | None, list[_Tensor], bool]:
    """Run a non-mutating op on resident inputs and register it.

    Returns ``(result, output cells, output tensors, partial)``; the cells are
    ``None`` for a result without tensors to register. ``partial``: some
    tensors of the result have no storage (efficient zero tensors); they are
    not registered and go back to the program as they are - constants, like
    any tensor the region does not hold.
    """
    rng = rng_state_for(info, a.args, a.kwargs) if info.seeded else None
    timer = s.cuda_timer
    start = timer.start(func) if timer is not None else None
    s.running = a.cells
    try:
        t0 = perf_ns()
        out = run_kernel(func, a.args, a.kwargs)
        cost = perf_ns() - t0
    finally:
        s.running = _NOTHING
    # Drop the references to the inputs' real tensors now: one the budget loop
    # evicts after this op must really be freed.
    a.args = []
    a.kwargs = {}
    if isinstance(out, _Tensor):
        outs = [out]
    else:
        outs = []
        flatten_tensors(out, outs)
        if not outs:
            return out, None, outs, False
    if timer is not None:
        cost = timer.stop((func, outs[0].nbytes), start, cost)
    elif outs[0].is_cuda:
        s.cuda_timer = CudaTimer()
    partial = False
    try:
        cells, fresh_bytes = register(s, info, a.cells, outs, cost)
    except _Storageless:
        outs = [o for o in outs if not o._is_zerotensor()]
        if not outs:
            return out, None, outs, False
        partial = True
        cells, fresh_bytes = register(s, info, a.cells, outs, cost)
    if size_key is not None:
        OUTPUT_SIZES.learn(size_key, fresh_bytes)
    if s.recording:
        for c in a.cells:
            if c.pinned:
                c.consumed = True
        s.ops[cells[0].op_id] = RecordedOp(
            func, a.template_args, a.template_kwargs, a.cells, cells, rng, RERUN_CALL, (), (), _grad_enabled()
        )
        if s.verifier is not None and info.reproducible:
            s.verifier.computed(cells[0].op_id, cells)
    return out, cells, outs, partial


def register(s: Session, info: OpInfo, inputs: list[Cell], outs: list[_Tensor], cost: int) -> tuple[list[Cell], int]:
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
        op, out_ids = engine.queue(info.name, [c.tensor_id for c in inputs], sizes, aliases, cost, _flags(s, info, inputs), fresh)
        freed = engine.flush() if engine.queued >= s.op_batch else None
    else:
        op, out_ids, freed = engine.op(info.name, [c.tensor_id for c in inputs], sizes, aliases, cost, _flags(s, info, inputs))
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


def _flags(s: Session, info: OpInfo, inputs: list[Cell]) -> int:
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
            raise _Storageless from exc
        raise MemscaleError(
            f"memscale.dtr: {info.label()} returned a {t.layout} tensor; only strided "
            f"(dense) tensors can live in a DTR region ({exc})"
        ) from exc


def wrap_outputs(s: Session, cells: list[Cell], outs: list[_Tensor]) -> list[DTRTensor]:
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


# ---------------------------------------------------------------- in-place ops


def _dispatch_mutating(s: Session, func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    if info.inplace_view:
        return dispatch_inplace_view(s, func, info, args, kwargs)
    registered = s.externals_registered
    a = collect(s, info, args, kwargs)
    mutated = [j for j, key in enumerate(a.keys) if key in info.mutated]
    copies = _copies_on_write(s, info, a, mutated) if s.recording else None
    if registered != s.externals_registered and not a.missing:
        a.missing = any(c.tensor is None for c in a.cells)
    # Every live alias of a mutated storage sees the new data, so each must be
    # resident (views rebuilt) before the op runs.
    stale_aliases: list[Cell] = []
    for j in mutated:
        cell = a.cells[j]
        group = s.groups.get(cell.root)
        if group is not None and len(group.cells) > 1:
            stale_aliases += [
                x for x in group.cells if x is not cell and not x.released and x.tensor is None and not x.pinned
            ]
    size_key, extra = _fresh_output_room(s, func, info, a)
    if a.missing or stale_aliases or extra:
        with HeldCells(s.engine) as held:
            if a.missing or stale_aliases:
                a.args, a.kwargs = [], {}  # a parked input must not stay referenced here
                make_resident(s, a.cells + stale_aliases, held)
                a.refill(info)
                size_key, extra = _fresh_output_room(s, func, info, a)
            if extra:
                if not held.cells:
                    held.lock_all(a.cells)
                s.make_room(extra, info.name)
            out, fresh_cells, fresh, returned_args = _run_mutating(s, func, info, a, mutated, copies, size_key)
    else:
        out, fresh_cells, fresh, returned_args = _run_mutating(s, func, info, a, mutated, copies, size_key)
    for key in info.mutated:
        x = args[key] if isinstance(key, int) else kwargs.get(key)
        if type(x) is DTRTensor:
            follow_resize(s, info, x)
    wrappers = iter(wrap_outputs(s, fresh_cells, fresh))
    s.after_op()
    if isinstance(out, _Tensor):
        source = returned_args[0] if returned_args else None
        if source is None:
            return next(wrappers)
        return args[source] if isinstance(source, int) else kwargs[source]
    if type(out) in (tuple, list) and returned_args:
        result = []
        for o, source in zip(out, returned_args):
            if source is not None:
                result.append(args[source] if isinstance(source, int) else kwargs[source])
            elif isinstance(o, _Tensor):
                result.append(next(wrappers))
            else:
                result.append(o)
        return type(out)(result)
    return out


def _fresh_output_room(s: Session, func: Any, info: OpInfo, a: Arguments) -> tuple[Any, int]:
    """Under a budget, for an in-place op that also computes fresh results
    (batch norm updating its running statistics): the prediction key and the
    bytes to make room for (0: room already), as for a pure op."""
    if not s.budgeted or a.missing or not info.fresh_results or any(r is not None for r in info.returns_arg):
        return None, 0
    size_key, extra = OUTPUT_SIZES.predict(func, info, a.args, a.kwargs)
    if s.usage_known and s.usage_now() + extra <= s.status.budget:
        extra = 0
    return size_key, extra


def _copies_on_write(s: Session, info: OpInfo, a: Arguments, mutated: list[int]) -> dict[Cell, _Tensor] | None:
    """Copies of the pinned storages an in-place op is about to overwrite whose
    old data a re-run may still need (see :func:`_move_old_versions`).

    A region tensor's old version stays recomputable from its lineage; a
    pinned one (an external: the user's running statistics, an input) is
    overwritten for good. When a recorded op read it (or this op computes
    fresh results from it, as batch norm does), its current data is copied
    first; the copy is counted in the budget.
    """
    copies: dict[Cell, _Tensor] | None = None
    for j in mutated:
        cell = a.cells[j]
        if not cell.pinned or cell.tensor is None or (copies is not None and cell in copies):
            continue
        group = s.groups.get(cell.root)
        if group is None or not (info.fresh_results or any(x.consumed for x in group.cells)):
            continue
        if s.budgeted:
            s.make_room(group.nbytes, b"the old version of an overwritten external")
            s.externals_registered += 1  # dispatch re-checks the inputs' residency
        if copies is None:
            copies = {}
        copies[cell] = copy_storage_of(cell.tensor)
    return copies


def _move_old_versions(s: Session, copies: dict[Cell, _Tensor]) -> list[tuple[Cell, Cell]]:
    """Copy-on-write of pinned storages an in-place op overwrote.

    The old version (every cell of the storage: the engine's tensors keep
    their ids, so recorded ops and plans are unchanged) now reads the copy;
    the program's tensors, which see the new data, are registered as a new
    external (and aliases of it) and named by it. The engine is not told of a
    mutation: to it the old storage stayed resident and pinned, and a new one
    appeared. Returns ``(old cell, new cell)`` per copied storage.
    """
    moved: list[tuple[Cell, Cell]] = []
    for old, copy in copies.items():
        group = s.groups[old.root]
        program = old.tensor
        assert program is not None
        storage = copy.untyped_storage()
        named: list[tuple[Cell, _Tensor]] = []
        for x in group.cells:
            if x.tensor is not None:
                if x is not old and not x.released and x.wrapper_ref is not None:
                    named.append((x, x.tensor))
                x.tensor = storage_view(storage, geometry(x.tensor))
        program_storage = program.untyped_storage()
        new = s._register_external(program, group.nbytes, program_storage.data_ptr())
        s.repoint(old, new)
        for x, t in named:
            _, (tensor_id,) = s.engine.call(b"alias", [new.tensor_id], [t.nbytes], [0], 0, NO_RECOMPUTE)
            alias = Cell(tensor_id, t, new.root, -1, s, pinned=True)
            s.groups[new.root].add(alias)
            s.repoint(x, alias)
        moved.append((old, new))
    return moved


def _run_mutating(
    s: Session,
    func: Any,
    info: OpInfo,
    a: Arguments,
    mutated: list[int],
    copies: dict[Cell, _Tensor] | None,
    size_key: Any = None,
) -> tuple[Any, list[Cell], list[_Tensor], list[Any]]:
    """Run an in-place op on resident inputs and register its new versions.

    Returns ``(result, fresh output cells, fresh output tensors, per result
    the argument it is or None)``. ``copies``: the old data of pinned
    storages it overwrites (:func:`_copies_on_write`).
    """
    rng = rng_state_for(info, a.args, a.kwargs)
    s.running = a.cells
    t0 = perf_ns()
    out = run_kernel(func, a.args, a.kwargs)
    cost = perf_ns() - t0
    s.running = _NOTHING
    a.args = []
    a.kwargs = {}
    # Results that are mutated arguments are returned as the argument objects
    # themselves; any other tensor result is fresh (registered below).
    fresh: list[_Tensor] = []
    returned_args: list[Any] = []
    returns = info.returns_arg
    if isinstance(out, _Tensor):
        source = returns[0] if returns else None
        returned_args.append(source)
        if source is None:
            fresh.append(out)
    elif type(out) in (tuple, list) and len(out) == len(returns):
        for o, source in zip(out, returns):
            returned_args.append(source)
            if source is None and isinstance(o, _Tensor):
                fresh.append(o)
    fresh_cells: list[Cell] = []
    if fresh:
        # Fresh outputs of a mutating op (batch norm with running statistics
        # as declared mutable arguments): a separate call; its re-run works on
        # scratch copies of the mutated arguments.
        moved = _move_old_versions(s, copies) if copies else ()
        fresh_cells, fresh_bytes = register(s, info, a.cells, fresh, cost)
        if size_key is not None:
            OUTPUT_SIZES.learn(size_key, fresh_bytes)
        if s.recording:
            s.ops[fresh_cells[0].op_id] = RecordedOp(
                func,
                a.template_args,
                a.template_kwargs,
                a.cells,
                fresh_cells,
                rng,
                RERUN_CALL,
                scratch=tuple(info.mutated),
                grad_mode=_grad_enabled(),
            )
            if s.verifier is not None and info.reproducible:
                s.verifier.computed(fresh_cells[0].op_id, fresh_cells)
    else:
        moved = _move_old_versions(s, copies) if copies else ()
    if copies:
        mutated = [j for j in mutated if a.cells[j] not in copies]
    if mutated:
        _register_mutation(s, func, info, a, mutated, cost, rng)
    if s.sink is not None:
        for old, new in moved:
            s.sink.version(old, new)
    return out, fresh_cells, fresh, returned_args


def _register_mutation(
    s: Session, func: Any, info: OpInfo, a: Arguments, mutated: list[int], cost: int, rng: Any
) -> None:
    """``memscale_dtr_mutate``: new versions for the mutated inputs."""
    inputs = a.cells
    unique: list[int] = []
    for j in mutated:
        if all(inputs[j] is not inputs[k] for k in unique):
            unique.append(j)
    op, new_ids = s.engine.mutate(info.name, [c.tensor_id for c in inputs], unique, cost, _flags(s, info, inputs))
    versions: list[Cell] = []
    for j, tensor_id in zip(unique, new_ids):
        old = inputs[j]
        # The new version takes over the old memory and its pins (engine).
        new = Cell(tensor_id, old.tensor, tensor_id, op, s, pinned=old.pinned)
        old_group = s.groups.get(old.root)
        s.groups[tensor_id] = StorageGroup(new, old_group.nbytes if old_group is not None else 0)
        s.repoint(old, new)
        versions.append(new)
        if s.sink is not None:
            s.sink.version(old, new)
        # The engine released the old version (a mutation is the old version's
        # last use by this name); its data is now the new version's.
        old.released = True
        old.wrapper_ref = None
        old.tensor = None
        if old_group is not None:
            old_group.live_refs -= 1
            # Other live aliases of the mutated storage now see the new data:
            # re-register each as an alias of the new version.
            for alias in list(old_group.cells):
                if not alias.released and alias is not old:
                    _realias(s, alias, new)
            for alias in old_group.cells:
                alias.tensor = None
    if s.sink is not None:
        s.sink.mutate(info.name, inputs, unique, cost)
    if s.recording:
        for c in inputs:
            if c.pinned:
                c.consumed = True
        s.ops[op] = RecordedOp(
            func, a.template_args, a.template_kwargs, inputs, versions, rng, RERUN_MUTATION,
            mutated=tuple(unique), scratch=_not_versioned(info, a, unique), grad_mode=_grad_enabled(),
        )
        if s.verifier is not None and info.reproducible:
            s.verifier.computed(op, versions)


def _not_versioned(info: OpInfo, a: Arguments, versioned: list[int]) -> tuple[Any, ...]:
    """The written arguments a re-run of new versions ``versioned`` must not
    write again: every other argument the op writes (a pinned one copied on
    write holds its old version now; writing it would change that version)."""
    keys = {a.keys[j] for j in versioned}
    return tuple(key for key in info.mutated if key not in keys)


def _realias(s: Session, alias: Cell, new: Cell) -> None:
    """Re-register live ``alias`` of a mutated storage on top of version ``new``."""
    t = alias.tensor
    assert t is not None
    op, (tensor_id,) = s.engine.call(b"alias", [new.tensor_id], [t.nbytes], [0], 0, 0)
    cell = Cell(tensor_id, t, new.root, op, s, pinned=new.pinned)
    s.groups[new.root].add(cell)
    if s.recording:
        s.ops[op] = RecordedOp(None, geometry(t), None, [new], [cell], None, RERUN_VIEW)
    s.repoint(alias, cell)
    if s.sink is not None:
        s.sink.version(alias, cell)
    alias.tensor = None
    s.release_cell(alias)
