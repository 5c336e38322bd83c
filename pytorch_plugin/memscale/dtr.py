"""Dynamic Tensor Rematerialization region: ``with memscale.dtr(budget=...): ...``.

Inside the region every ATen op goes through a ``TorchDispatchMode``. Its outputs
are returned as :class:`DTRTensor` wrappers (``_make_wrapper_subclass``): a wrapper
holds no storage of its own, only a *cell* with the engine's tensor id and the real
tensor, or ``None`` once the engine evicted it. An evicted tensor can therefore
never be read by accident: the next op that needs it asks the engine for a plan and
rebuilds it first. Python makes no eviction decision; the Go engine
(``memscale_dtr_*``, see :mod:`memscale._engine`) chooses victims and plans, Python
reports ops and references and carries out drops, swaps and re-runs.

Design, in the order an op meets it:

* **Inputs.** A wrapper input brings its cell. A plain tensor input (parameter,
  buffer, data, a tensor made outside the region) is registered once per entry as
  an *external*, pinned tensor (``memscale_dtr_tensor(pinned=1)``); a second
  external sharing a registered storage is registered as an alias of it. The cell
  holds an alias of the user's tensor and a weak reference to it: when the program
  drops a plain tensor, the engine is told like for any other reference.
* **Residency.** Inputs that are evicted are rebuilt from the engine's plan
  (``memscale_dtr_plan``, which also holds the inputs of the step about to run,
  and only those): each step re-runs a recorded op (its ``func``, its arguments
  with the input *cells* in place of tensors, its RNG state) or copies a swapped
  storage back. The op's inputs are locked while the others are rebuilt; a
  step's outputs stay locked until the next step, when it reads them, ran; an
  input the budget loop took since the plan was made is rebuilt by a plan of its
  own (DTR's recursion). A multi-output op re-run for one output also re-makes
  the outputs the program already dropped; the engine hands those copies out to
  be freed with the next evictions.
* **Room before allocation.** Under a budget, before an op (or a re-run, or a
  swap-in, or registering an external) runs, its inputs are locked and the budget
  loop makes room for the bytes it is about to allocate (for an op: the size of
  its fresh outputs, predicted once per argument signature by running the op on
  ``meta`` tensors and corrected by every real run). The engine's usage therefore
  never goes above the budget.
* **Run and register.** The op runs on the real tensors; its cost is measured
  (``time.perf_counter_ns`` on the CPU; on CUDA the launch time or, once known, the
  device time of the same op read lazily from CUDA events). ``memscale_dtr_call``
  registers it; an output that shares the storage of an input (known from the
  schema for view ops, else detected by storage pointer, which also catches
  ``_unsafe_view`` and ``lift_fresh``) is registered as an alias (``out_alias``).
* **Evictions.** ``memscale_dtr_evict`` returns storages (roots) to drop or swap:
  budget victims and storages the engine freed because their last reference went.
  Python drops the data of every cell of a dropped storage, or copies the storage
  to host memory first for a swap.
* **In-place ops** (schema ``is_mutable``) run in place, as in eager mode, and
  create new versions (``memscale_dtr_mutate``; the engine lets the new version
  take over the old memory and counts the old one evicted): the wrapper moves to
  the new version's cell, and every other live alias of the mutated storage is
  re-registered on top of the new version, because it now sees the new data. The
  old version stays *recomputable* from its own lineage, and a replay of the
  in-place op works on a copy of the old version's storage, so a rebuilt old
  version is never clobbered. In-place ops on externals (an optimizer step,
  BatchNorm's ``num_batches_tracked``) mutate the user's tensor; the new version
  inherits the pin. Ops that write running statistics without declaring it
  (``native_batch_norm``) are replayed on scratch copies of those statistics, so a
  rematerialization never updates them twice.
* **RNG ops** (``Tag.nondeterministic_seeded``: dropout's ``bernoulli_``,
  ``rand*``, ``normal``...) record the generator state before they run and replay
  under that state, so a rebuilt dropout mask is bitwise the original one. They
  are therefore recomputable like any other op (no ``NO_RECOMPUTE``).
* **Gradients.** A post-accumulate-grad hook on every parameter seen in the region
  pins its ``.grad`` once accumulated: a gradient outlives the step, and evicting
  it would mean re-running the backward pass that produced it.
* **Releases.** When a wrapper is garbage-collected (a weakref callback) its cell
  is queued and released (``memscale_dtr_release``) at the start of the next op;
  the engine evicts or frees the storage when that was its last reference.
* **Exit.** Wrappers still referenced (results, autograd's saved tensors, ``.grad``
  of parameters) are made resident and *detached*: outside a region a wrapper
  behaves as its plain tensor (ops on it return plain tensors), and the ``.grad``
  of every parameter seen in the region is replaced by the plain tensor, so an
  optimizer step after the region works on ordinary tensors. The engine instance
  is destroyed; its counters accumulate into :meth:`DTRRegion.summary`.
* **Tuning.** A budgeted region with no heuristic given (argument or
  ``MEMSCALE_HEURISTIC``) creates its engines with ``"heuristic": "auto"``: the
  engine scores with its default heuristic and records the step. When such an
  entry ends without an exception, the engine replays the recording under the
  budget with every candidate configuration (``memscale_dtr_tune``, before the
  instance is destroyed); its ``config`` is merged into the configuration of
  every later entry, which therefore runs the engine's choice and records
  nothing. Python only carries the choice forward. A changed budget forgets it;
  a failed tuning is logged and later entries use the default heuristic.

Usage is counted by the engine: on the CPU (and whenever the memscale allocator is
not installed) as the sum of resident registered bytes (``"usage": "engine"``); on
CUDA with the allocator installed, as the allocator's allocated bytes
(``"usage": "allocator"``). Storages under :data:`DEFAULT_EVICTEE_MIN_SIZE` bytes
are never evicted unless told otherwise.

Known limits: in-place ops that change a tensor's shape (``t_``, ``squeeze_``,
``resize_``, ``set_``...) are refused on region tensors; sparse results are
refused; a tensor computed from the old value of an external that was later
mutated in place inside the same region cannot be rebuilt if it was evicted (the
engine's plan says so); a plain tensor taken out with :meth:`DTRRegion.unwrap` and
fed back into the region's ops is a new external (counted again, pinned while
referenced); on CUDA an op's cost is approximate (see above).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from . import _engine
from ._engine import ACTION_SWAP, NO_RECOMPUTE, STEP_SWAP_IN
from .config import check_heuristic, parse_size
from .errors import ConfigError, MemscaleError

__all__ = [
    "DEFAULT_EVICTEE_MIN_SIZE",
    "DEFAULT_HEURISTIC",
    "DTRRegion",
    "DTRTensor",
    "EvictedTensorError",
    "dtr",
    "unwrap",
]

log = logging.getLogger("memscale")

_Tensor = torch.Tensor
_mk_wrapper = torch.Tensor._make_wrapper_subclass
_perf_ns = time.perf_counter_ns
_aten = torch.ops.aten

#: Storages smaller than this are never evicted unless ``evictee_min_size`` or
#: ``MEMSCALE_EVICTEE_MIN_SIZE`` says otherwise: evicting a scalar (a loss) saves
#: nothing and can cost a re-run of everything it was computed from.
DEFAULT_EVICTEE_MIN_SIZE: Final[int] = 1024

#: The heuristic of a budgeted region when neither ``heuristic`` nor
#: ``MEMSCALE_HEURISTIC`` names one: the engine's tuning policy. Such an entry
#: scores with the engine's default heuristic and records its program; at exit
#: the engine replays the recording with every candidate configuration
#: (``memscale_dtr_tune``) and later entries run the configuration it chose.
DEFAULT_HEURISTIC: Final[str] = "auto"

#: What later entries run when tuning failed: the engine's default heuristic,
#: not recording (tuning is not retried every step).
_UNTUNED: Final[dict[str, Any]] = {"heuristic": "default"}

#: Keys of a tuning report kept in :meth:`DTRRegion.summary`'s ``"tuning"``.
_TUNING_KEYS: Final[tuple[str, ...]] = (
    "choice",
    "feasible",
    "overhead",
    "default_overhead",
    "wall_ns",
    "instructions",
    "config",
)

#: Tests set this: every op then checks that Python's mirror of the engine's usage
#: (used to skip making room when there is room) equals the engine's.
CHECK_USAGE: bool = False

#: Kinds of recorded ops (how a replay runs them).
_K_CALL: Final[int] = 0  # re-run func; outputs map to the op's output cells
_K_MUTATE: Final[int] = 1  # re-run an in-place op on a copy of the old version
_K_ALIAS: Final[int] = 2  # re-derive a view of a storage from its geometry

#: Ops that write running statistics into arguments their schema does not mark
#: as mutable: argument positions replayed on scratch copies.
_UNDECLARED_STATE_WRITES: Final[dict[str, tuple[int, ...]]] = {
    "native_batch_norm": (3, 4),
    "cudnn_batch_norm": (3, 4),
    "miopen_batch_norm": (3, 4),
    "_batch_norm_impl_index": (3, 4),
}

#: Namespaces whose ops are never re-run (collectives and other side effects).
_UNREPLAYABLE_NAMESPACES: Final[frozenset[str]] = frozenset({"c10d", "_c10d_functional", "c10d_functional"})

#: Trace/engine names of ops that only make a new reference to the same data.
_REFERENCE_OPS: Final[frozenset[str]] = frozenset({"detach", "alias", "lift_fresh"})


class EvictedTensorError(MemscaleError):
    """A tensor of a DTR region was used after the region lost its data.

    Only happens after a region exited with an error while the tensor was evicted
    (a region that exits normally makes every tensor that escapes it resident).
    """


# --------------------------------------------------------------------------- cells


class _Cell:
    """One version of one tensor: engine id, real tensor (``None`` = not here).

    Attributes:
        tid: the engine's tensor id (``-1`` once detached from its region).
        t: the real tensor, or ``None`` while evicted / not rebuilt.
        root: id of the storage root (key of the region's storage groups).
        op: id of the recorded op that produces this version (``-1``: external).
        w: weak reference of the wrapper that currently names this version.
        e: the region entry the cell belongs to (``None``: detached).
        rel: released to the engine (no wrapper names it any more).
        pin: never evicted, never re-run (externals and their new versions).
    """

    __slots__ = ("tid", "t", "root", "op", "w", "e", "rel", "pin")

    def __init__(self, tid: int, t: _Tensor | None, root: int, op: int, e: _Entry | None, pin: bool = False) -> None:
        self.tid = tid
        self.t = t
        self.root = root
        self.op = op
        self.w: _WRef | None = None
        self.e = e
        self.rel = False
        self.pin = pin

    def __repr__(self) -> str:
        state = "resident" if self.t is not None else "evicted"
        return f"<cell {self.tid} root={self.root} op={self.op} {state}{' released' if self.rel else ''}>"


class _WRef(weakref.ref):  # type: ignore[type-arg]
    """Weak reference to a wrapper that knows the wrapper's current cell."""

    __slots__ = ("cell",)


class _Group:
    """The cells sharing one storage (engine storage root), plus swap state.

    ``res`` mirrors the engine's residency of the storage (its bytes count in
    the engine's usage).
    """

    __slots__ = ("cells", "live", "nbytes", "host", "geo", "res")

    def __init__(self, cell: _Cell, nbytes: int) -> None:
        self.cells: set[_Cell] = {cell}
        self.live = 1
        self.res = True
        self.nbytes = nbytes
        self.host: Any = None  # UntypedStorage on the host while swapped out
        self.geo: dict[_Cell, tuple[torch.dtype, tuple[int, ...], tuple[int, ...], int]] | None = None


class _Op:
    """A recorded op: enough to re-run it on the current data of its inputs."""

    __slots__ = ("func", "args", "kwargs", "ins", "outs", "rng", "kind", "mut", "scratch")

    def __init__(
        self,
        func: Any,
        args: Any,
        kwargs: dict[str, Any] | None,
        ins: list[_Cell],
        outs: list[_Cell],
        rng: tuple[Any, _Tensor] | None,
        kind: int,
        mut: tuple[int, ...] = (),
        scratch: tuple[Any, ...] = (),
    ) -> None:
        self.func = func
        self.args = args  # list with cells in place of tensors (lists of cells for Tensor[])
        self.kwargs = kwargs
        self.ins = ins  # input cells in flattened order
        self.outs = outs  # output cells (new versions for _K_MUTATE)
        self.rng = rng  # (generator, state) for seeded ops
        self.kind = kind
        self.mut = mut  # _K_MUTATE: flattened input indices that are mutated
        self.scratch = scratch  # argument positions/names replayed on copies


class _Info:
    """What the region needs to know about one ATen overload (cached)."""

    __slots__ = (
        "name",
        "tpos",
        "tkw",
        "mutable",
        "mutpos",
        "rets",
        "rng",
        "flags",
        "stw",
        "inplace_view",
        "views",
        "view0",
        "factory",
    )

    def __init__(self, func: Any, recompute: bool) -> None:
        schema = func._schema
        base = func._opname
        overload = func._overloadname
        self.name: bytes = (base if overload == "default" else f"{base}.{overload}").encode()
        tpos: list[tuple[int, bool]] = []
        tkw: list[tuple[str, bool]] = []
        mutpos: list[int | str] = []
        alias_of: dict[str, int | str] = {}
        for i, arg in enumerate(schema.arguments):
            kind = _tensor_kind(arg.type)
            if kind is None:
                continue
            key: int | str = arg.name if arg.kwarg_only else i
            if arg.kwarg_only:
                tkw.append((arg.name, kind))
            else:
                tpos.append((i, kind))
            info = arg.alias_info
            if info is not None:
                if info.is_write:
                    mutpos.append(key)
                for s in info.before_set:
                    alias_of.setdefault(s, key)
        self.tpos: tuple[tuple[int, bool], ...] = tuple(tpos)
        self.tkw: tuple[tuple[str, bool], ...] = tuple(tkw)
        self.mutable: bool = bool(schema.is_mutable) and bool(mutpos)
        self.mutpos: frozenset[int | str] = frozenset(mutpos)
        # For each return: the argument (position or kwarg name) it is, when it
        # is written in place (``add_`` returns ``self``), else None.
        rets: list[int | str | None] = []
        for ret in schema.returns:
            ai = ret.alias_info
            src = None
            if ai is not None and ai.is_write:
                for s in ai.before_set:
                    if s in alias_of:
                        src = alias_of[s]
                        break
            rets.append(src)
        self.rets: tuple[int | str | None, ...] = tuple(rets)
        # Every result is a view of an argument: the op allocates nothing.
        self.views: bool = bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)
        # ... and all of the first argument (``view``, ``t``, ``split``...): the
        # alias is known without comparing storages.
        first = schema.arguments[0] if schema.arguments else None
        first_sets = (
            set(first.alias_info.before_set)
            if first is not None and first.alias_info is not None and not first.alias_info.is_write
            else set()
        )
        self.view0: bool = self.views and bool(first_sets) and all(
            set(r.alias_info.before_set) <= first_sets and not r.alias_info.is_write for r in schema.returns
        )
        self.factory: bool = any(a.name == "device" for a in schema.arguments)
        tags = func.tags
        self.rng: bool = torch.Tag.nondeterministic_seeded in tags
        self.inplace_view: bool = torch.Tag.inplace_view in tags
        self.stw: tuple[int, ...] = _UNDECLARED_STATE_WRITES.get(base, ())
        unreplayable = func.namespace in _UNREPLAYABLE_NAMESPACES
        self.flags: int = NO_RECOMPUTE if (unreplayable or not recompute) else 0


def _tensor_kind(t: Any) -> bool | None:
    """``False`` for Tensor / Tensor?, ``True`` for Tensor[] / Tensor?[], else None."""
    k = t.kind()
    if k == "OptionalType":
        t = t.getElementType()
        k = t.kind()
    if k == "TensorType":
        return False
    if k == "ListType":
        el = t.getElementType()
        if el.kind() == "OptionalType":
            el = el.getElementType()
        if el.kind() == "TensorType":
            return True
    return None


# ----------------------------------------------------------------------- wrapper


class DTRTensor(torch.Tensor):
    """A tensor of a DTR region: metadata only, data held by the region.

    Inside its region, ops on it go through the region (which rebuilds it when it
    was evicted). After the region exited, it behaves as the plain tensor it was
    materialized to: ops on it run on that tensor and return plain tensors. Use
    :meth:`DTRRegion.unwrap` (or :func:`unwrap`) to get the plain tensor itself.
    """

    _c: _Cell

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @staticmethod
    def __new__(cls, *args: Any, **kwargs: Any) -> DTRTensor:  # noqa: D102
        raise TypeError("DTRTensor is created by memscale.dtr regions, not directly (use DTRRegion.wrap)")

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return _dispatch_outside(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        c = self._c
        if c.t is None:
            where = "evicted" if c.e is not None else "lost"
            return f"DTRTensor({where}, size={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"
        with _disable_current_modes():
            return f"DTRTensor({c.t!r})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_identity, (unwrap(self),))

    def __deepcopy__(self, memo: dict[int, Any]) -> _Tensor:
        with _disable_current_modes():
            return _plain_of(self).clone()

    def tolist(self) -> Any:  # noqa: D102 - as torch.Tensor.tolist (subclasses lack it)
        with _disable_current_modes():
            return _plain_of(self).tolist()

    def numpy(self, *, force: bool = False) -> Any:  # noqa: D102 - as torch.Tensor.numpy
        with _disable_current_modes():
            return _plain_of(self).numpy(force=force)


def _identity(x: Any) -> Any:
    return x


def _plain_of(x: DTRTensor) -> _Tensor:
    c = x._c
    t = c.t
    if t is None:
        e = c.e
        if e is not None and not e.closed:
            # Called from user code while the region's mode may be active:
            # replays must reach the kernels, not the region.
            with _disable_current_modes():
                e.materialize(c)
                e.unlock_cell(c)
                if e.dirty:
                    e.evict()
            t = c.t
        if t is None:
            raise EvictedTensorError(
                f"tensor of shape {tuple(x.shape)} was evicted inside a memscale.dtr region that "
                "exited with an error; its data cannot be rebuilt"
            )
    return t


def unwrap(x: Any) -> Any:
    """The plain tensor behind a :class:`DTRTensor` (rebuilt if needed); else ``x``."""
    if type(x) is DTRTensor:
        return _plain_of(x)
    return x


def _unwrap_tree(x: Any) -> Any:
    if type(x) is DTRTensor:
        return _plain_of(x)
    if type(x) in (list, tuple):
        return type(x)(_unwrap_tree(y) for y in x)
    if type(x) is dict:
        return {k: _unwrap_tree(v) for k, v in x.items()}
    return x


def _find_entry(x: Any) -> _Entry | None:
    if type(x) is DTRTensor:
        e = x._c.e
        if e is not None and not e.closed:
            return e
    elif type(x) in (list, tuple):
        for y in x:
            e = _find_entry(y)
            if e is not None:
                return e
    return None


def _dispatch_outside(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """An op on wrappers with no region mode active on this thread."""
    for a in (*args, *kwargs.values()):
        e = _find_entry(a)
        if e is not None:  # e.g. an autograd worker thread without the mode
            return e.dispatch(func, args, kwargs)
    with _disable_current_modes():
        return func(*_unwrap_tree(list(args)), **_unwrap_tree(kwargs))


# ----------------------------------------------------------------------- helpers

#: (op, argument signature) -> bytes of fresh outputs, learned from meta runs
#: and corrected by every real run: what an op will allocate, so the budget loop
#: can make room before it runs.
_SIZE_CACHE: dict[Any, int] = {}
_SIZE_CACHE_MAX: Final[int] = 1 << 16


def _sig(x: Any) -> Any:
    if isinstance(x, _Tensor):
        return (x.shape, x.dtype)
    t = type(x)
    if t is list or t is tuple:
        return tuple([_sig(y) for y in x])
    return x


def _to_meta(x: Any) -> Any:
    if isinstance(x, _Tensor):
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="meta")
    if type(x) in (list, tuple):
        return type(x)(_to_meta(y) for y in x)
    return x


def _predict_bytes(func: Any, info: _Info, rargs: list[Any], rkw: dict[str, Any]) -> tuple[Any, int]:
    """``(cache key, bytes)``: the fresh bytes ``func`` is expected to allocate."""
    try:
        key = (func, _sig(rargs), tuple([(k, _sig(v)) for k, v in rkw.items()]) if rkw else None)
        v = _SIZE_CACHE.get(key)
    except TypeError:  # an unhashable argument
        return None, 0
    if v is not None:
        return key, v
    try:
        margs = _to_meta(rargs)
        mkw = {k: _to_meta(x) for k, x in rkw.items()}
        if info.factory:
            mkw["device"] = "meta"
        out = func(*margs, **mkw)
        flat: list[_Tensor] = []
        _flatten(out, flat)
        v = sum(o.untyped_storage().nbytes() for o in flat)
    except Exception:  # no meta kernel, data-dependent shape: learn from the real run
        v = 0
    if len(_SIZE_CACHE) >= _SIZE_CACHE_MAX:  # scalar arguments that change every call
        _SIZE_CACHE.clear()
    _SIZE_CACHE[key] = v
    return key, v


def _flatten(out: Any, acc: list[_Tensor]) -> None:
    if isinstance(out, _Tensor):
        acc.append(out)
    elif type(out) in (tuple, list):
        for x in out:
            _flatten(x, acc)


def _rebuild(out: Any, it: Any) -> Any:
    if isinstance(out, _Tensor):
        return next(it)
    if type(out) in (tuple, list):
        return type(out)(_rebuild(x, it) for x in out)
    return out


def _storage_view(st: Any, dtype: torch.dtype, size: Any, stride: Any, offset: int) -> _Tensor:
    return torch.empty(0, dtype=dtype, device=st.device).set_(st, offset, size, stride)


def _copy_like(t: _Tensor) -> _Tensor:
    """A copy of ``t``'s whole storage, viewed with ``t``'s geometry."""
    st = t.untyped_storage()
    new = torch.UntypedStorage(st.nbytes(), device=st.device)
    new.copy_(st)
    return _storage_view(new, t.dtype, t.size(), t.stride(), t.storage_offset())


def _generator_for(args: Any, kwargs: dict[str, Any]) -> Any:
    gen = kwargs.get("generator")
    if gen is not None:
        return gen
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


class _CudaTimer:
    """Approximate device time per op from CUDA events, read without syncing.

    The engine wants the cost when the op is registered, before its events
    completed, so the cost of an op is the device time last measured for the same
    (op, output size), or the host launch time when none is known yet.
    """

    def __init__(self) -> None:
        self.cache: dict[tuple[Any, int], int] = {}
        self.pending: deque[tuple[tuple[Any, int], Any, Any]] = deque()
        self.free: list[Any] = []

    def event(self) -> Any:
        if self.free:
            return self.free.pop()
        return torch.cuda.Event(enable_timing=True)

    def start(self) -> Any:
        ev = self.event()
        ev.record()
        return ev

    def stop(self, key: tuple[Any, int], start: Any, host_ns: int) -> int:
        end = self.event()
        end.record()
        pending = self.pending
        pending.append((key, start, end))
        while pending and pending[0][2].query():
            k, s, e = pending.popleft()
            self.cache[k] = int(s.elapsed_time(e) * 1e6)
            self.free += (s, e)
        if len(pending) > 256:
            _, s, e = pending.popleft()
            self.free += (s, e)
        return max(host_ns, self.cache.get(key, 0))


# ------------------------------------------------------------------------- entry


class _Entry:
    """State of one entry of a region: engine instance, cells, recorded ops."""

    def __init__(self, region: DTRRegion, config: dict[str, Any], sink: Any) -> None:
        self.region = region
        self.config = config
        self.eng = _engine.Engine(config)
        # The engine records this entry's program for memscale_dtr_tune.
        self.tunes = config.get("heuristic") == DEFAULT_HEURISTIC
        self.tuning: dict[str, Any] | None = None  # the engine's report
        self.tune_error: str | None = None
        fn = self.eng.fn
        self.h = self.eng.handle
        self.f_call = fn.call
        self.f_mutate = fn.mutate
        self.f_evict = fn.evict
        self.f_release = fn.release
        self.f_tensor = fn.tensor
        self.f_lock = fn.lock
        self.f_unlock = fn.unlock
        self.f_plan = fn.plan
        self.f_remat = fn.rematerialized
        self.f_pin = fn.pin
        self.f_swapped_in = fn.swapped_in
        self.budgeted = bool(config.get("budget"))
        self.record = region._recompute  # recorded ops are only needed to re-run them
        self.recompute = region._recompute
        self.sink = sink
        self.closed = False
        self.infos: dict[Any, _Info] = region._infos
        self.ops: dict[int, _Op] = {}
        self.groups: dict[int, _Group] = {}
        self.ext: dict[int, _WRef] = {}  # id(plain tensor) -> weakref naming its cell
        self.ext_storage: dict[int, _Cell] = {}  # storage data_ptr -> external root cell
        self.leaves: list[weakref.ref[_Tensor]] = []  # externals that are autograd leaves
        self.hooks: list[Any] = []  # their post-accumulate-grad hook handles
        self.pinned: set[_Cell] = set()  # gradients pinned by the hook
        self.live: dict[int, _WRef] = {}  # id(weakref) -> weakref of a live wrapper
        self.pending: list[_Cell] = []
        self.bytes_evicted = 0
        self.dirty = False
        self.fresh = 0
        self.ext_new = 0  # externals registered under a budget (residency re-check)
        self.undrained = 0  # unbudgeted: storages freed since the last evict call
        # The engine's usage, mirrored from what it is told and answers (exact
        # for "usage": "engine"): only to skip making room when there is room.
        self.mirror = 0
        self.mirrored = config.get("usage") == "engine"
        self.budget = int(config.get("budget") or 0)
        self.cuda_timer: _CudaTimer | None = None
        cap = 64
        self.cap = cap
        self.b_in = (_engine._i64 * cap)()
        self.b_size = (_engine._i64 * cap)()
        self.b_alias = (_engine._i32 * cap)()
        self.b_out = (_engine._i64 * cap)()
        self.b_mut = (_engine._i32 * cap)()
        self.ecap = 256
        self.b_eids = (_engine._i64 * self.ecap)()
        self.b_eacts = (_engine._i32 * self.ecap)()
        self.pcap = 1024
        self.b_pk = (_engine._i32 * self.pcap)()
        self.b_pi = (_engine._i64 * self.pcap)()
        self.dead: Callable[[_WRef], None] = self._dead
        if self.mirrored and CHECK_USAGE:
            self.dispatch = self._checked_dispatch  # type: ignore[method-assign]

    def _checked_dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """:data:`CHECK_USAGE`: after every op, Python's view of the engine's usage
        must be the engine's (a debugging aid for tests; slow)."""
        out = _Entry.dispatch(self, func, args, kwargs)
        usage = int(self.eng.stats()["usage"])
        if usage != self.mirror:
            raise MemscaleError(f"memscale.dtr: after {func}: engine usage {usage} != mirrored {self.mirror}")
        return out

    # ---------------------------------------------------------------- errors

    def _fail(self, what: str) -> MemscaleError:
        msg = _engine.last_error() or "no error message recorded"
        return MemscaleError(f"memscale.dtr: {what}: {msg}")

    def _grow(self, n: int) -> None:
        cap = self.cap
        while cap < n:
            cap *= 2
        self.cap = cap
        self.b_in = (_engine._i64 * cap)()
        self.b_size = (_engine._i64 * cap)()
        self.b_alias = (_engine._i32 * cap)()
        self.b_out = (_engine._i64 * cap)()
        self.b_mut = (_engine._i32 * cap)()

    # -------------------------------------------------------------- releases

    def _dead(self, wr: _WRef) -> None:
        # Weakref callback: may run at any point (any thread); only queue.
        self.live.pop(id(wr), None)
        c = wr.cell
        if c is not None and not self.closed:
            self.pending.append(c)

    def flush(self) -> None:
        """Release the cells whose wrappers died since the last op."""
        while self.pending:
            pend, self.pending = self.pending, []
            h = self.h
            sink = self.sink
            groups = self.groups
            for c in pend:
                if c.rel or c.e is not self:
                    continue
                self._release(c, h, groups)
                if sink is not None:
                    sink.release(c)
        if self.dirty:
            # Storages freed by those releases: drop their data now, before
            # anything reads a cell the engine no longer holds resident.
            self.evict()

    def _release(self, c: _Cell, h: int, groups: dict[int, _Group]) -> None:
        c.rel = True
        c.w = None
        if self.f_release(h, c.tid) < 0:
            raise self._fail(f"release of tensor {c.tid}")
        g = groups.get(c.root)
        if g is not None:
            g.live -= 1
        if self.budgeted or g is None:
            # The engine drops (or banishes) a storage whose last reference
            # went and hands it out as a victim of the next evict call.
            self.dirty = True
        elif g.live <= 0:
            # Without a budget the engine frees a storage as soon as its last
            # reference goes (nothing can be evicted, so nothing needs its
            # lineage): drop it now and drain the engine's victim queue
            # (dropped already) only now and then.
            for x in g.cells:
                x.t = None
            g.host = None
            if g.res:
                g.res = False
                self.mirror -= g.nbytes
            self.undrained += 1
            if self.undrained >= 256:
                self.undrained = 0
                self.dirty = True

    # ------------------------------------------------------------- externals

    def extern(self, t: _Tensor) -> _Cell:
        """The cell of a plain tensor (registered pinned on first sight).

        The cell holds an alias of ``t`` (same storage), not ``t`` itself, and
        a weak reference to ``t``: when the program drops ``t`` the engine is
        told (``release``), so a temporary plain tensor used in the region is
        freed like any other once nothing needs it.
        """
        wr = self.ext.get(id(t))
        if wr is not None and wr() is t and wr.cell is not None:
            return wr.cell
        if type(t) is DTRTensor:  # a wrapper detached from an earlier entry
            return self.extern(_plain_of(t))
        st = t.untyped_storage()
        ptr = st.data_ptr()
        nbytes = st.nbytes()
        root = self.ext_storage.get(ptr) if ptr else None
        alias = t.detach()
        if root is not None and root.t is not None and not root.rel:
            # Same storage as an external already registered: an alias of it.
            self.b_in[0] = root.tid
            self.b_size[0] = t.nbytes
            self.b_alias[0] = 0
            op = self.f_call(self.h, b"alias", self.b_in, 1, self.b_size, self.b_alias, 1, 0, NO_RECOMPUTE, self.b_out)
            if op < 0:
                raise self._fail("registering an external alias")
            c = _Cell(int(self.b_out[0]), alias, root.root, -1, self, pin=True)
            g = self.groups[root.root]
            g.cells.add(c)
            g.live += 1
            if self.sink is not None:
                self.sink.call(b"alias", [root], [c], [t.nbytes], [0], 0)
        else:
            if self.budgeted and nbytes:
                # Room first, so registering never takes usage over budget
                # (the caller re-checks the residency of the op's other inputs).
                self.reserve(nbytes, b"an external tensor")
                self.ext_new += 1
            tid = self.f_tensor(self.h, nbytes, 1)
            if tid < 0:
                raise self._fail(f"registering an external tensor of {nbytes} bytes")
            c = _Cell(int(tid), alias, int(tid), -1, self, pin=True)
            self.groups[c.tid] = _Group(c, nbytes)
            self.mirror += nbytes
            if ptr:
                self.ext_storage[ptr] = c
            if self.sink is not None:
                self.sink.external(c, nbytes)
        wr = _WRef(t, self.dead)
        wr.cell = c
        c.w = wr
        self.ext[id(t)] = wr
        if t.requires_grad and t.is_leaf:
            self.leaves.append(weakref.ref(t))
            self.hooks.append(t.register_post_accumulate_grad_hook(self._grad_hook))
        return c

    def _grad_hook(self, p: _Tensor) -> None:
        """A parameter's ``.grad`` was accumulated: pin it for this entry.

        Gradients outlive the step and are read by the optimizer; evicting one
        would mean re-running the backward pass that produced it.
        """
        g = p.grad
        if type(g) is not DTRTensor or self.closed:
            return
        c = g._c
        if c.e is not self or c in self.pinned:
            return
        if c.t is None:
            with _disable_current_modes():
                self.materialize(c)
                try:
                    rc = self.f_pin(self.h, c.tid)
                finally:
                    self.unlock_cell(c)
        else:
            rc = self.f_pin(self.h, c.tid)
        if rc < 0:
            raise self._fail(f"pin of gradient tensor {c.tid}")
        self.pinned.add(c)

    # ---------------------------------------------------------------- inputs

    def _cell(self, x: Any) -> _Cell | None:
        """The cell of an argument; ``None`` for a non-tensor (a wrapped scalar)."""
        if type(x) is DTRTensor:
            c = x._c
            if c.e is self:
                return c
            return self.extern(_plain_of(x))
        if isinstance(x, _Tensor):
            return self.extern(x)
        return None

    def _collect(
        self, info: _Info, args: Any, kwargs: dict[str, Any]
    ) -> tuple[list[_Cell], list[Any], list[Any], dict[str, Any], dict[str, Any], list[Any], bool]:
        """Input cells (flattened), real args, template args, and keys.

        The template is the argument list with each tensor replaced by its cell
        (what a replay substitutes the then-current tensors into); ``keys``
        gives the position or keyword of each flattened input.
        """
        ins: list[_Cell] = []
        keys: list[Any] = []
        rargs = list(args)
        targs = list(args)
        missing = False
        n = len(args)
        cell_of = self._cell
        for pos, islist in info.tpos:
            if pos >= n:
                break
            a = args[pos]
            if a is None:
                continue
            if islist:
                rl: list[Any] = []
                tl: list[Any] = []
                for x in a:
                    c = None if x is None else cell_of(x)
                    if c is None:
                        rl.append(x)
                        tl.append(x)
                        continue
                    t = c.t
                    if t is None:
                        missing = True
                    ins.append(c)
                    keys.append(pos)
                    rl.append(t)
                    tl.append(c)
                rargs[pos] = rl
                targs[pos] = tl
            else:
                c = cell_of(a)
                if c is None:
                    continue
                t = c.t
                if t is None:
                    missing = True
                ins.append(c)
                keys.append(pos)
                rargs[pos] = t
                targs[pos] = c
        rkw = kwargs
        tkw = kwargs
        if kwargs and info.tkw:
            rkw = dict(kwargs)
            tkw = dict(kwargs)
            for name, islist in info.tkw:
                a = kwargs.get(name)
                if a is None:
                    continue
                if islist:
                    tl = []
                    for x in a:
                        c = None if x is None else cell_of(x)
                        if c is None:
                            tl.append(x)
                            continue
                        ins.append(c)
                        keys.append(name)
                        if c.t is None:
                            missing = True
                        tl.append(c)
                    tkw[name] = tl
                    rkw[name] = [x.t if type(x) is _Cell else x for x in tl]
                else:
                    c = cell_of(a)
                    if c is None:
                        continue
                    if c.t is None:
                        missing = True
                    ins.append(c)
                    keys.append(name)
                    tkw[name] = c
                    rkw[name] = c.t
        return ins, rargs, targs, rkw, tkw, keys, missing

    def _lock_resident(self, cells: list[_Cell], locked: list[_Cell]) -> None:
        """Lock the resident cells, appending each to ``locked`` as it is locked
        (so a caller can unlock exactly those if a later lock fails)."""
        for c in cells:
            if c.t is not None:
                if self.f_lock(self.h, c.tid) < 0:
                    raise self._fail(f"lock of tensor {c.tid}")
                locked.append(c)

    def _make_resident(self, ins: list[_Cell]) -> list[_Cell]:
        """Rebuild evicted inputs; returns the cells locked (unlock after the op)."""
        h = self.h
        locked: list[_Cell] = []
        try:
            self._lock_resident(ins, locked)
            for c in ins:
                if c.t is None:
                    self.materialize(c)
                    locked.append(c)
        except BaseException:
            for c in locked:
                self.f_unlock(h, c.tid)
            self.dirty = True
            raise
        return locked

    def _lock_cells(self, cells: list[_Cell]) -> list[_Cell]:
        h = self.h
        lock = self.f_lock
        done: list[_Cell] = []
        for c in cells:
            if lock(h, c.tid) < 0:
                for d in done:
                    self.f_unlock(h, d.tid)
                raise self._fail(f"lock of tensor {c.tid}")
            done.append(c)
        return done

    def reserve(self, extra: int, what: bytes) -> None:
        """Evict until usage + ``extra`` fits the budget (before an allocation)."""
        b = self.budget
        if self.mirrored and self.mirror + extra <= b:
            return  # room already
        if extra >= b:
            raise MemscaleError(
                f"memscale.dtr: budget {b} bytes is too small: {what.decode()} alone needs {extra} "
                "bytes for its outputs"
            )
        eng = self.eng.fn
        if eng.set_budget(self.h, b - extra) < 0:
            raise self._fail("budget")
        try:
            self.evict(f"to make room for {extra} bytes of outputs of {what.decode()}")
        finally:
            eng.set_budget(self.h, b)

    def _unlock_all(self, cells: list[_Cell]) -> None:
        h = self.h
        # An unlock can make the engine drop an unreferenced storage: sync
        # (evict) before the next read of a cell.
        self.dirty = True
        for c in cells:
            if self.f_unlock(h, c.tid) < 0:
                raise self._fail(f"unlock of tensor {c.tid}")

    def unlock_cell(self, c: _Cell) -> None:
        """Undo the lock :meth:`materialize` leaves on ``c``."""
        self.dirty = True
        if self.f_unlock(self.h, c.tid) < 0:
            raise self._fail(f"unlock of tensor {c.tid}")

    @staticmethod
    def _refill(targs: list[Any], tkw: dict[str, Any], info: _Info) -> tuple[list[Any], dict[str, Any]]:
        """Real args from a template (cells -> their current tensors)."""
        rargs = list(targs)
        n = len(targs)
        for pos, islist in info.tpos:
            if pos >= n:
                break
            a = targs[pos]
            if islist:
                if a is not None:
                    rargs[pos] = [x.t if type(x) is _Cell else x for x in a]
            elif type(a) is _Cell:
                rargs[pos] = a.t
        rkw = tkw
        if tkw and info.tkw:
            rkw = dict(tkw)
            for name, islist in info.tkw:
                a = tkw.get(name)
                if islist:
                    if a is not None:
                        rkw[name] = [x.t if type(x) is _Cell else x for x in a]
                elif type(a) is _Cell:
                    rkw[name] = a.t
        return rargs, rkw

    # ------------------------------------------------------------- dispatch

    def dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """Run one ATen op inside the region (the mode's ``__torch_dispatch__``)."""
        if self.pending:
            self.flush()
        if self.dirty:
            self.evict()
        info = self.infos.get(func)
        if info is None:
            info = self.infos[func] = _Info(func, self.recompute)
        if info.mutable:
            return self._dispatch_mutating(func, info, args, kwargs)
        n_ext = self.ext_new
        ins, rargs, targs, rkw, tkw, _keys, missing = self._collect(info, args, kwargs)
        if n_ext != self.ext_new and not missing:
            missing = any(c.t is None for c in ins)
        locked = None
        if missing:
            locked = self._make_resident(ins)
            rargs, rkw = self._refill(targs, tkw, info)
        skey = None
        if self.budgeted and not info.views:
            # Make room for the outputs before they exist, so usage never goes
            # above the budget; the inputs are locked meanwhile.
            skey, extra = _predict_bytes(func, info, rargs, rkw)
            if extra and not (self.mirrored and self.mirror + extra <= self.budget):
                if locked is None:
                    locked = self._lock_cells(ins)
                try:
                    self.reserve(extra, info.name)
                except BaseException:
                    for c in locked:
                        self.f_unlock(self.h, c.tid)
                    self.dirty = True
                    raise
        try:
            return self._run(func, info, ins, rargs, rkw, targs, tkw, locked, skey)
        except BaseException:
            if locked is not None:
                # The op failed (in the kernel, or the budget): do not leave its
                # inputs locked for the rest of the entry.
                for c in locked:
                    self.f_unlock(self.h, c.tid)
                self.dirty = True
            raise

    def _run(
        self,
        func: Any,
        info: _Info,
        ins: list[_Cell],
        rargs: list[Any],
        rkw: dict[str, Any],
        targs: list[Any],
        tkw: dict[str, Any],
        locked: list[_Cell] | None,
        skey: Any,
    ) -> Any:
        """Run a non-mutating op on resident inputs, register it, wrap its outputs."""
        rng = None
        if info.rng:
            gen = _generator_for(rargs, rkw)
            rng = (gen, gen.get_state())
        timer = self.cuda_timer
        if timer is None:
            t0 = _perf_ns()
            out = func(*rargs, **rkw)
            cost = _perf_ns() - t0
        else:
            ev = timer.start()
            t0 = _perf_ns()
            out = func(*rargs, **rkw)
            cost = _perf_ns() - t0
        del rargs, rkw
        if isinstance(out, _Tensor):
            outs = [out]
        else:
            outs = []
            _flatten(out, outs)
            if not outs:
                if locked is not None:
                    cells_to_unlock, locked = locked, None
                    self._unlock_all(cells_to_unlock)
                return out
        if timer is None and outs[0].is_cuda:
            self.cuda_timer = timer = _CudaTimer()
        elif timer is not None:
            cost = timer.stop((func, outs[0].nbytes), ev, cost)
        cells = self._register(func, info, ins, outs, cost, info.flags)
        if skey is not None:
            _SIZE_CACHE[skey] = self.fresh
        if self.record:
            self.ops[cells[0].op] = _Op(func, targs, tkw, ins, cells, rng, _K_CALL, scratch=info.stw)
        if locked is not None:
            self._unlock_all(locked)
            locked.clear()  # unlocked: nothing for the caller's error path to undo
        wrappers = self._wrap_all(cells, outs)
        if self.budgeted or self.dirty:
            self.evict()
        if len(wrappers) == 1 and isinstance(out, _Tensor):
            return wrappers[0]
        return _rebuild(out, iter(wrappers))

    def _register(
        self, func: Any, info: _Info, ins: list[_Cell], outs: list[_Tensor], cost: int, flags: int
    ) -> list[_Cell]:
        """``memscale_dtr_call`` for an op that ran; returns the output cells."""
        n_in = len(ins)
        n_out = len(outs)
        if n_in > self.cap or n_out > self.cap:
            self._grow(max(n_in, n_out))
        b_in = self.b_in
        b_size = self.b_size
        b_alias = self.b_alias
        for j, c in enumerate(ins):
            b_in[j] = c.tid
        aliases: list[int] = []
        if info.view0 and n_in:
            # The schema says every result views the first argument.
            for i, o in enumerate(outs):
                aliases.append(0)
                b_alias[i] = 0
                b_size[i] = o.nbytes
        else:
            in_ptrs: list[int] | None = None
            for i, o in enumerate(outs):
                try:
                    st = o.untyped_storage()
                except (RuntimeError, NotImplementedError) as exc:
                    raise MemscaleError(
                        f"memscale.dtr: {info.name.decode()} returned a {o.layout} tensor; only strided "
                        f"(dense) tensors can live in a DTR region ({exc})"
                    ) from exc
                ptr = st.data_ptr()
                k = -1
                if ptr and n_in:
                    if in_ptrs is None:
                        in_ptrs = [c.t.untyped_storage().data_ptr() for c in ins]  # type: ignore[union-attr]
                    try:
                        k = in_ptrs.index(ptr)
                    except ValueError:
                        k = -1
                aliases.append(k)
                b_alias[i] = k
                b_size[i] = st.nbytes() if k < 0 else o.nbytes
        op = self.f_call(self.h, info.name, b_in, n_in, b_size, b_alias, n_out, cost, flags, self.b_out)
        if op < 0:
            raise self._fail(f"registering {info.name.decode()}")
        b_out = self.b_out
        groups = self.groups
        cells = []
        fresh = 0
        for i, o in enumerate(outs):
            tid = b_out[i]
            k = aliases[i]
            if k < 0:
                c = _Cell(tid, o, tid, op, self)
                groups[tid] = _Group(c, b_size[i])
                fresh += b_size[i]
            else:
                src = ins[k]
                root = src.root
                c = _Cell(tid, o, root, op, self, pin=src.pin)
                g = groups[root]
                g.cells.add(c)
                g.live += 1
            cells.append(c)
        self.fresh = fresh
        self.mirror += fresh
        if self.sink is not None:
            self.sink.call(info.name, ins, cells, list(b_size[:n_out]), aliases, cost)
        return cells

    def _wrap_all(self, cells: list[_Cell], outs: list[_Tensor]) -> list[DTRTensor]:
        dead = self.dead
        live = self.live
        ws = []
        for c, o in zip(cells, outs):
            w = _mk_wrapper(
                DTRTensor,
                o.size(),
                strides=o.stride(),
                storage_offset=o.storage_offset(),
                dtype=o.dtype,
                layout=o.layout,
                device=o.device,
                requires_grad=False,
            )
            w._c = c
            wr = _WRef(w, dead)
            wr.cell = c
            c.w = wr
            live[id(wr)] = wr
            ws.append(w)
        return ws

    # -------------------------------------------------------------- in-place

    def _dispatch_mutating(self, func: Any, info: _Info, args: Any, kwargs: dict[str, Any]) -> Any:
        n_ext = self.ext_new
        ins, rargs, targs, rkw, tkw, keys, missing = self._collect(info, args, kwargs)
        if n_ext != self.ext_new and not missing:
            missing = any(c.t is None for c in ins)
        mutpos = info.mutpos
        mut = [j for j, key in enumerate(keys) if key in mutpos]
        if info.inplace_view:
            for j in mut:
                if not ins[j].pin:
                    raise MemscaleError(
                        f"memscale.dtr: the in-place view op {info.name.decode()} (it changes a tensor's "
                        "shape in place) is not supported on tensors of a DTR region; use the "
                        "out-of-place variant"
                    )
        # Every live alias of a mutated storage sees the new data, so each must be
        # resident (views rebuilt) before the op runs.
        extra: list[_Cell] = []
        for j in mut:
            c = ins[j]
            g = self.groups.get(c.root)
            if g is not None and len(g.cells) > 1:
                for a in g.cells:
                    if a is not c and not a.rel and a.t is None and not a.pin:
                        extra.append(a)
        locked = None
        if missing or extra:
            locked = self._make_resident(ins + extra)
            rargs, rkw = self._refill(targs, tkw, info)
        try:
            return self._run_mutating(func, info, args, kwargs, ins, mut, rargs, rkw, targs, tkw, locked)
        except BaseException:
            if locked:
                for c in locked:
                    self.f_unlock(self.h, c.tid)
                self.dirty = True
            raise

    def _run_mutating(
        self,
        func: Any,
        info: _Info,
        args: Any,
        kwargs: dict[str, Any],
        ins: list[_Cell],
        mut: list[int],
        rargs: list[Any],
        rkw: dict[str, Any],
        targs: list[Any],
        tkw: dict[str, Any],
        locked: list[_Cell] | None,
    ) -> Any:
        """Run an in-place op on resident inputs, register the new versions."""
        mutpos = info.mutpos
        rng = None
        if info.rng:
            gen = _generator_for(rargs, rkw)
            rng = (gen, gen.get_state())
        t0 = _perf_ns()
        out = func(*rargs, **rkw)
        cost = _perf_ns() - t0
        # Results: those that are mutated arguments are returned as the argument
        # objects themselves; any other tensor result is fresh (registered below).
        fresh: list[_Tensor] = []
        result_src: list[Any] = []
        rets = info.rets
        if isinstance(out, _Tensor):
            src = rets[0] if rets else None
            result_src.append(src)
            if src is None:
                fresh.append(out)
        elif type(out) in (tuple, list) and len(out) == len(rets):
            for o, src in zip(out, rets):
                result_src.append(src)
                if src is None and isinstance(o, _Tensor):
                    fresh.append(o)
        fresh_cells: list[_Cell] = []
        if fresh:
            # Fresh outputs of a mutating op (e.g. batch norm with running stats
            # as declared mutable arguments): a separate call; its replay runs on
            # scratch copies of the mutated arguments.
            fresh_cells = self._register(func, info, ins, fresh, cost, info.flags)
            if self.record:
                self.ops[fresh_cells[0].op] = _Op(
                    func, targs, tkw, ins, fresh_cells, rng, _K_CALL, scratch=tuple(mutpos)
                )
        del rargs, rkw
        if mut:
            self._register_mutation(func, info, ins, mut, targs, tkw, cost, rng)
        if locked is not None:
            self._unlock_all(locked)
            locked.clear()  # unlocked: nothing for the caller's error path to undo
        wrappers = iter(self._wrap_all(fresh_cells, fresh)) if fresh else iter(())
        if self.budgeted or self.dirty:
            self.evict()
        if isinstance(out, _Tensor):
            src = result_src[0] if result_src else None
            if src is None:
                return next(wrappers)
            return args[src] if isinstance(src, int) else kwargs[src]
        if type(out) in (tuple, list) and result_src:
            res = []
            for o, src in zip(out, result_src):
                if src is not None:
                    res.append(args[src] if isinstance(src, int) else kwargs[src])
                elif isinstance(o, _Tensor):
                    res.append(next(wrappers))
                else:
                    res.append(o)
            return type(out)(res)
        return out

    def _register_mutation(
        self,
        func: Any,
        info: _Info,
        ins: list[_Cell],
        mut: list[int],
        targs: list[Any],
        tkw: dict[str, Any],
        cost: int,
        rng: Any,
    ) -> None:
        seen: set[_Cell] = set()
        uniq = []
        for j in mut:
            if ins[j] not in seen:
                seen.add(ins[j])
                uniq.append(j)
        mut = uniq
        n_in = len(ins)
        n_mut = len(mut)
        if n_in > self.cap:
            self._grow(n_in)
        for j, c in enumerate(ins):
            self.b_in[j] = c.tid
        for i, j in enumerate(mut):
            self.b_mut[i] = j
        op = self.f_mutate(self.h, info.name, self.b_in, n_in, self.b_mut, n_mut, cost, info.flags, self.b_out)
        if op < 0:
            raise self._fail(f"registering the in-place op {info.name.decode()}")
        new_ids = [int(self.b_out[i]) for i in range(n_mut)]
        news: list[_Cell] = []
        for j, tid in zip(mut, new_ids):
            old = ins[j]
            # The new version takes over the old memory and its pins (engine).
            new = _Cell(tid, old.t, tid, op, self, pin=old.pin)
            g_old = self.groups.get(old.root)
            size = g_old.nbytes if g_old is not None else 0
            self.groups[tid] = _Group(new, size)
            self.mirror += size  # the engine counts the new version...
            if g_old is not None and g_old.res:
                g_old.res = False  # ... and the old one evicted (its memory is the new one's)
                self.mirror -= g_old.nbytes
            self._repoint(old, new)
            news.append(new)
            if self.sink is not None:
                self.sink.version(old, new)
            # The engine released the old version (MUTATE: "the old version loses
            # a reference"); its data is now the new version's.
            old.rel = True
            old.w = None
            old.t = None
            if g_old is not None:
                g_old.live -= 1
                # Other live aliases of the mutated storage now see the new data:
                # re-register each as an alias of the new version.
                for a in list(g_old.cells):
                    if a.rel or a is old:
                        continue
                    self._realias(a, new)
                for a in g_old.cells:
                    a.t = None
        if self.sink is not None:
            self.sink.mutate(info.name, ins, mut, cost)
        if self.record:
            self.ops[op] = _Op(func, targs, tkw, ins, news, rng, _K_MUTATE, mut=tuple(mut), scratch=info.stw)

    def _repoint(self, old: _Cell, new: _Cell) -> None:
        """Make whatever named ``old`` (a wrapper or an external) name ``new``."""
        wr = old.w
        if wr is not None:
            w = wr()
            if type(w) is DTRTensor:
                w._c = new
            wr.cell = new
            new.w = wr
            old.w = None
        if old.pin and old.t is not None:
            ptr = old.t.untyped_storage().data_ptr()
            if ptr and self.ext_storage.get(ptr) is old:
                self.ext_storage[ptr] = new

    def _realias(self, a: _Cell, new: _Cell) -> None:
        """Re-register live alias ``a`` of a mutated storage on top of ``new``."""
        t = a.t
        assert t is not None
        geo = (t.dtype, tuple(t.size()), tuple(t.stride()), t.storage_offset())
        self.b_in[0] = new.tid
        self.b_size[0] = t.nbytes
        self.b_alias[0] = 0
        op = self.f_call(self.h, b"alias", self.b_in, 1, self.b_size, self.b_alias, 1, 0, 0, self.b_out)
        if op < 0:
            raise self._fail("re-registering an alias of a mutated tensor")
        c = _Cell(int(self.b_out[0]), t, new.root, op, self, pin=new.pin)
        g = self.groups[new.root]
        g.cells.add(c)
        g.live += 1
        if self.record:
            self.ops[op] = _Op(None, geo, None, [new], [c], None, _K_ALIAS)
        self._repoint(a, c)
        if self.sink is not None:
            self.sink.version(a, c)
        a.t = None
        self._release(a, self.h, self.groups)

    # --------------------------------------------------------------- replays

    def rerun(self, op: _Op) -> int:
        """Re-run a recorded op on the current data of its inputs; returns ns."""
        kind = op.kind
        if kind == _K_ALIAS:
            src = op.ins[0].t
            assert src is not None
            dtype, size, stride, offset = op.args
            t0 = _perf_ns()
            op.outs[0].t = _storage_view(src.untyped_storage(), dtype, size, stride, offset)
            return _perf_ns() - t0
        func = op.func
        info = self.infos[func]
        rargs, rkw = self._refill(op.args, op.kwargs or {}, info)
        copies: list[_Tensor] = []
        if kind == _K_MUTATE:
            # Never clobber the (rebuilt) old version: run on a copy of it.
            for j in op.mut:
                c = op.ins[j]
                t = c.t
                assert t is not None
                cp = _copy_like(t)
                copies.append(cp)
                self._substitute(rargs, rkw, info, t, cp)
        for key in op.scratch:
            # Arguments the op writes that must not be written again.
            src = rargs[key] if isinstance(key, int) and key < len(rargs) else rkw.get(key) if isinstance(key, str) else None
            if isinstance(src, _Tensor):
                cp = src.clone()
                if isinstance(key, int):
                    rargs[key] = cp
                else:
                    rkw[key] = cp
        rng = op.rng
        if rng is not None:
            gen, state = rng
            saved = gen.get_state()
            gen.set_state(state)
        try:
            t0 = _perf_ns()
            out = func(*rargs, **rkw)
            cost = _perf_ns() - t0
        finally:
            if rng is not None:
                gen.set_state(saved)
        if kind == _K_MUTATE:
            for c, cp in zip(op.outs, copies):
                if not c.pin:
                    c.t = cp
        else:
            flat: list[_Tensor] = []
            _flatten(out, flat)
            if op.scratch and info.mutable:
                # Fresh results of a mutating op: skip the mutated returns.
                flat = []
                outs = [out] if isinstance(out, _Tensor) else list(out)
                for o, src in zip(outs, info.rets):
                    if src is None and isinstance(o, _Tensor):
                        flat.append(o)
            if len(flat) != len(op.outs):
                raise MemscaleError(
                    f"memscale.dtr: re-running {info.name.decode()} gave {len(flat)} tensors, "
                    f"the original run {len(op.outs)}"
                )
            for c, o in zip(op.outs, flat):
                if not c.pin:
                    c.t = o
        return cost

    @staticmethod
    def _substitute(rargs: list[Any], rkw: dict[str, Any], info: _Info, old: _Tensor, new: _Tensor) -> None:
        for pos, islist in info.tpos:
            if pos >= len(rargs):
                break
            a = rargs[pos]
            if islist and a is not None:
                rargs[pos] = [new if x is old else x for x in a]
            elif a is old:
                rargs[pos] = new
        for name, islist in info.tkw:
            a = rkw.get(name)
            if islist and a is not None:
                rkw[name] = [new if x is old else x for x in a]
            elif a is old:
                rkw[name] = new

    def materialize(self, c: _Cell) -> None:
        """Make ``c`` resident; returns with ``c`` locked once (caller unlocks)."""
        h = self.h
        rounds = 0
        if self.dirty:
            self.evict()
        while c.t is None:
            if c.e is not self:
                raise EvictedTensorError(f"tensor {c.tid} does not belong to the active DTR region")
            rounds += 1
            if rounds > 64:
                raise MemscaleError(
                    f"memscale.dtr: tensor {c.tid} could not be made resident after {rounds - 1} "
                    "rematerialization plans (the budget is too small to keep what the plan needs)"
                )
            n = self.f_plan(h, c.tid, self.b_pk, self.b_pi, self.pcap)
            if n < 0:
                need = _engine.plan_capacity_needed(_engine.last_error())
                if need is not None and need > self.pcap:
                    self.pcap = need
                    self.b_pk = (_engine._i32 * need)()
                    self.b_pi = (_engine._i64 * need)()
                    rounds -= 1
                    continue
                raise self._fail(f"rematerialization plan for tensor {c.tid}")
            if n == 0:
                # The engine holds the storage resident: a view of it that Python
                # has not rebuilt yet. Re-run its producing op locally.
                op = self.ops.get(c.op)
                if op is None:
                    raise EvictedTensorError(
                        f"memscale.dtr: tensor {c.tid} has no data, and the engine has no plan to rebuild it"
                    )
                if self._run_step(op, c.op, report=False, keep=[c]):
                    return
            elif self._run_plan(c, n):
                return
            if self.dirty:
                self.evict()
        if self.f_lock(h, c.tid) < 0:
            raise self._fail(f"lock of tensor {c.tid}")

    def _run_step(self, op: _Op, op_id: int, report: bool = True, keep: list[_Cell] | None = None) -> list[_Cell]:
        """Re-run one op with its inputs resident and locked.

        Outputs listed in ``keep`` are locked before the inputs are unlocked
        (an unlock can make the engine drop an unreferenced storage) and
        returned; the caller unlocks them.
        """
        h = self.h
        if self.dirty:
            self.evict()
        locked: list[_Cell] = []
        kept: list[_Cell] = []
        try:
            for c in op.ins:
                if c.t is None:
                    self.materialize(c)  # evicted since the plan was made
                elif self.f_lock(h, c.tid) < 0:
                    raise self._fail(f"lock of tensor {c.tid}")
                locked.append(c)
            fresh: list[_Group] = []
            extra = 0
            groups = self.groups
            for c in op.outs:
                if c.root == c.tid:
                    g = groups.get(c.tid)
                    if g is not None:
                        extra += g.nbytes  # a resident one is re-made as a throw-away copy
                        fresh.append(g)
            if self.budgeted and extra:
                self.reserve(extra, b"rematerialization")
            cost = self.rerun(op)
            if report and self.f_remat(h, op_id, cost) < 0:
                raise self._fail(f"reporting the rematerialization of op {op_id}")
            if report:
                for g in fresh:
                    if not g.res:
                        g.res = True
                        self.mirror += g.nbytes
            if keep:
                for c in keep:
                    if self.f_lock(h, c.tid) < 0:
                        raise self._fail(f"lock of tensor {c.tid}")
                    kept.append(c)
        except BaseException:
            for c in kept:
                self.f_unlock(h, c.tid)
            raise
        finally:
            for c in locked:
                self.f_unlock(h, c.tid)
            self.dirty = True
        if report and self.sink is not None:
            self.sink.remat(op_id, cost)
        return kept

    def _run_plan(self, target: _Cell, n: int) -> bool:
        """Run the engine's plan: steps in order, ancestors first.

        Each step locks its inputs while it runs; an output is kept locked
        until the next step ran when that step reads it (a chain is never cut
        between two steps). An input that the budget loop took away since the
        plan was made is rebuilt by a plan of its own, as DTR's recursive
        rematerialization does; holding every intermediate until the end would
        make plans that need more than the budget where DTR succeeds.

        Returns whether ``target`` was produced and is left locked once.
        """
        steps = list(zip(self.b_pk[:n], self.b_pi[:n]))
        ops = self.ops
        h = self.h
        for kind, i in steps:
            if kind != STEP_SWAP_IN and i not in ops:
                raise MemscaleError(f"memscale.dtr: the engine planned unknown op {i}")
        held: list[_Cell] = []
        last = len(steps) - 1
        got = False
        try:
            for s, (kind, i) in enumerate(steps):
                nxt: list[_Cell] = []
                if s < last and steps[s + 1][0] != STEP_SWAP_IN:
                    nxt = ops[steps[s + 1][1]].ins
                elif s == last:
                    nxt = [target]
                if kind == STEP_SWAP_IN:
                    produced = self._swap_in(i)
                    new_held = []
                    for c in produced:
                        if c in nxt:
                            if self.f_lock(h, c.tid) < 0:
                                raise self._fail(f"lock of tensor {c.tid}")
                            new_held.append(c)
                else:
                    op = ops[i]
                    new_held = self._run_step(op, i, keep=[c for c in op.outs if c in nxt])
                for c in held:
                    self.f_unlock(h, c.tid)
                self.dirty = True
                held = new_held
            if target in held:
                held.remove(target)
                got = True
        finally:
            for c in held:
                self.f_unlock(h, c.tid)
            self.dirty = True
        return got

    # ------------------------------------------------------------ evictions

    def evict(self, why: str = "") -> None:
        """Run the engine's budget loop and carry out its decisions."""
        self.dirty = False
        ids = self.b_eids
        acts = self.b_eacts
        cap = self.ecap
        groups = self.groups
        while True:
            n = self.f_evict(self.h, ids, acts, cap)
            if n <= 0:
                if n < 0:
                    raise self._fail(f"budget too small{' ' + why if why else ''}")
                return
            for j in range(n):
                root = ids[j]
                g = groups.get(root)
                if g is None:
                    raise MemscaleError(f"memscale.dtr: the engine evicted unknown storage {root}")
                if g.res:
                    g.res = False
                    self.mirror -= g.nbytes
                if acts[j] == ACTION_SWAP:
                    self._swap_out(g)
                else:
                    for c in g.cells:
                        c.t = None
                    g.host = None
                    g.geo = None
                if g.live > 0:  # not a released storage the engine freed
                    self.bytes_evicted += g.nbytes
            # A partial answer (the engine ran out of candidates after taking
            # some) is not an error yet: ask again until it returns 0 (done)
            # or -1 (over budget with nothing evictable).

    def _swap_out(self, g: _Group) -> None:
        geo = {}
        st = None
        for c in g.cells:
            t = c.t
            if t is not None:
                if st is None:
                    st = t.untyped_storage()
                geo[c] = (t.dtype, tuple(t.size()), tuple(t.stride()), t.storage_offset())
        if st is None:
            return
        host = torch.UntypedStorage(st.nbytes(), device="cpu")
        if st.device.type == "cuda":
            host = host.pin_memory()
        host.copy_(st, non_blocking=st.device.type == "cuda")
        g.host = (host, st.device)
        g.geo = geo
        for c in g.cells:
            c.t = None

    def _swap_in(self, tid: int) -> list[_Cell]:
        g = self.groups.get(tid)
        if g is None:
            raise MemscaleError(f"memscale.dtr: the engine asked to swap in unknown storage {tid}")
        if g.host is None or g.geo is None:
            raise MemscaleError(f"memscale.dtr: storage {tid} was never swapped out")
        host, device = g.host
        if self.budgeted:
            self.reserve(host.nbytes(), b"swap-in")
        st = torch.UntypedStorage(host.nbytes(), device=device)
        st.copy_(host, non_blocking=True)
        cells = []
        for c, (dtype, size, stride, offset) in g.geo.items():
            c.t = _storage_view(st, dtype, size, stride, offset)
            cells.append(c)
        g.host = None
        g.geo = None
        if not g.res:
            g.res = True
            self.mirror += g.nbytes
        if self.f_swapped_in(self.h, tid) < 0:
            raise self._fail(f"reporting the swap-in of tensor {tid}")
        if self.sink is not None:
            self.sink.swap_in(tid)
        return cells

    # ---------------------------------------------------------------- close

    def close(self, ok: bool) -> dict[str, Any]:
        """Materialize what escapes, detach it, destroy the engine instance."""
        stats: dict[str, Any] = {}
        try:
            self.flush()
            escaping = [wr.cell for wr in list(self.live.values()) if wr.cell is not None and wr() is not None]
            if ok:
                self._materialize_all(escaping)
            # .grad of parameters seen in the region: plain tensors again.
            with torch.no_grad(), _disable_current_modes():
                for ref in self.leaves:
                    p = ref()
                    if p is None:
                        continue
                    g = p.grad
                    if type(g) is DTRTensor:
                        t = g._c.t
                        p.grad = t if t is not None else None
            stats = self.eng.stats()
            if ok and self.tunes and self.budget > 0:
                self._tune()
        finally:
            self.closed = True
            for wr in list(self.live.values()):
                c = wr.cell
                if c is not None:
                    c.e = None
                    c.tid = -1
                wr.cell = None
            self.live.clear()
            for hk in self.hooks:
                hk.remove()
            self.hooks.clear()
            self.pinned.clear()
            for wr in self.ext.values():
                c = wr.cell
                if c is not None:
                    c.e = None
                    c.t = None
                wr.cell = None
            self.ops.clear()
            self.groups.clear()
            self.ext.clear()
            self.ext_storage.clear()
            self.leaves.clear()
            self.pending.clear()
            self.eng.close()
        stats["bytes_evicted_py"] = self.bytes_evicted
        return stats

    def _tune(self) -> None:
        """Have the engine choose the configuration of later entries
        (``memscale_dtr_tune``); a failure is kept, not raised: the step
        itself succeeded."""
        try:
            self.tuning = self.eng.tune()
        except MemscaleError as exc:
            self.tune_error = str(exc)

    def _materialize_all(self, cells: list[_Cell]) -> None:
        """Make every escaping cell resident at once (all locked until done).

        Everything that leaves the region must be resident; when that does not
        fit the budget, the budget is lifted for the rest of the exit (the
        summary's peak then shows it).
        """
        h = self.h
        locked: list[_Cell] = []
        try:
            self._lock_resident(cells, locked)
            for c in cells:
                if c.t is None:
                    try:
                        self.materialize(c)
                    except MemscaleError:
                        if not self.budgeted:
                            raise
                        self.eng.set_budget(0)
                        self.budget = 0
                        self.budgeted = False
                        self.materialize(c)
                    locked.append(c)
        finally:
            for c in locked:
                self.f_unlock(h, c.tid)


# ---------------------------------------------------------------------- the mode


class _Mode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo
        # (about 2 us per op); a DTR region is not compiled through anyway.
        return False

    def __init__(self, entry: _Entry) -> None:
        super().__init__()
        self.entry = entry

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.entry.dispatch(func, args, kwargs or {})


# -------------------------------------------------------------------- the region

_STAT_KEYS: Final[tuple[str, ...]] = (
    "evictions",
    "rematerializations",
    "swaps_out",
    "swaps_in",
    "bytes_evicted",
    "base_cost_ns",
    "remat_cost_ns",
)


def _allocator_installed() -> bool:
    try:
        from .allocator import installed
    except ImportError:
        return False
    return installed() is not None


def _host_bandwidth() -> float:
    """Host<->device copy bandwidth for the engine's swap decision (bytes/s)."""
    global _BANDWIDTH
    if _BANDWIDTH is not None:
        return _BANDWIDTH
    if torch.cuda.is_available():
        n = 64 << 20
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host.copy_(dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(4):
            host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        _BANDWIDTH = 4 * n / max(time.perf_counter() - t0, 1e-9)
    else:
        _BANDWIDTH = 10e9  # a nominal PCIe-like figure for the CPU stand-in
    return _BANDWIDTH


_BANDWIDTH: float | None = None


class DTRRegion:
    """A DTR region; use :func:`dtr` to make one. Re-enterable (enter per step).

    Each entry creates an engine instance with the region's settings and destroys
    it at exit; :meth:`summary` accumulates the counters of all entries. The
    arguments are :func:`dtr`'s, plus ``sink``: an object told about every
    registration (used by :mod:`memscale.trace` to write DTR traces).

    Not reentrant: one entry at a time, on the thread that entered it.
    """

    def __init__(
        self,
        budget: int | str | None = None,
        *,
        heuristic: str | None = None,
        recompute: bool = True,
        swap: bool = False,
        evictee_min_size: int | str | None = None,
        recomp_time_factor: float | None = None,
        recomp_memory_factor: float | None = None,
        offload_limit: int | str | None = None,
        usage: str | None = None,
        sink: Any = None,
    ) -> None:
        check_heuristic(heuristic, "dtr() heuristic")
        for flag, value in (("recompute", recompute), ("swap", swap)):
            if not isinstance(value, bool):
                raise ConfigError(f"dtr({flag}={value!r}): expected True or False")
        if not recompute and not swap:
            raise ConfigError("dtr(recompute=False, swap=False): nothing could ever be evicted; enable one")
        for name, value in (("recomp_time_factor", recomp_time_factor), ("recomp_memory_factor", recomp_memory_factor)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ConfigError(f"dtr({name}={value!r}): expected a number >= 0")
        if usage is not None and usage not in ("engine", "allocator"):
            raise ConfigError(f"dtr(usage={usage!r}): expected 'engine' or 'allocator'")
        if offload_limit is not None and not swap:
            raise ConfigError(f"dtr(offload_limit={offload_limit!r}): only meaningful with swap=True")
        self._budget_spec = budget
        self._budget = self._resolve_budget(budget)
        self._heuristic = heuristic
        self._recompute = recompute
        self._swap = swap
        self._evictee_min_size = (
            None
            if evictee_min_size is None
            else parse_size(evictee_min_size, name="dtr(evictee_min_size)", allow_percent=False)
        )
        self._recomp_time_factor = recomp_time_factor
        self._recomp_memory_factor = recomp_memory_factor
        self._offload_limit = (
            None if offload_limit is None else parse_size(offload_limit, name="dtr(offload_limit)", allow_percent=False)
        )
        self._usage = usage
        self._sink = sink
        self._infos: dict[Any, _Info] = {}
        self._entry: _Entry | None = None
        self._mode: _Mode | None = None
        self._totals: dict[str, int] = dict.fromkeys(_STAT_KEYS, 0)
        self._peak = 0
        self._entries = 0
        self._last: dict[str, Any] = {}
        # The engine's tuning: the keys merged into later entries' config
        # (None: not tuned), and what summary() reports.
        self._tuned_config: dict[str, Any] | None = None
        self._tuning: dict[str, Any] | None = None

    # ------------------------------------------------------------- settings

    @staticmethod
    def _resolve_budget(budget: int | str | None) -> int:
        if budget is None:
            return 0
        total = None
        if isinstance(budget, str) and budget.strip().endswith("%"):
            from .allocator import device_total_memory

            total = device_total_memory() if torch.cuda.is_available() else None
            if total is None:
                raise ConfigError(
                    f"dtr(budget={budget!r}): a percentage needs a GPU's memory size; on the CPU give bytes"
                )
        nbytes = parse_size(budget, name="dtr(budget)", total=total)
        if nbytes <= 0:
            raise ConfigError(f"dtr(budget={budget!r}): must be positive (None = unlimited)")
        return nbytes

    @property
    def budget(self) -> int:
        """The budget in bytes (0 = unlimited)."""
        return self._budget

    @budget.setter
    def budget(self, value: int | str | None) -> None:
        """Set the budget; a changed budget forgets the tuned configuration
        (the next entry records and tunes again)."""
        nbytes = self._resolve_budget(value)
        if nbytes != self._budget:
            self._tuned_config = None
            self._tuning = None
        self._budget = nbytes
        e = self._entry
        if e is not None:
            e.eng.set_budget(self._budget)
            e.budget = self._budget
            e.budgeted = self._budget > 0

    def _config(self) -> dict[str, Any]:
        usage = self._usage
        device = None
        if usage is None:
            usage = "allocator" if (torch.cuda.is_available() and _allocator_installed()) else "engine"
        if usage == "allocator":
            device = torch.cuda.current_device()
        min_size = self._evictee_min_size
        if min_size is None and "MEMSCALE_EVICTEE_MIN_SIZE" not in os.environ:
            min_size = DEFAULT_EVICTEE_MIN_SIZE
        heuristic = self._heuristic
        env_heuristic = os.environ.get("MEMSCALE_HEURISTIC")
        env_auto = env_heuristic is not None and env_heuristic.strip().lower() == DEFAULT_HEURISTIC
        if heuristic is None and self._budget > 0 and (env_heuristic is None or env_auto):
            heuristic = DEFAULT_HEURISTIC  # nothing to tune without a budget
        cfg: dict[str, Any] = {
            "budget": self._budget,
            "heuristic": heuristic,
            "recomp_time_factor": self._recomp_time_factor,
            "recomp_memory_factor": self._recomp_memory_factor,
            "evictee_min_size": min_size,
            "swap_bandwidth": _host_bandwidth() if self._swap else 0,
            "usage": usage,
        }
        if device is not None:
            cfg["device"] = device
        if self._offload_limit is not None:
            cfg["offload_limit"] = self._offload_limit
        if heuristic == DEFAULT_HEURISTIC and self._tuned_config is not None:
            cfg.update(self._tuned_config)
        return cfg

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> DTRRegion:
        if self._entry is not None:
            raise MemscaleError("memscale.dtr: this region is already entered (it is re-enterable, not reentrant)")
        entry = _Entry(self, self._config(), self._sink)
        if self._sink is not None:
            self._sink.start(entry)
        self._entry = entry
        self._mode = _Mode(entry)
        self._mode.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        entry = self._entry
        mode = self._mode
        assert entry is not None and mode is not None
        try:
            mode.__exit__(exc_type, exc, tb)
        finally:
            self._entry = None
            self._mode = None
            stats = entry.close(ok=exc_type is None)
            self._accumulate(stats, entry.config)
            self._keep_tuning(entry)
            if self._sink is not None:
                self._sink.stop()

    def _keep_tuning(self, entry: _Entry) -> None:
        """Carry the engine's choice (or a tuning failure) to later entries."""
        if entry.tuning is not None:
            report = entry.tuning
            self._tuned_config = dict(report.get("config") or {})
            self._tuning = {key: report.get(key) for key in _TUNING_KEYS}
            log.info(
                "memscale.dtr: tuned for budget %d bytes in %.1f ms: %s (overhead %.3f, default heuristic %.3f)",
                self._budget,
                (report.get("wall_ns") or 0) / 1e6,
                report.get("choice"),
                report.get("overhead") or 0.0,
                report.get("default_overhead") or 0.0,
            )
        elif entry.tune_error is not None:
            self._tuned_config = dict(_UNTUNED)
            self._tuning = {"error": entry.tune_error}
            log.warning(
                "memscale.dtr: tuning failed (%s); later entries use the engine's default heuristic",
                entry.tune_error,
            )

    def _accumulate(self, stats: dict[str, Any], config: dict[str, Any]) -> None:
        self._entries += 1
        last: dict[str, Any] = {}
        for key in _STAT_KEYS:
            if key == "bytes_evicted":
                value = int(stats.get("bytes_evicted", stats.get("bytes_evicted_py", 0)))
            else:
                value = int(stats.get(key, 0))
            self._totals[key] += value
            last[key] = value
        last["peak_usage"] = int(stats.get("peak_usage", 0))
        last["budget"] = int(stats.get("budget", self._budget))
        self._peak = max(self._peak, last["peak_usage"])
        last["overhead"] = _overhead(last["base_cost_ns"], last["remat_cost_ns"])
        last["engine"] = stats
        last["config"] = {k: v for k, v in config.items() if v is not None}
        self._last = last

    # -------------------------------------------------------------- results

    def summary(self) -> dict[str, Any]:
        """Counters over every entry so far (and the running one).

        Keys: ``evictions``, ``rematerializations``, ``swaps_out``, ``swaps_in``,
        ``bytes_evicted``, ``base_cost_ns``, ``remat_cost_ns``, ``overhead``
        (``(base + remat) / base``), ``peak_usage`` (bytes, highest of any entry),
        ``budget`` (bytes, 0 = unlimited), ``entries``, ``tuning``: ``None``
        until the engine tuned this region, else ``choice``, ``feasible``,
        ``overhead``, ``default_overhead``, ``wall_ns``, ``instructions`` and
        ``config`` (the keys later entries run with) of its report, or
        ``{"error": message}`` when tuning failed.
        """
        totals = dict(self._totals)
        peak = self._peak
        e = self._entry
        if e is not None:
            cur = e.eng.stats()
            for key in _STAT_KEYS:
                if key == "bytes_evicted":
                    totals[key] += int(cur.get("bytes_evicted", e.bytes_evicted))
                else:
                    totals[key] += int(cur.get(key, 0))
            peak = max(peak, int(cur.get("peak_usage", 0)))
        out: dict[str, Any] = dict(totals)
        out["overhead"] = _overhead(totals["base_cost_ns"], totals["remat_cost_ns"])
        out["peak_usage"] = peak
        out["budget"] = self._budget
        out["entries"] = self._entries + (1 if e is not None else 0)
        out["tuning"] = None if self._tuning is None else dict(self._tuning)
        return out

    def last_summary(self) -> dict[str, Any]:
        """The counters of the last completed entry (``engine``: its raw stats;
        ``config``: the configuration its engine was created with)."""
        return dict(self._last)

    def reset_summary(self) -> None:
        """Forget the counters of past entries."""
        self._totals = dict.fromkeys(_STAT_KEYS, 0)
        self._peak = 0
        self._entries = 0
        self._last = {}

    # ------------------------------------------------------------ tensors

    def wrap(self, t: _Tensor) -> DTRTensor:
        """A region tensor standing for plain tensor ``t`` (registered pinned).

        Only inside the region. Autograd treats the result as a new tensor
        (``requires_grad`` is copied, gradients flow into the result, not into
        ``t``); plain tensors need no wrapping to be used in the region.
        """
        e = self._entry
        if e is None:
            raise MemscaleError("DTRRegion.wrap: the region is not entered")
        if type(t) is DTRTensor and t._c.e is e:
            return t
        if e.pending:
            e.flush()
        with _disable_current_modes():
            out = e.dispatch(_aten.alias.default, (t,), {})
        if t.requires_grad:
            out.requires_grad_(True)
        return out

    def unwrap(self, t: Any) -> Any:
        """The plain tensor behind region tensor ``t`` (rebuilt if evicted)."""
        return unwrap(t)


def _overhead(base: int, remat: int) -> float:
    return (base + remat) / base if base > 0 else 1.0


def dtr(
    budget: int | str | None = None,
    *,
    heuristic: str | None = None,
    recompute: bool = True,
    swap: bool = False,
    evictee_min_size: int | str | None = None,
    recomp_time_factor: float | None = None,
    recomp_memory_factor: float | None = None,
    offload_limit: int | str | None = None,
    usage: str | None = None,
) -> DTRRegion:
    """A Dynamic Tensor Rematerialization region.

    Args:
        budget: memory budget: bytes, ``"8GiB"``-style, ``"75%"`` of the GPU's
            memory, or ``None`` for no budget (ops are recorded, nothing is
            evicted: the way to measure a step's peak).
        heuristic: the engine's eviction heuristic (one of
            :func:`memscale.config.heuristics`: ``"dtr"``, ``"dtr-eq"``,
            ``"anc-sqrt"``, ``"lru"``, ...). ``None``: ``MEMSCALE_HEURISTIC``
            when set, else, under a budget, ``"auto"``: the first entry
            scores with the engine's default heuristic and records its
            program, the engine then chooses a configuration by replaying it
            (``memscale_dtr_tune``) and later entries run that choice (see
            ``summary()["tuning"]``; a changed budget tunes again). Any other
            name is used as given, without tuning.
        recompute: allow evicting by dropping and recomputing.
        swap: allow evicting by copying to host memory.
        evictee_min_size: tensors smaller than this are never evicted.
        recomp_time_factor: exponent of the recompute cost in the score.
        recomp_memory_factor: exponent of the memory term in the score.
        offload_limit: cap on bytes swapped out (needs ``swap``).
        usage: ``"engine"`` (sum of resident registered bytes) or
            ``"allocator"`` (the memscale allocator's allocated bytes); default:
            ``"allocator"`` on CUDA with the allocator installed, else
            ``"engine"``.

    Returns:
        A :class:`DTRRegion`: ``with region: ...`` once per training step.

    Raises:
        ConfigError: a malformed argument (named in the message).
    """
    return DTRRegion(
        budget,
        heuristic=heuristic,
        recompute=recompute,
        swap=swap,
        evictee_min_size=evictee_min_size,
        recomp_time_factor=recomp_time_factor,
        recomp_memory_factor=recomp_memory_factor,
        offload_limit=offload_limit,
        usage=usage,
    )
