"""What a step that stops partway changed in the program's state, undone.

A step under a budget that no step of its shapes measured (a threshold in
bytes: the first step of each shape) can stop partway with a
:class:`~memscale._native.engine.NoRoomError`: its forward has updated the
model's buffers (batch norm's running statistics and counters) and its
backward may have accumulated into some gradients. A program that catches the
error and runs the step again with a larger budget would count those twice.
:class:`Undo` keeps copies of the buffers and gradients when such a step
opens, and puts them back when it fails (host copies: a device under a budget
has no room to spare). Parameters themselves are not touched before the
optimizer's step, which runs after the step's end.

Holds no policy: which steps keep an undo is :class:`~.steps.Steps`' choice.
"""

from __future__ import annotations

from typing import Any

import torch


class Undo:
    """Copies of ``module``'s buffers and its parameters' gradients, to put back."""

    def __init__(self, module: torch.nn.Module) -> None:
        with torch.no_grad():
            self._buffers = [(b, b.detach().to("cpu", copy=True)) for b in module.buffers()]
            self._grads: list[tuple[torch.nn.Parameter, Any, torch.Tensor | None]] = [
                (p, p.grad, None if p.grad is None else p.grad.detach().to("cpu", copy=True))
                for p in module.parameters()
            ]

    def restore(self) -> None:
        """Put the buffers and gradients back as they were when the step opened."""
        with torch.no_grad():
            for buffer, saved in self._buffers:
                buffer.copy_(saved)
            for param, grad, saved in self._grads:
                if grad is None or saved is None:
                    param.grad = None
                else:
                    grad.copy_(saved)
                    param.grad = grad
