"""Which objects memscale wraps now, and their totals: the registry behind
:func:`memscale.summary`, :func:`memscale.end_step` and :mod:`memscale.metrics`.

:func:`memscale.wrap` and :func:`memscale.optimize` (:mod:`memscale._dropin.api`)
put an :class:`Attachment` here; the Trainer callback (:mod:`memscale.hf`) and the
metrics server read it. Below them all, so none of them imports another.

Holds the registry (weak: a wrapped model that is dropped is not kept alive); no policy.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from .._stats import Summary
from ..errors import MemscaleError
from .steps import Steps


class Summarized:
    """A handle that answers :func:`summary` itself (:func:`memscale.optimize`'s)."""

    def summary(self) -> Summary:
        """Totals so far."""
        raise NotImplementedError


class Hooks:
    """The handles a wrap/optimize put on a model; removing them detaches."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


@dataclass
class Attachment:
    """What a wrap() or optimize() put on an object: its steps, its hooks, how to undo it."""

    steps: Steps
    hooks: Hooks
    kind: str  # "module", "trainer", "lightning", "optimize" or "blocks" (Config(unit="block"))
    callback: Any = None
    original_training_step: Any = None  # an instance-level training_step that wrap replaced


# Module / Trainer / optimize handle -> attachment. Weak, so a wrapped model that
# is dropped is not kept alive by memscale.
attached: weakref.WeakKeyDictionary[Any, Attachment] = weakref.WeakKeyDictionary()
# Totals of detached objects, so summary() still answers after detach().
detached: weakref.WeakKeyDictionary[Any, Summary] = weakref.WeakKeyDictionary()


def end_step(obj: Any = None) -> None:
    """Close the open step region of a wrapped model, or with no argument of
    :func:`memscale.enable` (for loops without a ``torch.optim`` optimizer)."""
    if obj is None:
        from .enable import enabled

        current = enabled()
        if current is None:
            raise MemscaleError("memscale.end_step(): memscale.enable() was not called; pass the wrapped model")
        current.end_step()
        return
    attachment = attached.get(obj)
    if attachment is None:
        raise MemscaleError(f"{type(obj).__name__} is not wrapped by memscale")
    attachment.steps.end()


def attached_summaries() -> list[tuple[str, Summary]]:
    """``(class name and id, totals)`` of every object wrapped now (for
    :mod:`memscale.metrics`)."""
    seen: set[int] = set()
    out = []
    for obj, attachment in list(attached.items()):
        if id(attachment) in seen or isinstance(obj, Summarized):
            continue
        seen.add(id(attachment))
        out.append((f"{type(obj).__name__}@{id(obj):x}", attachment.steps.summary()))
    return out


def summary(obj: Any = None) -> Summary:
    """What memscale did for a wrapped model/Trainer, an :func:`optimize` handle,
    or with no argument under :func:`memscale.enable`.

    After :func:`detach` it returns the totals as they were at detach.
    """
    if obj is None:
        from .enable import enabled

        current = enabled()
        if current is None:
            raise MemscaleError("memscale.summary(): memscale.enable() was not called; pass the wrapped object")
        return current.summary()
    if isinstance(obj, Summarized):
        return obj.summary()
    attachment = attached.get(obj)
    if attachment is not None:
        return attachment.steps.summary()
    if obj in detached:
        return detached[obj]
    raise MemscaleError(f"{type(obj).__name__} was never wrapped by memscale")
