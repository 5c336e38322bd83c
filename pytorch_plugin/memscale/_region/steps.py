"""Training steps inside one region: the optimizer step is a step boundary.

A region may span many training steps with ``optimizer.step()`` inside it
(``with memscale.dtr(budget): for batch in data: ... optimizer.step()``). Across
steps, DTR's lineage would otherwise grow without end: the optimizer overwrites
parameters and its own state in place, so everything computed from their old
values (the loss the program still holds, the momentum chain) could only be
rebuilt from values that no longer exist, and the engine's graph would keep
every op of every step.

So each ``torch.optim`` optimizer step ends a step of the innermost region
entered on the thread (:meth:`DTRRegion.end_step`): what the step leaves behind
is made resident and plain, exactly as at the region's exit (gradients, the
loss, anything the program holds), the step's engine is destroyed (its
counters go into the region's summary), and the region goes on with a fresh
engine. The update itself runs as outside the region (the region is suspended
from the optimizer's step pre-hook to its post-hook), so parameters and
optimizer state stay plain tensors, as they are in a region-per-step loop. An
optimizer step given a closure (LBFGS, Lightning) runs the closure - forward
and backward - under DTR as a step of its own. A loop that updates parameters
without a ``torch.optim`` optimizer calls :meth:`DTRRegion.end_step` itself
(its updates then run inside the region, as any other op).

Regions the drop-in API and :func:`memscale.enable` open are closed by their own
hooks at the same point, and are left alone here.

Holds the thread-local stack of entered regions and the one global optimizer
step pre-hook (installed at the first region entry).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from .tensor import unwrap


class SteppedRegion(Protocol):
    """What the optimizer's hooks need of a region (:class:`~.region.DTRRegion`,
    which sits above this module and registers its entries here)."""

    step_boundaries: bool

    @property
    def is_entered(self) -> bool: ...

    def end_step(self) -> None: ...

    def suspend(self, suspended: bool = True) -> None: ...


_local = threading.local()
_hook_lock = threading.Lock()
_hook: Any = None


def _stack() -> list[SteppedRegion]:
    stack: list[SteppedRegion] | None = getattr(_local, "regions", None)
    if stack is None:
        stack = _local.regions = []
    return stack


def entered(region: SteppedRegion) -> None:
    """``region`` was entered on this thread."""
    global _hook
    _stack().append(region)
    if _hook is None:
        with _hook_lock:
            if _hook is None:
                from torch.optim.optimizer import (
                    register_optimizer_step_post_hook,
                    register_optimizer_step_pre_hook,
                )

                _hook = (
                    register_optimizer_step_pre_hook(_optimizer_step_pre_hook),
                    register_optimizer_step_post_hook(_optimizer_step_post_hook),
                )


def open_region() -> SteppedRegion | None:
    """The region entered on this thread, if any (regions do not nest)."""
    stack = _stack()
    return stack[-1] if stack else None


def exited(region: SteppedRegion) -> None:
    """``region`` was exited on this thread."""
    stack = _stack()
    if region in stack:
        stack.remove(region)


def _ends_steps(region: SteppedRegion) -> bool:
    return region.step_boundaries and region.is_entered


def _optimizer_step_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
    """End the step of the innermost region before the update (and after a closure)."""
    stack = _stack()
    if not stack or not _ends_steps(stack[-1]):
        return None
    region = stack[-1]
    region.end_step()
    region.suspend()
    _local.suspended = region

    def in_its_own_step(closure: Callable[[], Any]) -> Callable[[], Any]:
        def closure_then_end_step() -> Any:
            region.suspend(False)
            try:
                result = closure()
            finally:
                if _ends_steps(region):
                    region.end_step()
                    region.suspend()
            return unwrap(result)

        return closure_then_end_step

    return wrap_closure(args, kwargs, in_its_own_step)


def wrap_closure(
    args: tuple[Any, ...], kwargs: dict[str, Any], wrap: Callable[[Callable[[], Any]], Callable[[], Any]]
) -> tuple[Any, Any] | None:
    """What an optimizer step pre-hook returns to run ``wrap(closure)`` in place
    of the step's closure (``None``: the step was given none). ``args`` is the
    step's positional arguments as the hook sees them: the optimizer first."""
    if callable(kwargs.get("closure")):
        return args, {**kwargs, "closure": wrap(kwargs["closure"])}
    if len(args) > 1 and callable(args[1]):
        return (args[0], wrap(args[1]), *args[2:]), kwargs
    return None


def _optimizer_step_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The update is done: the region suspended by the pre-hook runs DTR again."""
    region = getattr(_local, "suspended", None)
    if region is not None:
        _local.suspended = None
        region.suspend(False)
