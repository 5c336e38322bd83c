"""The dispatch mode of one region entry: every ATen op goes to its session.

:class:`RegionMode` is pushed by :meth:`DTRRegion.__enter__
<memscale._region.region.DTRRegion.__enter__>` and popped by its exit. Besides
handing ops to :func:`~.dispatch.dispatch` it runs ops plainly while an
optimizer updates parameters (``suspended``), waits for functional collectives,
and, for the drop-in steps, notices a backward pass that raised (``failed``).
Holds no per-op logic and no policy.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..errors import MemscaleError
from .dispatch import dispatch
from .session import Session
from .tensor import dispatch_outside, unwrap_tree

_graph_task_id = torch._C._current_graph_task_id
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback


class RegionMode(TorchDispatchMode):
    """The dispatch mode of one entry: every ATen op goes to its session."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo
        # (about 2 us per op); a DTR region is not compiled through anyway.
        return False

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        #: While set (an optimizer updating parameters, see :mod:`.steps`), ops
        #: run as they would outside the region.
        self.suspended = False
        #: Whether a backward pass that raised ends the entry's tracking (a
        #: region that drop-in steps enter and leave around the program's own
        #: code: see :attr:`DTRRegion.ends_on_failed_backward`).
        self.watch_backward = False
        #: Autograd graph tasks (backward passes) seen running ops in this
        #: entry and not finished yet: each queues a callback that autograd
        #: runs when the pass completes, which it never does for a pass that
        #: raised.
        self._backwards: set[int] = set()
        #: Set once an op runs outside backward while a backward pass never
        #: finished (it raised, and the program caught the error): every op
        #: then runs as plain PyTorch on plain tensors (region tensors read
        #: back), so the program goes on while the step waits to be closed.
        self.failed: BaseException | None = None
        self._async_wrap = _async_collective_wrap()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.suspended:
            return dispatch_outside(func, args, kwargs or {})
        if self.watch_backward and self._watch():
            with _disable_current_modes():
                return func(*unwrap_tree(list(args)), **unwrap_tree(kwargs or {}))
        if func is self._async_wrap:
            # A functional collective's result is waited for now, as PyTorch does
            # when tracing: a region holds plain tensors, not AsyncCollectiveTensors.
            func = torch.ops._c10d_functional.wait_tensor.default
        session = self.session
        with session.lock:
            return dispatch(session, func, args, kwargs or {})

    def _watch(self) -> bool:
        """Follow the backward passes; whether this op is to run plainly
        because one raised (see :attr:`failed`): every op after that does,
        a later backward pass's included."""
        if self.failed is not None:
            return True
        task = _graph_task_id()
        if task != -1:
            if task not in self._backwards:
                self._backwards.add(task)
                _queue_callback(lambda: self._backwards.discard(task))
            return False
        if not self._backwards:
            return False
        self._backwards.clear()
        self.failed = MemscaleError("the step's backward pass raised (the error went to the program)")
        try:  # the step is over: its budget no longer binds, its plans go
            self.session.engine.abandon_plans()
            self.session.engine.finish()
        except MemscaleError:
            pass
        return True

    def backward_failure(self) -> BaseException | None:
        """:attr:`failed`, first noticing (outside backward) a pass that raised."""
        if self.failed is None and self._backwards and _graph_task_id() == -1:
            self._watch()
        return self.failed


def _async_collective_wrap() -> Any:
    """``_c10d_functional._wrap_tensor_autograd`` (the op that wraps a functional
    collective's result in an ``AsyncCollectiveTensor``), or ``None`` while
    functional collectives are not loaded."""
    if "torch.distributed._functional_collectives" not in sys.modules:
        return None
    packet = getattr(torch.ops._c10d_functional, "_wrap_tensor_autograd", None)
    return packet.default if packet is not None else None
