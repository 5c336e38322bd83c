"""Argument collection and output-size prediction.

An op's arguments arrive as wrappers, plain tensors and other values.
:func:`collect` turns them into :class:`Arguments`: the input cells in
flattened order, the arguments to run the op with (real tensors), the
*template* a re-run substitutes the then-current tensors into (cells in place of
tensors), and where each input came from. :func:`refill` makes real arguments
from a template again (after inputs were rebuilt, or for a re-run).

:class:`OutputSizes` predicts the bytes an op is about to allocate, so the
budget loop can make room before it runs: learned once per (op, argument
signature) by running the op on ``meta`` tensors and corrected by every real
run.

Holds no engine state: registering a plain tensor as an external is the
session's (``Session.cell_of``, reached through :class:`CellSource`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Protocol

import torch

from .cells import Cell
from .schema import ArgKey, OpInfo

_Tensor = torch.Tensor


class CellSource(Protocol):
    """Where :func:`collect` gets an argument's cell (the session, which
    registers a plain tensor as an external on first sight)."""

    def cell_of(self, x: Any) -> Cell | None: ...


@dataclass(slots=True)
class Arguments:
    """One op's arguments, collected.

    Attributes:
        cells: the input cells in flattened order (a ``Tensor[]`` argument
            contributes one per tensor).
        args / kwargs: the arguments to run the op with (real tensors; ``None``
            in place of an input that is not resident).
        template_args / template_kwargs: the same with cells in place of
            tensors: what a re-run substitutes the then-current tensors into.
        keys: per input cell, the position or keyword it came from.
        missing: some input is not resident.
    """

    cells: list[Cell]
    args: list[Any]
    kwargs: dict[str, Any]
    template_args: list[Any]
    template_kwargs: dict[str, Any]
    keys: list[ArgKey]
    missing: bool

    def refill(self, info: OpInfo) -> None:
        """Real arguments from the template again (inputs were rebuilt)."""
        self.args, self.kwargs = refill(self.template_args, self.template_kwargs, info)


def collect(session: CellSource, info: OpInfo, args: Any, kwargs: dict[str, Any]) -> Arguments:
    """Collect an op's arguments; plain tensors are registered as externals."""
    cells: list[Cell] = []
    keys: list[ArgKey] = []
    real_args = list(args)
    template_args = list(args)
    missing = False
    n = len(args)
    cell_of = session.cell_of
    for pos, is_list in info.tensor_args:
        if pos >= n:
            break
        a = args[pos]
        if a is None:
            continue
        if is_list:
            real_list: list[Any] = []
            template_list: list[Any] = []
            for x in a:
                c = None if x is None else cell_of(x)
                if c is None:
                    real_list.append(x)
                    template_list.append(x)
                    continue
                t = c.tensor
                if t is None:
                    missing = True
                cells.append(c)
                keys.append(pos)
                real_list.append(t)
                template_list.append(c)
            real_args[pos] = real_list
            template_args[pos] = template_list
        else:
            c = cell_of(a)
            if c is None:
                continue
            t = c.tensor
            if t is None:
                missing = True
            cells.append(c)
            keys.append(pos)
            real_args[pos] = t
            template_args[pos] = c
    real_kwargs = kwargs
    template_kwargs = kwargs
    if kwargs and info.tensor_kwargs:
        real_kwargs = dict(kwargs)
        template_kwargs = dict(kwargs)
        for name, is_list in info.tensor_kwargs:
            a = kwargs.get(name)
            if a is None:
                continue
            if is_list:
                template_list = []
                for x in a:
                    c = None if x is None else cell_of(x)
                    if c is None:
                        template_list.append(x)
                        continue
                    cells.append(c)
                    keys.append(name)
                    if c.tensor is None:
                        missing = True
                    template_list.append(c)
                template_kwargs[name] = template_list
                real_kwargs[name] = [x.tensor if type(x) is Cell else x for x in template_list]
            else:
                c = cell_of(a)
                if c is None:
                    continue
                if c.tensor is None:
                    missing = True
                cells.append(c)
                keys.append(name)
                template_kwargs[name] = c
                real_kwargs[name] = c.tensor
    return Arguments(cells, real_args, real_kwargs, template_args, template_kwargs, keys, missing)


def shape_stand_in(args: Any, kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]] | None:
    """The arguments of an op of :data:`~.schema.SHAPE_ONLY_SELF` with ``self``
    replaced by a ``meta`` tensor of its size, strides and dtype, and the
    device made explicit; ``None`` where ``self`` is not a plain strided tensor
    (a conjugate or negative view, a sparse one: it stays an input).

    The op runs on the stand-in, first and on every re-run alike, so its
    result depends on nothing the region holds: it is registered with no
    input for ``self``, and rebuilding it never rebuilds ``self``.
    """
    x = args[0] if args else None
    if (
        not isinstance(x, _Tensor)
        or x.layout is not torch.strided
        or x.is_conj()
        or x.is_neg()
        or x.device.type == "meta"
    ):
        return None
    stand_in = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="meta")
    if kwargs.get("device") is None:
        kwargs = {**kwargs, "device": x.device}
    return [stand_in, *args[1:]], kwargs


def refill(template_args: list[Any], template_kwargs: dict[str, Any], info: OpInfo) -> tuple[list[Any], dict[str, Any]]:
    """Real arguments from a template (cells -> their current tensors)."""
    args = list(template_args)
    n = len(template_args)
    for pos, is_list in info.tensor_args:
        if pos >= n:
            break
        a = template_args[pos]
        if is_list:
            if a is not None:
                args[pos] = [x.tensor if type(x) is Cell else x for x in a]
        elif type(a) is Cell:
            args[pos] = a.tensor
    kwargs = template_kwargs
    if template_kwargs and info.tensor_kwargs:
        kwargs = dict(template_kwargs)
        for name, is_list in info.tensor_kwargs:
            a = template_kwargs.get(name)
            if is_list:
                if a is not None:
                    kwargs[name] = [x.tensor if type(x) is Cell else x for x in a]
            elif type(a) is Cell:
                kwargs[name] = a.tensor
    return args, kwargs


def substitute(args: list[Any], kwargs: dict[str, Any], info: OpInfo, old: _Tensor, new: _Tensor) -> None:
    """Replace tensor ``old`` by ``new`` wherever it is an argument (in place)."""
    for pos, is_list in info.tensor_args:
        if pos >= len(args):
            break
        a = args[pos]
        if is_list and a is not None:
            args[pos] = [new if x is old else x for x in a]
        elif a is old:
            args[pos] = new
    for name, is_list in info.tensor_kwargs:
        a = kwargs.get(name)
        if is_list and a is not None:
            kwargs[name] = [new if x is old else x for x in a]
        elif a is old:
            kwargs[name] = new


def flatten_tensors(out: Any, acc: list[_Tensor]) -> None:
    """Append every tensor of a (nested) op result to ``acc``, in order."""
    if isinstance(out, _Tensor):
        acc.append(out)
    elif type(out) in (tuple, list):
        for x in out:
            flatten_tensors(x, acc)


def rebuild_result(out: Any, tensors: Any) -> Any:
    """``out`` with its tensors replaced, in order, by the items of iterator ``tensors``."""
    if isinstance(out, _Tensor):
        return next(tensors)
    if type(out) in (tuple, list):
        return type(out)(rebuild_result(x, tensors) for x in out)
    return out


class OutputSizes:
    """Predicted bytes of fresh outputs per (op, argument signature).

    Learned from a run on ``meta`` tensors the first time a signature is seen
    and corrected by every real run (:meth:`learn`); an op without a meta
    kernel, or with a data-dependent output size, predicts 0 until its first
    real run. Cleared when it reaches :data:`MAX_ENTRIES` (scalar arguments
    that change every call would otherwise grow it without end).

    A meta kernel can also under-report: the CPU ``mkldnn_rnn_layer``'s meta
    workspace is a placeholder (1 MiB predicted, 16 MiB allocated for an LSTM
    layer), so the first budgeted run of a signature went over the budget by
    the difference. Per op overload the largest ratio of real to meta bytes
    seen so far scales every later meta prediction of that overload
    (:meth:`under_reported`), and unbudgeted regions check each overload
    once (:attr:`checked`: one meta run and one comparison per overload, a
    set lookup on later calls), so a step measured without a budget first
    teaches the budgeted ones.
    """

    MAX_ENTRIES: Final[int] = 1 << 16

    def __init__(self) -> None:
        self._bytes: dict[Any, int] = {}
        #: Per key predicted from meta tensors and not run yet: the meta bytes.
        self._meta: dict[Any, int] = {}
        #: Per op overload: real bytes / meta bytes, where above 1.
        self._scale: dict[Any, float] = {}
        #: Op overloads whose meta prediction was compared with a real run
        #: (an unbudgeted region predicts an op not in it once).
        self.checked: set[Any] = set()

    def under_reported(self, func: Any) -> float:
        """How many times its meta bytes ``func`` allocated at most (1.0: never more)."""
        return self._scale.get(func, 1.0)

    def predict(self, func: Any, info: OpInfo, args: list[Any], kwargs: dict[str, Any]) -> tuple[Any, int]:
        """``(key, bytes)``: the fresh bytes ``func`` is expected to allocate;
        ``key`` (``None`` for unhashable arguments, or an op that returns no
        tensor) is for :meth:`learn`. An op that returns no tensor is never run
        on meta tensors (it may have effects, as the profiler's ops do)."""
        if not info.returns_tensors:
            self.checked.add(func)
            return None, 0
        try:
            key = (
                func,
                tuple([(x.shape, x.dtype) if isinstance(x, _Tensor) else _signature(x) for x in args]),
                tuple([(k, _signature(v)) for k, v in kwargs.items()]) if kwargs else None,
            )
            known = self._bytes.get(key)
        except TypeError:  # an unhashable argument
            self.checked.add(func)
            return None, 0
        if known is not None:
            return key, known
        try:
            meta_args = _to_meta(args)
            meta_kwargs = {k: _to_meta(x) for k, x in kwargs.items()}
            if info.factory:
                meta_kwargs["device"] = "meta"
            inputs = _input_storages([*meta_args, *meta_kwargs.values()])
            flat: list[_Tensor] = []
            flatten_tensors(func(*meta_args, **meta_kwargs), flat)
            meta = _fresh_bytes(flat, inputs)
        except Exception:  # no meta kernel, data-dependent shape: learn from the real run
            meta = 0
        nbytes = math.ceil(meta * self._scale.get(func, 1.0))
        self._store(key, nbytes)
        if meta:
            self._meta[key] = meta
        return key, nbytes

    def learn(self, key: Any, nbytes: int) -> None:
        """The op of ``key`` allocated ``nbytes`` (a real run)."""
        meta = self._meta.pop(key, 0)
        func = key[0]
        self.checked.add(func)
        if meta and nbytes > meta:
            self._scale[func] = max(self._scale.get(func, 1.0), nbytes / meta)
        self._store(key, nbytes)

    def _store(self, key: Any, nbytes: int) -> None:
        if len(self._bytes) >= self.MAX_ENTRIES and key not in self._bytes:
            self._bytes.clear()
            self._meta.clear()
        self._bytes[key] = nbytes


#: Shared by every region: output sizes depend on the op and its arguments only.
OUTPUT_SIZES: Final[OutputSizes] = OutputSizes()


#: Argument types that are part of an output-size signature by value.
_BY_VALUE: Final[frozenset[type]] = frozenset(
    {int, float, bool, str, complex, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format}
)


def _signature(x: Any) -> Any:
    """What of an argument decides output sizes: a tensor's shape and dtype, a
    scalar's value, and for any other object (a generator, a script object)
    only its type - so the key neither grows with each new object nor keeps
    it alive."""
    if isinstance(x, _Tensor):
        return (x.shape, x.dtype)
    t = type(x)
    if t is list or t is tuple:
        return tuple([_signature(y) for y in x])
    if t in _BY_VALUE:
        return x
    return t


def _input_storages(inputs: list[Any]) -> dict[int, int]:
    """The storages of the tensors in ``inputs`` (nested in lists and tuples): id -> bytes."""
    found: dict[int, int] = {}
    stack = list(inputs)
    while stack:
        x = stack.pop()
        if isinstance(x, _Tensor):
            storage = x.untyped_storage()
            found[storage._cdata] = storage.nbytes()
        elif type(x) in (list, tuple):
            stack.extend(x)
    return found


def _fresh_bytes(outputs: list[_Tensor], inputs: dict[int, int]) -> int:
    """Bytes of the distinct storages among ``outputs``, those of ``inputs``
    (id -> bytes before the op) counted by what they grew: an output viewing
    an input (``unsafe_split``'s chunks, which no alias annotation declares)
    allocates nothing, an ``out=`` tensor resized allocates its new size."""
    seen: set[int] = set()
    total = 0
    for o in outputs:
        storage = o.untyped_storage()
        key = storage._cdata
        if key in seen:
            continue
        seen.add(key)
        total += max(0, storage.nbytes() - inputs[key]) if key in inputs else storage.nbytes()
    return total


def _to_meta(x: Any) -> Any:
    if isinstance(x, _Tensor):
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="meta")
    if type(x) in (list, tuple):
        return type(x)(_to_meta(y) for y in x)
    return x
