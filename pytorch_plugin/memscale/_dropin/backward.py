"""The end of a backward pass: where a drop-in training step ends.

A training step is the forward passes that build a graph and the backward pass
that consumes it. Whatever the program does next - a ``torch.optim`` step, a
hand-written update (``p.data.add_(p.grad, alpha=-lr)``, ``p -= lr * p.grad``
under ``no_grad``), gradient clipping, logging, evaluation, fetching the next
batch, the next micro-batch of gradient accumulation - is not part of that
step's graph, so the step ends when the backward pass returns, on the thread
that called it. No optimizer is needed to find the boundary.

:func:`listen` registers a callback run after every outermost
``Tensor.backward()`` / ``torch.autograd.backward()`` and ``torch.autograd.grad()``
that returned normally, and its ``on_raise(exc)`` after one that raised (the
step is over, failed: it is closed before the error reaches the program).
Passes that build a graph for a later backward (``create_graph=True``: a
gradient penalty, double backward) and passes nested in another (a reentrant
checkpoint's recomputation) end nothing; a listener without ``on_raise`` ends
nothing at a pass that raised (the region closes such a step itself at its
next op, see ``DTRRegion.ends_on_failed_backward``).

The two functions are wrapped in ``torch.autograd`` while any callback is
registered (``Tensor.backward`` calls ``torch.autograd.backward`` through the
module) and restored when the last is removed. Holds the registry; no policy.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_listeners: dict[int, tuple[Callable[[], None], Callable[[BaseException], None] | None]] = {}
_next_id = 0
_originals: dict[str, Any] = {}
_local = threading.local()


class Listening:
    """The handle :func:`listen` returns; ``remove()`` unregisters the callback."""

    def __init__(self, key: int) -> None:
        self._key = key

    def remove(self) -> None:
        with _lock:
            if _listeners.pop(self._key, None) is not None and not _listeners:
                _restore()


def listen(callback: Callable[[], None], on_raise: Callable[[BaseException], None] | None = None) -> Listening:
    """Run ``callback()`` after each outermost backward pass that returned,
    ``on_raise(exc)`` after one that raised ``exc`` (see the module's
    docstring); returns a handle with ``remove()``."""
    global _next_id
    with _lock:
        if not _listeners:
            _install()
        _next_id += 1
        _listeners[_next_id] = (callback, on_raise)
        return Listening(_next_id)


def _creates_graph(args: tuple[Any, ...], kwargs: dict[str, Any], position: int) -> bool:
    value = kwargs.get("create_graph", args[position] if len(args) > position else False)
    return bool(value)


def _notify(raised: BaseException | None = None) -> None:
    if getattr(_local, "notifying", False):
        return  # a callback's own backward (a region draining autograd's queue)
    _local.notifying = True
    try:
        for callback, on_raise in list(_listeners.values()):
            if raised is None:
                callback()
            elif on_raise is not None:
                on_raise(raised)
    finally:
        _local.notifying = False


def _wrapped(name: str, original: Any, create_graph_position: int) -> Any:
    import torch

    graph_task_id = torch._C._current_graph_task_id

    @functools.wraps(original)
    def backward_then_end_step(*args: Any, **kwargs: Any) -> Any:
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            if graph_task_id() == -1 and not _creates_graph(args, kwargs, create_graph_position):
                _notify(exc)
            raise
        if graph_task_id() == -1 and not _creates_graph(args, kwargs, create_graph_position):
            _notify()
        return result

    backward_then_end_step.__memscale_original__ = original  # type: ignore[attr-defined]
    return backward_then_end_step


def _install() -> None:
    import torch.autograd

    # torch.autograd.backward(tensors, grad_tensors, retain_graph, create_graph, ...)
    # torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph, create_graph, ...)
    for name, position in (("backward", 3), ("grad", 4)):
        original = getattr(torch.autograd, name)
        _originals[name] = original
        setattr(torch.autograd, name, _wrapped(name, original, position))


def _restore() -> None:
    import torch.autograd

    for name, original in _originals.items():
        current = getattr(torch.autograd, name)
        if getattr(current, "__memscale_original__", None) is original:  # not wrapped again by another
            setattr(torch.autograd, name, original)
    _originals.clear()
