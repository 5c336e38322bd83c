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
   (:mod:`.device`). It is registered (:func:`.outputs.register`: queued, an
   output sharing an input's storage registered as an alias of that input)
   and recorded for re-runs.
5. **Wrap.** Each output is returned as a wrapper naming its cell
   (:func:`.outputs.wrap_outputs`); the engine's budget loop runs if the
   status block says it has work.

**In-place ops** (schema ``is_mutable``) are :mod:`.inplace`'s: they create
new versions; ops that change a shape in place are :mod:`.shapes`'s.

Holds no state of its own; all of it is the session's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .arguments import OUTPUT_SIZES, Arguments, collect, flatten_tensors, rebuild_result, shape_stand_in
from .cells import RERUN_CALL, Cell, HeldCells, RecordedOp
from .device import CudaTimer, perf_ns
from .inplace import dispatch_mutating
from .outputs import NOTHING_RUNNING, Storageless, register, wrap_outputs
from .rebuild import make_resident
from .replay import rng_state_for, run_kernel
from .schema import OpInfo
from .tensor import DTRTensor

if TYPE_CHECKING:
    from .externals import SessionExternals

_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_SIZES_CHECKED = OUTPUT_SIZES.checked


def dispatch(s: SessionExternals, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
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
            return dispatch_mutating(s, func, info, args, kwargs)
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


def _wrappers_and_constants(out: Any, wrappers: list[DTRTensor]) -> Iterator[_Tensor]:
    """Per tensor of ``out``: itself if it has no storage, else the next wrapper."""
    flat: list[_Tensor] = []
    flatten_tensors(out, flat)
    it = iter(wrappers)
    for t in flat:
        yield t if t._is_zerotensor() else next(it)


def _run_and_register(
    s: SessionExternals, func: Any, info: OpInfo, a: Arguments, size_key: Any
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
        s.running = NOTHING_RUNNING
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
    except Storageless:
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
