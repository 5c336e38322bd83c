"""Re-running a recorded op on the current data of its input cells.

A re-run must produce bitwise what the first run produced and must change
nothing else:

* a seeded op (dropout) runs under the generator state it first ran with, and
  the generator is put back afterwards;
* an in-place op runs on a copy of the (rebuilt) old version's storage, so the
  old version is never clobbered; the copy becomes the new version's data;
* arguments an op writes but must not write again (running statistics) are
  replaced by scratch copies;
* a view is re-derived from its storage and geometry, without running an op;
* the op runs under the grad mode of its first run (backward re-runs forward
  ops with grad mode off; some kernels return more with it on).

The caller has made every input resident and locked it, and tells the engine
about the re-run; this module only runs it and puts the results into the
output cells. Holds no state.
"""

from __future__ import annotations

from typing import Any, Final

import torch

from ..errors import MemscaleError
from .arguments import flatten_tensors, refill, substitute
from .cells import RERUN_MUTATION, RERUN_VIEW, RecordedOp, geometry, storage_view
from .device import perf_ns
from .schema import OpInfo

_Tensor = torch.Tensor
_exclude_set = torch._C._dispatch_tls_local_exclude_set
_include_set = torch._C._dispatch_tls_local_include_set
_ForceGuard = torch._C._ForceDispatchKeyGuard
_CONJUGATE = torch._C.DispatchKey.Conjugate
_NEGATIVE = torch._C.DispatchKey.Negative
_ZERO = torch._C.DispatchKey.ZeroTensor


def rerun(op: RecordedOp, info: OpInfo | None) -> int:
    """Re-run ``op`` (inputs resident); fills its output cells, returns the ns it took.

    ``info`` is the op's :class:`OpInfo` (``None`` for a view).
    """
    if op.kind == RERUN_VIEW:
        return _rederive_view(op)
    assert info is not None
    args, kwargs = refill(op.args, op.kwargs or {}, info)
    copies: list[_Tensor] = []
    if op.kind == RERUN_MUTATION:
        # Never clobber the (rebuilt) old version: run on a copy of it.
        for j in op.mutated:
            old = op.inputs[j].tensor
            assert old is not None
            copy = copy_storage_of(old)
            copies.append(copy)
            substitute(args, kwargs, info, old, copy)
    for key in op.scratch:
        _replace_with_clone(args, kwargs, key)
    rng = op.rng_state
    if rng is not None:
        generator, state = rng
        saved = generator.get_state()
        generator.set_state(state)
    grad_mode = torch.is_grad_enabled()
    if grad_mode != op.grad_mode:
        torch._C._set_grad_enabled(op.grad_mode)
    try:
        t0 = perf_ns()
        out = run_kernel(op.func, args, kwargs)
        cost = perf_ns() - t0
    finally:
        if grad_mode != op.grad_mode:
            torch._C._set_grad_enabled(grad_mode)
        if rng is not None:
            generator.set_state(saved)
    if op.kind == RERUN_MUTATION:
        for cell, copy in zip(op.outputs, copies):
            if not cell.pinned:
                cell.tensor = copy
        return cost
    results = _fresh_results(out, info) if op.scratch and info.mutable else _all_tensors(out)
    if len(results) != len(op.outputs):
        results = [t for t in results if not t._is_zerotensor()]  # never registered
    if len(results) != len(op.outputs):
        raise MemscaleError(
            f"memscale.dtr: re-running {info.label()} gave {len(results)} tensors, the original run {len(op.outputs)}"
        )
    for cell, t in zip(op.outputs, results):
        if not cell.pinned:
            cell.tensor = t
    return cost


def run_kernel(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Call ATen op ``func`` on real tensors as it would run outside a mode.

    Inside ``__torch_dispatch__`` PyTorch excludes the Conjugate, Negative
    and ZeroTensor keys (they were handled for the op the mode intercepted),
    so a kernel that makes lazily conjugated or negated views of its own (as
    ``linalg.pinv``'s ``Vh.mH()``), or reads a zero tensor, would compute
    something else. The kernel runs with those keys dispatched again, so a
    first run, a re-run and a run outside any mode agree bitwise.
    """
    exclude = _exclude_set()
    raw = exclude.raw_repr()
    restored = _RESTORED.get(raw, _UNKNOWN)
    if restored is _UNKNOWN:
        restored = _RESTORED[raw] = _restored(exclude)
    if restored is None:
        return func(*args, **kwargs)
    with _ForceGuard(_include_set(), restored):
        return func(*args, **kwargs)


#: Per exclude set (its raw bits; a handful of distinct ones in a process):
#: the set with the Conjugate, Negative and ZeroTensor keys removed, or
#: ``None`` when it excludes none of them.
_RESTORED: dict[int, Any] = {}
_UNKNOWN: Final = object()


def _restored(exclude: Any) -> Any:
    if not exclude.has(_CONJUGATE) and not exclude.has(_NEGATIVE) and not exclude.has(_ZERO):
        return None
    return exclude.remove(_CONJUGATE).remove(_NEGATIVE).remove(_ZERO)


def _rederive_view(op: RecordedOp) -> int:
    source = op.inputs[0].tensor
    assert source is not None
    t0 = perf_ns()
    op.outputs[0].tensor = storage_view(source.untyped_storage(), op.args)
    return perf_ns() - t0


def _replace_with_clone(args: list[Any], kwargs: dict[str, Any], key: Any) -> None:
    """An argument the op writes that must not be written again: a clone."""
    if isinstance(key, int):
        if key < len(args) and isinstance(args[key], _Tensor):
            args[key] = args[key].clone()
    elif isinstance(kwargs.get(key), _Tensor):
        kwargs[key] = kwargs[key].clone()


def _all_tensors(out: Any) -> list[_Tensor]:
    flat: list[_Tensor] = []
    flatten_tensors(out, flat)
    return flat


def _fresh_results(out: Any, info: OpInfo) -> list[_Tensor]:
    """The fresh results of a mutating op (its mutated returns skipped)."""
    outs = [out] if isinstance(out, _Tensor) else list(out)
    return [o for o, source in zip(outs, info.returns_arg) if source is None and isinstance(o, _Tensor)]


def copy_storage_of(t: _Tensor) -> _Tensor:
    """A copy of ``t``'s whole storage, viewed with ``t``'s geometry."""
    storage = t.untyped_storage()
    new = torch.UntypedStorage(storage.nbytes(), device=storage.device)
    new.copy_(storage)
    return storage_view(new, geometry(t))


def generator_for(args: Any, kwargs: dict[str, Any]) -> Any:
    """The generator a seeded op will draw from (its ``generator`` argument, or
    the default generator of its device)."""
    generator = kwargs.get("generator")
    if generator is not None:
        return generator
    device: Any = kwargs.get("device")
    if device is None:
        for a in args:
            if isinstance(a, _Tensor):
                device = a.device
                break
    if device is None:
        device = torch.get_default_device()
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


def rng_state_for(info: OpInfo, args: Any, kwargs: dict[str, Any]) -> tuple[Any, _Tensor] | None:
    """``(generator, state)`` to record before a seeded op runs; ``None`` otherwise."""
    if not info.seeded:
        return None
    generator = generator_for(args, kwargs)
    return generator, generator.get_state()
