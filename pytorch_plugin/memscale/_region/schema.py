"""What the region knows about one ATen overload, read once from its schema.

:class:`OpInfo` is computed the first time an overload runs in a region and
cached per region (``DTRRegion`` keeps the table); every later call of the same
overload reads its fields. It answers: which arguments are tensors (and which
are lists of tensors), which are written in place, which results are those
arguments, whether every result is a view (of the first argument), whether the
op is seeded (RNG), changes a shape in place, writes state its schema does not
declare, or must never be re-run.

Holds no tensors and no per-call state; knows nothing of cells or the engine.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import torch

from .._native.engine import NO_RECOMPUTE

#: Ops that write running statistics into arguments their schema does not mark
#: as mutable (``native_batch_norm`` and its backend kin: PyTorch's schema
#: declares no ``(a!)`` on ``running_mean`` / ``running_var``, yet the kernel
#: updates them when ``training`` is true): per op, the positions written and
#: the position of the ``training`` flag that decides whether it writes. The
#: region treats those positions as declared mutations (:class:`OpInfo`
#: ``mutated``): the written tensors get new versions (a region tensor's old
#: version stays recomputable, a pinned one is copied on write), and no re-run
#: writes them again (the re-run of the fresh results gets scratch copies,
#: the re-run of a new version works on a copy of the old one).
UNDECLARED_STATE_WRITES: Final[dict[str, tuple[tuple[int, ...], int]]] = {
    "native_batch_norm": ((3, 4), 5),
    "cudnn_batch_norm": ((3, 4), 5),
    "miopen_batch_norm": ((3, 4), 5),
    "_batch_norm_impl_index": ((3, 4), 5),
}

#: Ops whose first argument ``self`` is read for its metadata only (size,
#: strides, dtype, device): PyTorch's ``*_like`` factories and ``new_*``
#: methods (PyTorch keeps the same list for fake tensors,
#: ``torch._subclasses.fake_impls._like_tensor_constructors``; a test checks
#: this one covers it). The region does not make ``self`` an input of such an
#: op (:attr:`OpInfo.shape_only`): a dropout mask made by ``empty_like(x)``
#: would otherwise depend on ``x``, and rebuilding the mask would rebuild
#: ``x`` and its whole lineage first.
SHAPE_ONLY_SELF: Final[frozenset[str]] = frozenset(
    {
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "new_ones",
        "new_full",
    }
)

#: Namespaces whose ops are never re-run (collectives and other side effects).
UNREPLAYABLE_NAMESPACES: Final[frozenset[str]] = frozenset({"c10d", "_c10d_functional", "c10d_functional"})

#: An argument's position (int) or keyword (str).
ArgKey = int | str


class OpInfo:
    """The facts about one ATen overload the region's hot path reads.

    Attributes:
        name: the engine's name of the op (``b"add.Tensor"``).
        tensor_args: ``(position, is_list)`` of each positional tensor argument.
        tensor_kwargs: ``(name, is_list)`` of each keyword-only tensor argument.
        mutable: the op writes at least one argument in place.
        mutated: the positions / keywords of the arguments it writes.
        returns_arg: per result, the argument it *is* (``add_`` returns
            ``self``), or ``None`` for a fresh or viewing result.
        all_views: every result is a view of an argument (the op allocates
            nothing).
        returns_tensors: some result is a tensor (or a list of tensors).
        fresh_results: some tensor result is not an argument (for a mutating
            op: it computes something besides writing its arguments, as batch
            norm with running statistics does).
        views_first: ... and all of them view the first argument (the alias is
            known without comparing storages).
        factory: the op takes a ``device`` argument.
        seeded: the op draws random numbers (its generator state is recorded).
        reproducible: the same inputs give bitwise the same results (not so
            for ``empty`` and its kin: their data is undefined until written).
        inplace_view: the op changes a tensor's shape or strides in place.
        state_writes: argument positions written without being declared
            (:data:`UNDECLARED_STATE_WRITES`); they are in ``mutated``.
        writes_if: for an op with undeclared state writes, the position of
            the flag (``training``) without which it writes nothing; else
            ``None``.
        pure: for such an op, the facts of a call that writes nothing (the
            flag false: no mutation, no new versions); else ``None``.
        flags: the engine flags of its registrations (``NO_RECOMPUTE`` for an
            op that must never be re-run).
        shape_only: for an op of :data:`SHAPE_ONLY_SELF`, the facts to
            collect its arguments by when ``self`` is replaced by a stand-in
            without data (``self`` is then no tensor argument); else ``None``.
    """

    __slots__ = (
        "name",
        "tensor_args",
        "tensor_kwargs",
        "mutable",
        "mutated",
        "returns_arg",
        "all_views",
        "returns_tensors",
        "fresh_results",
        "views_first",
        "factory",
        "seeded",
        "reproducible",
        "inplace_view",
        "state_writes",
        "writes_if",
        "pure",
        "flags",
        "shape_only",
    )

    def __init__(self, func: Any, recompute: bool) -> None:
        schema = func._schema
        base = func._opname
        overload = func._overloadname
        self.name: bytes = (base if overload == "default" else f"{base}.{overload}").encode()
        positional: list[tuple[int, bool]] = []
        keyword: list[tuple[str, bool]] = []
        mutated: list[ArgKey] = []
        alias_set_owner: dict[str, ArgKey] = {}
        for i, arg in enumerate(schema.arguments):
            is_list = tensor_kind(arg.type)
            if is_list is None:
                continue
            key: ArgKey = arg.name if arg.kwarg_only else i
            if arg.kwarg_only:
                keyword.append((arg.name, is_list))
            else:
                positional.append((i, is_list))
            alias = arg.alias_info
            if alias is not None:
                if alias.is_write:
                    mutated.append(key)
                for s in alias.before_set:
                    alias_set_owner.setdefault(s, key)
        undeclared, writes_if = UNDECLARED_STATE_WRITES.get(base, ((), None))
        for i in undeclared:
            if i < len(schema.arguments) and tensor_kind(schema.arguments[i].type) is False and i not in mutated:
                mutated.append(i)
        self.tensor_args: tuple[tuple[int, bool], ...] = tuple(positional)
        self.tensor_kwargs: tuple[tuple[str, bool], ...] = tuple(keyword)
        self.mutable: bool = (bool(schema.is_mutable) or bool(undeclared)) and bool(mutated)
        self.mutated: frozenset[ArgKey] = frozenset(mutated)
        returns: list[ArgKey | None] = []
        for ret in schema.returns:
            alias = ret.alias_info
            source = None
            if alias is not None and alias.is_write:
                source = next((alias_set_owner[s] for s in alias.before_set if s in alias_set_owner), None)
            returns.append(source)
        self.returns_arg: tuple[ArgKey | None, ...] = tuple(returns)
        self.all_views: bool = bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)
        self.returns_tensors: bool = any(tensor_kind(r.type) is not None for r in schema.returns)
        self.fresh_results: bool = any(
            source is None and tensor_kind(r.type) is not None for r, source in zip(schema.returns, returns)
        )
        first = schema.arguments[0] if schema.arguments else None
        first_sets = (
            set(first.alias_info.before_set)
            if first is not None and first.alias_info is not None and not first.alias_info.is_write
            else set()
        )
        self.views_first: bool = (
            self.all_views
            and bool(first_sets)
            and all(set(r.alias_info.before_set) <= first_sets and not r.alias_info.is_write for r in schema.returns)
        )
        self.factory: bool = any(a.name == "device" for a in schema.arguments)
        tags = func.tags
        self.seeded: bool = torch.Tag.nondeterministic_seeded in tags
        self.reproducible: bool = torch.Tag.nondeterministic_bitwise not in tags and not base.lstrip("_").startswith(
            ("empty", "new_empty")
        )
        self.inplace_view: bool = torch.Tag.inplace_view in tags
        self.state_writes: tuple[int, ...] = tuple(undeclared)
        self.writes_if: int | None = writes_if
        self.pure: OpInfo | None = None
        unreplayable = func.namespace in UNREPLAYABLE_NAMESPACES
        self.flags: int = NO_RECOMPUTE if (unreplayable or not recompute) else 0
        self.shape_only: OpInfo | None = None
        if (
            base in SHAPE_ONLY_SELF
            and not self.mutable
            and self.factory
            and self.tensor_args[:1] == ((0, False),)
            and schema.arguments[0].name == "self"
        ):
            stand_in = copy.copy(self)
            stand_in.tensor_args = self.tensor_args[1:]
            self.shape_only = stand_in
        if self.state_writes:
            pure = copy.copy(self)
            pure.mutable = False
            pure.mutated = frozenset()
            pure.state_writes = ()
            pure.writes_if = None
            self.pure = pure

    def writes_nothing(self, args: Any, kwargs: dict[str, Any]) -> bool:
        """Whether this call of an op with undeclared state writes leaves its
        arguments alone (its ``training`` flag is false)."""
        i = self.writes_if
        if i is None:
            return False
        return i < len(args) and not args[i]

    def label(self) -> str:
        """The op's name for messages (``aten::add.Tensor`` style without the
        namespace)."""
        return self.name.decode()


def tensor_kind(t: Any) -> bool | None:
    """``False`` for Tensor / Tensor?, ``True`` for Tensor[] / Tensor?[], else None."""
    kind = t.kind()
    if kind == "OptionalType":
        t = t.getElementType()
        kind = t.kind()
    if kind == "TensorType":
        return False
    if kind == "ListType":
        element = t.getElementType()
        if element.kind() == "OptionalType":
            element = element.getElementType()
        if element.kind() == "TensorType":
            return True
    return None
