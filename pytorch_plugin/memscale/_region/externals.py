"""The session's externals: plain tensors an entry's ops read, and gradients.

:class:`SessionExternals` adds to the session's state (:mod:`.state`) the cell
of every op argument (:meth:`~SessionExternals.cell_of`): a plain tensor - a
parameter, an input, a wrapper of an earlier entry - is registered pinned on
first sight (an *external*, held through an alias of its storage and released
when the program drops it), the leaves of autograd graphs built outside the
entry are noted, and accumulated gradients are pinned. It also reads a cell
for user code (:meth:`~SessionExternals.read`: rebuilt if evicted, through
:mod:`.rebuild`, which sits below it). The op path itself is
:class:`~.session.Session`'s (:mod:`.dispatch` sits above this module).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .._native.engine import NO_RECOMPUTE
from ..errors import MemscaleError
from . import rebuild, volatile
from .cells import Cell, HeldCells, StorageGroup, WrapperRef
from .state import SessionState
from .tensor import DTRTensor, plain_of


class SessionExternals(SessionState):
    """A session's state with its externals, pinned gradients and reads."""

    def cell_of(self, x: Any) -> Cell | None:
        """The cell of an op argument; ``None`` for a non-tensor (a wrapped
        scalar) and for a tensor without storage (an efficient zero tensor,
        as ``sgn``'s backward makes): those take part in ops as constants."""
        if type(x) is DTRTensor:
            cell = x._c
            if cell.session is self:
                return cell
            if x.grad_fn is not None:  # a graph an earlier entry built
                self._note_graph(x.grad_fn)
            return self.extern(plain_of(x))
        if isinstance(x, torch.Tensor):
            return self.extern(x)
        return None

    def _note_graph(self, root: Any) -> None:
        """Note the leaves of an autograd graph built outside this entry
        (reached from ``root``, a node of it): a backward through it
        accumulates their gradients here, though no op of the entry may read
        them (a GAN's generator, trained through the discriminator), and
        :meth:`.session.Session._plain_gradients` must make those plain too. Each node is
        walked once per entry."""
        seen = self.graph_nodes
        stack = [root]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            leaf = getattr(node, "variable", None)
            if type(leaf) is torch.nn.Parameter or (isinstance(leaf, torch.Tensor) and leaf.requires_grad):
                if id(leaf) not in seen:
                    seen.add(id(leaf))
                    self.leaves.append(weakref.ref(leaf))
                    self.grad_hooks.append(leaf.register_post_accumulate_grad_hook(self._pin_gradient))
                continue
            stack.extend(next_node for next_node, _ in node.next_functions)

    def extern(self, t: torch.Tensor) -> Cell | None:
        """The cell of a plain tensor (registered pinned on first sight);
        ``None`` for a tensor without storage.

        The cell holds an alias of ``t`` (same storage), not ``t`` itself, and
        a weak reference to ``t``: when the program drops ``t`` the engine is
        told (a release), so a temporary plain tensor used in the region is
        freed like any other once nothing needs it.
        """
        ref = self.externals.get(id(t))
        if ref is not None and ref() is t and ref.cell is not None:
            return ref.cell
        if type(t) is DTRTensor:  # a wrapper detached from an earlier entry
            return self.extern(plain_of(t))
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
        except (RuntimeError, NotImplementedError) as exc:
            if t.layout == torch.strided and t._is_zerotensor():
                return None  # type: ignore[return-value]  # no storage: a constant
            raise MemscaleError(
                f"memscale.dtr: a {t.layout} tensor was passed to an op; only strided (dense) "
                f"tensors can be used in a DTR region - convert it with .to_dense() first ({exc})"
            ) from exc
        root = self.external_roots.get(ptr) if ptr else None
        if t.grad_fn is not None:  # a graph built outside the region
            self._note_graph(t.grad_fn)
        if root is not None and root.tensor is not None and not root.released:
            cell = self._register_external_alias(t, root)
        else:
            cell = self._register_external(t, storage.nbytes(), ptr)
        ref = WrapperRef(t, self.queue_release)
        ref.cell = cell
        cell.wrapper_ref = ref
        self.externals[id(t)] = ref
        if t.requires_grad and t.is_leaf:
            self.leaves.append(weakref.ref(t))
            self.grad_hooks.append(t.register_post_accumulate_grad_hook(self._pin_gradient))
        return cell

    def _register_external(self, t: torch.Tensor, nbytes: int, ptr: int) -> Cell:
        if self.budgeted and nbytes:
            # Room first, so registering never takes usage over the budget
            # (dispatch then re-checks the residency of the op's other inputs).
            self.make_room(nbytes, b"an external tensor")
            self.externals_registered += 1
        tensor_id = self.engine.tensor(nbytes, pinned=True)
        cell = Cell(tensor_id, t.detach(), tensor_id, -1, self, pinned=True)
        if volatile.is_volatile(t):
            self.volatile_roots.add(tensor_id)
        self.groups[tensor_id] = StorageGroup(cell, nbytes)
        if ptr:
            self.external_roots[ptr] = cell
        if self.sink is not None:
            self.sink.external(cell, nbytes)
        return cell

    def _register_external_alias(self, t: torch.Tensor, root: Cell) -> Cell:
        """A second external on a registered external's storage: an alias of it."""
        _, (tensor_id,) = self.engine.call(b"alias", [root.tensor_id], [t.nbytes], [0], 0, NO_RECOMPUTE)
        cell = Cell(tensor_id, t.detach(), root.root, -1, self, pinned=True)
        self.groups[root.root].add(cell)
        if self.sink is not None:
            self.sink.call(b"alias", [root], [cell], [t.nbytes], [0], 0)
        return cell

    def repoint(self, old: Cell, new: Cell) -> None:
        """Make whatever named ``old`` (a wrapper or an external) name ``new``."""
        ref = old.wrapper_ref
        if ref is not None:
            named = ref()
            if type(named) is DTRTensor:
                named._c = new
            ref.cell = new
            new.wrapper_ref = ref
            old.wrapper_ref = None
        if old.pinned and old.tensor is not None:
            ptr = old.tensor.untyped_storage().data_ptr()
            if ptr and self.external_roots.get(ptr) is old:
                self.external_roots[ptr] = new

    def _pin_gradient(self, param: torch.Tensor) -> None:
        """A parameter's ``.grad`` was accumulated: pin it for this entry.

        Gradients outlive the step and are read by the optimizer; evicting one
        would mean re-running the backward pass that produced it.
        """
        grad = param.grad
        if type(grad) is not DTRTensor or self.closed:
            return
        cell = grad._c
        if cell.session is not self or cell in self.pinned_grads:
            return
        if cell.tensor is None:
            with self.lock, _disable_current_modes(), HeldCells(self.engine) as held:
                rebuild.materialize(self, cell)
                held.adopt(cell)
                self.engine.pin(cell.tensor_id)
        else:
            self.engine.pin(cell.tensor_id)
        self.pinned_grads.add(cell)


    # ------------------------------------------------------------- reads

    def read(self, cell: Cell) -> torch.Tensor | None:
        """``cell``'s tensor, rebuilt if it was evicted (user code reading a wrapper)."""
        with self.lock, HeldCells(self.engine) as held:
            rebuild.materialize(self, cell)
            held.adopt(cell)
        self.sync()
        return cell.tensor

    def dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """Run one ATen op inside this entry: :class:`~.session.Session`'s
        (:mod:`.dispatch`, which works on this class, sits above it)."""
        raise NotImplementedError
