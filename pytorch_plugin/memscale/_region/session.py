"""The per-step session: one entry of a region, its op path and its exit.

A :class:`Session` lives from a region's ``__enter__`` to its ``__exit__``.
It is built in layers, one module each, every one importing only those below:

* :mod:`.state` (:class:`~.state.SessionState`): the engine instance and the
  tables Python keeps next to it (storage groups, recorded ops, live
  wrappers, queued releases), the budget, the evictions, the releases;
* :mod:`.externals` (:class:`~.externals.SessionExternals`): plain tensors
  registered as externals, pinned gradients, reads of a wrapper;
* this module: :meth:`Session.dispatch` runs new ops (:mod:`.dispatch`), and
  :meth:`Session.close` makes what escapes resident, detaches it and
  destroys the engine.

:mod:`.rebuild` (making evicted cells resident) works on the state; the op
path (:mod:`.dispatch`, :mod:`.outputs`, :mod:`.inplace`, :mod:`.shapes`) on
the externals' layer.

Holds no policy: the engine decides what is evicted, when, and how much room
an op needs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .._native.engine import NoRoomError
from ..errors import MemscaleError
from . import rebuild, reclaim
from .cells import Cell, HeldCells
from .device import sync_count
from .dispatch import dispatch
from .externals import SessionExternals
from .tensor import DTRTensor, hand_back


class Session(SessionExternals):
    """One entry of a region: its state (:mod:`.state`, :mod:`.externals`),
    the op path and the exit."""

    # -------------------------------------------------------- operations

    def dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """Run one ATen op inside this entry (see :mod:`.dispatch`)."""
        return dispatch(self, func, args, kwargs)

    # -------------------------------------------------------------- close

    def close(self, ok: bool) -> dict[str, Any]:
        """Make what escapes resident, detach it, destroy the engine instance.

        Returns the engine's final stats (empty when they could not be read).
        """
        with self.lock:
            return self._close(ok)

    def _close(self, ok: bool) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        try:
            self.flush()
            escaping = [ref.cell for ref in list(self.live.values()) if ref.cell is not None and ref() is not None]
            if ok:
                # Everything that leaves must be resident, within the budget:
                # the engine's errors now name what leaves the step.
                self.engine.finish()
                try:
                    self._room_to_leave(escaping)
                except NoRoomError as exc:
                    # The step fails at its end: nothing is handed back, and
                    # the error carries the step's stats (its minimum budget
                    # is the one the error names), which the region's exit
                    # does not get to record.
                    ok = False
                    self._plain_gradients()
                    exc.stats = self.engine.stats()  # type: ignore[attr-defined]
                    raise
                rebuild.make_all_resident(self, escaping)
            self._plain_gradients()
            stats = self.engine.stats()
            if ok and stats.get("auto"):
                self._tune()
        finally:
            self._detach_everything(ok)
        return stats

    def _room_to_leave(self, escaping: list[Cell]) -> None:
        """Under a budget: room for every escaping storage at once, before
        any is rebuilt - the resident ones locked, the others' bytes
        requested - so a budget below what leaves the step fails here, with
        that bound (the step's minimum budget), and never goes over."""
        if not self.budgeted or self.stress:
            return
        seen: set[int] = set()
        missing = 0
        with HeldCells(self.engine) as held:
            for cell in escaping:
                group = self.groups.get(cell.root)
                if group is None or cell.root in seen:
                    continue
                seen.add(cell.root)
                resident = [c for c in group.cells if c.tensor is not None]
                if not resident:
                    missing += group.nbytes
                    continue
                lockable = next((c for c in resident if not c.released and c.session is self), None)
                if lockable is not None:
                    held.lock(lockable)
            if missing:
                self.make_room(missing, b"what leaves the step")

    def _plain_gradients(self) -> None:
        """``.grad`` of the parameters seen in the entry: plain tensors again."""
        with torch.no_grad(), _disable_current_modes():
            for ref in self.leaves:
                param = ref()
                if param is not None and type(param.grad) is DTRTensor:
                    param.grad = param.grad._c.tensor

    def _tune(self) -> None:
        """Have the engine choose the configuration of later entries
        (``memscale_dtr_tune``); a failure is kept, not raised: the step
        itself succeeded."""
        try:
            self.tuning = self.engine.tune()
        except MemscaleError as exc:
            self.tune_error = str(exc)

    def synchronizations(self) -> int:
        """How many times the entry's code waited for the device."""
        end = self._sync_end if self._sync_end is not None else sync_count()
        return end - self.sync_mark

    def _detach_everything(self, ok: bool = False) -> None:
        self._sync_end = sync_count()
        self.closed = True
        escaping: set[Cell] = set()
        handed = self._detach_wrappers(escaping, ok)
        # A cell and the weak reference that names it refer to each other: a
        # cycle the collector would free only on its own schedule, holding the
        # cell's tensor until then (a GPT-2 step touched ~50 MiB of fresh
        # memory per step that way). Nothing reads a cell no live wrapper
        # names after the exit: drop its data and the cycle now.
        for group in self.groups.values():
            for cell in group.cells:
                if cell not in escaping:
                    cell.wrapper_ref = None
                    cell.tensor = None
                    cell.session = None
        for hook in self.grad_hooks:
            hook.remove()
        self.grad_hooks.clear()
        self.pinned_grads.clear()
        for ref in self.externals.values():
            cell = ref.cell
            if cell is not None:
                cell.session = None
                cell.tensor = None
            ref.cell = None
        for container in (self.ops, self.groups, self.externals, self.external_roots):
            container.clear()
        self.leaves.clear()
        self.graph_nodes.clear()
        self.released.clear()
        if self.reclaims_for is not None:
            reclaim.unregister(self, self.reclaims_for)
        self.engine.close()
        # A view's wrapper references its base's (autograd's view base): the
        # base is handed back once its views were, so go round until a round
        # hands back nothing.
        while handed:
            left = [(w, t) for w, t in handed if not hand_back(w, t)]
            if len(left) == len(handed):
                break
            handed = left

    def _detach_wrappers(self, escaping: set[Cell], ok: bool) -> list[tuple[DTRTensor, torch.Tensor]]:
        """Detach every live wrapper from the entry (its cell into ``escaping``);
        returns those to hand back as plain tensors (:func:`.tensor.hand_back`:
        the entry succeeded, the data is resident, nothing needs the wrapper's
        autograd history), their weak references already dropped."""
        handed: list[tuple[DTRTensor, torch.Tensor]] = []
        for ref in list(self.live.values()):
            cell = ref.cell
            if cell is not None:
                cell.session = None
                cell.tensor_id = -1
                escaping.add(cell)
                if ok and cell.tensor is not None:
                    wrapper = ref()
                    if wrapper is not None and not wrapper.requires_grad:
                        handed.append((wrapper, cell.tensor))
                        cell.wrapper_ref = None
            ref.cell = None
        self.live.clear()
        return handed
