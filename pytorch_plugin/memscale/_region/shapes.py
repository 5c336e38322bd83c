"""In-place ops that change a tensor's shape, strides or offset.

PyTorch's own decompositions call ``squeeze_``, ``transpose_``, ``t_`` or
``as_strided_`` on their intermediates (``matmul`` of a vector, GRU with
``batch_first``), and some in-place kernels resize their output
(``addbmm_``). The data stays where it was; the geometry changes. Here such an
op is registered as a new view of the same storage and whatever named the old
tensor - a wrapper, whose own metadata is rebased, or the user's plain tensor -
names the new one. An op that would give a region tensor other memory
(``set_``, a growing resize) is refused.

Called by :mod:`.dispatch`; holds no state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..errors import MemscaleError
from .cells import RERUN_VIEW, Cell, HeldCells, RecordedOp, geometry, storage_view
from .device import perf_ns
from .rebuild import make_resident
from .replay import run_kernel
from .schema import OpInfo
from .tensor import DTRTensor, unwrap

if TYPE_CHECKING:
    from .externals import SessionExternals

_Tensor = torch.Tensor


def dispatch_inplace_view(s: SessionExternals, func: Any, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    """An op that changes its argument's shape, strides or offset in place
    (``squeeze_``, ``transpose_``, ``as_strided_``, ``detach_``...), as
    PyTorch's own decompositions do on their intermediates.

    The data stays; the geometry changes. The op runs on a fresh alias of the
    real tensor, and the result is registered as a new view of the same
    storage (re-derived from its geometry when rebuilt). Whatever named the old
    cell names the new one: a wrapper, whose own metadata is rebased, or the
    user's plain tensor, which the op changes as it would outside a region. The
    old cell keeps its geometry for the recorded ops that read it.
    """
    target = args[0] if args else None
    if info.name == b"resize_as_" and len(args) >= 2 and isinstance(args[1], _Tensor):
        # Only the template's shape is read: the same as resize_ to it.
        func = torch.ops.aten.resize_.default
        info = s.infos.get(func) or s.infos.setdefault(func, OpInfo(func, s.recording))
        args = (target, list(args[1].shape))
    if len(info.tensor_args) + len(info.tensor_kwargs) != 1 or not isinstance(target, _Tensor):
        raise MemscaleError(f"memscale.dtr: in-place view op {info.label()} with more than one tensor is not supported")
    if info.name.startswith(b"set_") or (info.name.startswith(b"resize_") and not _fits(unwrap(target), args)):
        raise MemscaleError(
            f"memscale.dtr: {info.label()} would give a region tensor other memory (it swaps or grows "
            "its storage), which the region cannot rebuild; make a new tensor instead (torch.empty, "
            "torch.cat, .clone())"
        )
    cell = s.cell_of(target)
    if cell is None:  # no storage: nothing of it is held
        with _below_autograd():
            return func(*args, **kwargs)
    with HeldCells(s.engine) as held:
        make_resident(s, [cell], held)
        real = cell.tensor
        assert real is not None
        t0 = perf_ns()
        view = run_kernel(func, (_alias(real), *args[1:]), kwargs)
        cost = perf_ns() - t0
        op, (tensor_id,) = s.engine.call(info.name, [cell.tensor_id], [view.nbytes], [0], cost, info.flags)
        new = Cell(tensor_id, view, cell.root, op, s, pinned=cell.pinned)
        s.groups[cell.root].add(new)
        if s.recording:
            s.ops[op] = RecordedOp(None, geometry(view), None, [cell], [new], None, RERUN_VIEW)
        if s.sink is not None:
            s.sink.call(info.name, [cell], [new], [view.nbytes], [0], cost)
    with _below_autograd():
        if type(target) is DTRTensor:
            # Autograd has done its part already (the outer call): only the
            # wrapper's own sizes and strides change here.
            with torch._C._DisableTorchDispatch():
                target.as_strided_(view.size(), view.stride(), view.storage_offset())
        else:
            func(*args, **kwargs)  # the user's tensor changes as in eager mode
    if cell.wrapper_ref is not None and cell.wrapper_ref() is target:
        s.repoint(cell, new)
        s.release_cell(cell)
    else:  # nothing of the program's names the new geometry
        s.release_cell(new)
    s.after_op()
    return target


def follow_resize(s: SessionExternals, info: OpInfo, wrapper: DTRTensor) -> None:
    """An in-place op may resize its output (``addbmm_`` on a one-element
    ``self``): the wrapper takes the new shape when the data stayed in its
    storage; a grown storage is an error (the region cannot account for it)."""
    real = wrapper._c.tensor
    if real is None or (real.shape == wrapper.shape and real.stride() == wrapper.stride()):
        return
    group = s.groups.get(wrapper._c.root)
    if group is not None and real.untyped_storage().nbytes() > group.nbytes:
        raise MemscaleError(
            f"memscale.dtr: {info.label()} resized a region tensor in place from {tuple(wrapper.shape)} to "
            f"{tuple(real.shape)}, growing its memory, which the region cannot account for; use the "
            "out-of-place op instead"
        )
    with _below_autograd(), torch._C._DisableTorchDispatch():
        wrapper.as_strided_(real.size(), real.stride(), real.storage_offset())


def _fits(target: _Tensor, args: Any) -> bool:
    """Whether ``resize_(target, size)`` stays within ``target``'s storage (a
    change of metadata only)."""
    if len(args) < 2 or not isinstance(args[1], (list, tuple)):
        return False
    numel = 1
    for n in args[1]:
        numel *= int(n)
    return (target.storage_offset() + numel) * target.element_size() <= target.untyped_storage().nbytes()


def _alias(t: _Tensor) -> _Tensor:
    """A new tensor object on ``t``'s storage with ``t``'s geometry and bits."""
    return storage_view(t.untyped_storage(), geometry(t))


def _below_autograd() -> Any:
    return torch._C._AutoDispatchBelowADInplaceOrView()
