"""Residency bookkeeping: cells, storage groups and recorded ops.

A **cell** is one version of one tensor of a region entry: the engine's tensor
id and the real tensor, or ``None`` while the engine has it evicted. A wrapper
(:class:`~memscale._region.tensor.DTRTensor`) names a cell; an in-place op moves
the wrapper to the new version's cell. A **storage group** is every cell sharing
one storage (the engine's storage root): views are evicted, swapped and rebuilt
with their base. A **recorded op** is what it takes to re-run an op on the
current data of its input cells.

Invariants (kept by the session, the dispatcher and the rebuilder):

* ``cell.tensor is None`` exactly when the engine does not hold the cell's
  storage resident, or holds it but the view was not re-derived yet (a plan of
  zero steps re-derives it);
* ``group.live_refs`` counts the cells of the group not released to the engine
  (the engine's references to the storage);
* ``group.host_copy`` is set exactly while the storage is swapped out, and
  ``group.swapped_views`` then gives each cell's geometry in it.

:class:`HeldCells` is the one way cells are locked for a piece of work: a
context manager that unlocks what it holds however the work ends.

Holds data only (and the locks of :class:`HeldCells`); no dispatch. The
bottom of the region's modules with :mod:`.schema`: a cell names its entry
through :class:`Owner`, the little it needs of :class:`~.session.Session`.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Final, Protocol

import torch

from ..errors import MemscaleError

if TYPE_CHECKING:
    from .._native.engine import Engine

#: Kinds of recorded ops (how a re-run runs them).
RERUN_CALL: Final[int] = 0  # re-run func; outputs map to the op's output cells
RERUN_MUTATION: Final[int] = 1  # re-run an in-place op on a copy of the old version
RERUN_VIEW: Final[int] = 2  # re-derive a view of a storage from its geometry

#: ``(dtype, size, stride, storage offset, conjugate bit, negative bit)``: where
#: a view sits in its storage and how its data is read (a lazily conjugated or
#: negated view reads the same memory as its source).
Geometry = tuple[torch.dtype, tuple[int, ...], tuple[int, ...], int, bool, bool]


class Owner(Protocol):
    """What a cell's wrapper needs of the entry the cell belongs to
    (:class:`~.session.Session`): whether it is closed, a read that rebuilds an
    evicted cell, and the op path for ops on wrappers outside the mode
    (:func:`~.tensor.dispatch_outside`)."""

    closed: bool

    def read(self, cell: Cell) -> torch.Tensor | None: ...

    def dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any: ...


class Cell:
    """One version of one tensor of a region entry.

    Attributes:
        tensor_id: the engine's tensor id (``-1`` once detached from its entry).
        tensor: the real tensor, or ``None`` while evicted / not re-derived.
        root: the engine id of the storage's root tensor (the key of the
            session's storage groups).
        op_id: the recorded op that produces this version (``-1``: external).
        wrapper_ref: weak reference to whatever names this version now (a
            wrapper, or the user's plain tensor for an external).
        session: the entry the cell belongs to (``None`` once detached).
        released: the engine was told no wrapper names the cell any more.
        pinned: never evicted nor re-run (externals and their new versions).
        consumed: (pinned cells) a recorded op read it: overwriting its
            storage in place copies the old data first (copy-on-write).
    """

    __slots__ = ("tensor_id", "tensor", "root", "op_id", "wrapper_ref", "session", "released", "pinned", "consumed")

    def __init__(
        self,
        tensor_id: int,
        tensor: torch.Tensor | None,
        root: int,
        op_id: int,
        session: Owner | None,
        pinned: bool = False,
    ) -> None:
        self.tensor_id = tensor_id
        self.tensor = tensor
        self.root = root
        self.op_id = op_id
        self.wrapper_ref: WrapperRef | None = None
        self.session = session
        self.released = False
        self.pinned = pinned
        self.consumed = False

    def __repr__(self) -> str:
        state = "resident" if self.tensor is not None else "evicted"
        released = " released" if self.released else ""
        return f"<cell {self.tensor_id} root={self.root} op={self.op_id} {state}{released}>"


class WrapperRef(weakref.ref):  # type: ignore[type-arg]
    """Weak reference to a wrapper (or an external's plain tensor) that knows
    the cell it currently names; its callback queues the cell's release."""

    __slots__ = ("cell",)

    cell: Cell | None


class StorageGroup:
    """The cells sharing one storage (an engine storage root), and its swap state."""

    __slots__ = ("cells", "live_refs", "nbytes", "host_copy", "swapped_views")

    def __init__(self, cell: Cell, nbytes: int) -> None:
        self.cells: set[Cell] = {cell}
        self.live_refs = 1
        self.nbytes = nbytes
        #: ``(host storage, device, event after the copy out or None)`` while swapped out.
        self.host_copy: tuple[Any, torch.device, Any] | None = None
        self.swapped_views: dict[Cell, Geometry] | None = None

    def add(self, cell: Cell) -> None:
        """A new live cell on this storage (a view, an alias, a re-registration)."""
        self.cells.add(cell)
        self.live_refs += 1

    def drop_data(self) -> None:
        """Forget every cell's data (the engine dropped or freed the storage)."""
        for cell in self.cells:
            cell.tensor = None
        self.host_copy = None
        self.swapped_views = None


class HeldCells:
    """Cells locked in the engine for one piece of work, unlocked together.

    Used as a context manager: leaving the block unlocks every cell still held;
    when the block raises, the unlocks' own errors are suppressed so the first
    error is the one the caller sees. :meth:`release` unlocks early.
    """

    __slots__ = ("engine", "cells")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.cells: list[Cell] = []

    def lock(self, cell: Cell) -> None:
        """Lock ``cell`` and hold it."""
        self.engine.lock(cell.tensor_id)
        self.cells.append(cell)

    def lock_all(self, cells: list[Cell]) -> None:
        """Lock each of ``cells`` (a failure leaves the ones locked so far held)."""
        for cell in cells:
            self.lock(cell)

    def adopt(self, cell: Cell) -> None:
        """Hold a cell that is locked already (:func:`.rebuild.materialize` returns it so)."""
        self.cells.append(cell)

    def release(self) -> None:
        """Unlock every held cell now."""
        cells, self.cells = self.cells, []
        unlock = self.engine.unlock
        for cell in cells:
            unlock(cell.tensor_id)

    def release_quietly(self) -> None:
        """Unlock every held cell, ignoring the engine's errors (error paths)."""
        cells, self.cells = self.cells, []
        for cell in cells:
            try:
                self.engine.unlock(cell.tensor_id)
            except MemscaleError:
                pass

    def __enter__(self) -> HeldCells:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.release()
        else:
            self.release_quietly()


class RecordedOp:
    """A recorded op: enough to re-run it on the current data of its inputs.

    Attributes:
        func: the ATen overload (``None`` for :data:`RERUN_VIEW`).
        args / kwargs: the op's arguments with each tensor replaced by its
            input cell (lists of cells for ``Tensor[]``); for
            :data:`RERUN_VIEW`, ``args`` is the view's :data:`Geometry`.
        inputs: the input cells in flattened order.
        outputs: the output cells (the new versions for :data:`RERUN_MUTATION`).
        rng_state: ``(generator, state)`` for seeded ops, else ``None``.
        kind: :data:`RERUN_CALL`, :data:`RERUN_MUTATION` or :data:`RERUN_VIEW`.
        mutated: for :data:`RERUN_MUTATION`, the flattened input indices written.
        scratch: argument positions / keywords a re-run gets copies of.
        grad_mode: whether grad mode was on when the op first ran (a re-run
            runs under it: some kernels return more outputs with grad mode
            on, as ``mkldnn_rnn_layer`` returns its workspace).
    """

    __slots__ = ("func", "args", "kwargs", "inputs", "outputs", "rng_state", "kind", "mutated", "scratch", "grad_mode")

    def __init__(
        self,
        func: Any,
        args: Any,
        kwargs: dict[str, Any] | None,
        inputs: list[Cell],
        outputs: list[Cell],
        rng_state: tuple[Any, torch.Tensor] | None,
        kind: int,
        mutated: tuple[int, ...] = (),
        scratch: tuple[Any, ...] = (),
        grad_mode: bool = True,
    ) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.inputs = inputs
        self.outputs = outputs
        self.rng_state = rng_state
        self.kind = kind
        self.mutated = mutated
        self.scratch = scratch
        self.grad_mode = grad_mode


def geometry(t: torch.Tensor) -> Geometry:
    """Where ``t`` sits in its storage, with its conjugate and negative bits."""
    return (t.dtype, tuple(t.size()), tuple(t.stride()), t.storage_offset(), t.is_conj(), t.is_neg())


def storage_view(storage: Any, g: Geometry) -> torch.Tensor:
    """A tensor of geometry ``g`` on ``storage`` (the inverse of :func:`geometry`)."""
    dtype, size, stride, offset, conj, neg = g
    t = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)
    if conj:
        torch._C._set_conj(t, True)
    if neg:
        torch._C._set_neg(t, True)
    return t
