"""In-place ops inside a region: new versions, aliases, copy-on-write.

An in-place op (schema ``is_mutable``; :func:`dispatch_mutating`, called by
:func:`.dispatch.dispatch`) runs in place, as in eager mode, and creates new
versions (``memscale_dtr_mutate``: the new version takes over the old
memory): the wrapper moves to the new version's cell, and every other live
alias of the mutated storage is re-registered on top of the new version,
because it now sees the new data. The old version stays recomputable from its
own lineage (a re-run of the in-place op works on a copy, see :mod:`.replay`).
In-place ops on externals (an optimizer step, BatchNorm's
``num_batches_tracked``) mutate the user's tensor; the new version inherits the
pin. Ops that change a shape in place are :mod:`.shapes`'s; a pinned tensor an
in-place op overwrites while a recorded op still reads it is copied first
(copy-on-write, :func:`_copies_on_write`). Fresh results of an in-place op
(batch norm's outputs next to its running statistics) are registered as a
pure op's (:mod:`.outputs`).

Holds no state of its own; all of it is the session's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .._native.engine import NO_RECOMPUTE
from .arguments import OUTPUT_SIZES, Arguments, collect
from .cells import RERUN_CALL, RERUN_MUTATION, RERUN_VIEW, Cell, HeldCells, RecordedOp, StorageGroup, geometry, storage_view
from .device import perf_ns
from .outputs import NOTHING_RUNNING, flags, register, wrap_outputs
from .rebuild import make_resident
from .replay import copy_storage_of, rng_state_for, run_kernel
from .schema import OpInfo
from .shapes import dispatch_inplace_view, follow_resize
from .tensor import DTRTensor

if TYPE_CHECKING:
    from .externals import SessionExternals

_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled


def dispatch_mutating(s: SessionExternals, func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    if info.inplace_view:
        return dispatch_inplace_view(s, func, info, args, kwargs)
    unregistered = s.unregistered
    try:
        return _dispatch_mutating(s, func, info, args, kwargs)
    finally:
        s.unregistered = unregistered  # copies an error dropped were never registered


def _dispatch_mutating(s: SessionExternals, func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
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


def _fresh_output_room(s: SessionExternals, func: Any, info: OpInfo, a: Arguments) -> tuple[Any, int]:
    """Under a budget, for an in-place op that also computes fresh results
    (batch norm updating its running statistics): the prediction key and the
    bytes to make room for (0: room already), as for a pure op."""
    if not s.budgeted or a.missing or not info.fresh_results or any(r is not None for r in info.returns_arg):
        return None, 0
    size_key, extra = OUTPUT_SIZES.predict(func, info, a.args, a.kwargs)
    if s.usage_known and s.usage_now() + extra <= s.status.budget:
        extra = 0
    return size_key, extra


def _copies_on_write(s: SessionExternals, info: OpInfo, a: Arguments, mutated: list[int]) -> dict[Cell, _Tensor] | None:
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
        copies[cell] = copy = copy_storage_of(cell.tensor)
        s.unregistered += copy.untyped_storage().nbytes()  # until _move_old_versions registers it
    return copies


def _move_old_versions(s: SessionExternals, copies: dict[Cell, _Tensor]) -> list[tuple[Cell, Cell]]:
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
        s.unregistered -= copy.untyped_storage().nbytes()  # registered below
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
    s: SessionExternals,
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
    s.running = NOTHING_RUNNING
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
    s: SessionExternals, func: Any, info: OpInfo, a: Arguments, mutated: list[int], cost: int, rng: Any
) -> None:
    """``memscale_dtr_mutate``: new versions for the mutated inputs."""
    inputs = a.cells
    unique: list[int] = []
    for j in mutated:
        if all(inputs[j] is not inputs[k] for k in unique):
            unique.append(j)
    op, new_ids = s.engine.mutate(info.name, [c.tensor_id for c in inputs], unique, cost, flags(s, info, inputs))
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


def _realias(s: SessionExternals, alias: Cell, new: Cell) -> None:
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
