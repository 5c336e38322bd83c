"""PyTorch Lightning: ``memscale.wrap(trainer)`` for a ``pytorch_lightning`` (or
``lightning``) ``Trainer``.

Lightning's automatic optimization hands ``optimizer.step`` a closure that runs
the training step's forward and backward. :func:`wrap_trainer` registers an
optimizer step pre-hook that, for an optimizer updating the trainer's
LightningModule, runs that closure in a DTR region of its own (closed when the
closure returns, before the update), as :func:`memscale.enable` does for any
closure; validation, checkpointing and logging see ordinary tensors. A manual
optimization loop (no closure) ends its step at ``optimizer.step()`` too.

Holds nothing; the attachment lives in :mod:`memscale._dropin.api`.
"""

from __future__ import annotations

from typing import Any

from .config import Config


def is_lightning_trainer(obj: Any) -> bool:
    """Whether ``obj`` is a Lightning ``Trainer``."""
    return any(
        cls.__name__ == "Trainer" and cls.__module__.split(".")[0] in ("pytorch_lightning", "lightning")
        for cls in type(obj).__mro__
    )


def step_hook(trainer: Any, steps: Any) -> Any:
    """The optimizer step pre-hook of a wrapped Lightning trainer."""
    from ._dropin.enable import _closure_in_its_own_step

    def optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        module = trainer.lightning_module
        if module is None:
            return None
        ids = {id(p) for p in module.parameters()}
        if not any(id(p) in ids for group in optimizer.param_groups for p in group["params"]):
            return None
        steps.end()
        return _closure_in_its_own_step(steps, args, kwargs)

    return optimizer_pre_hook


def wrap_trainer(trainer: Any, config: Config) -> Any:
    """Hook ``trainer`` (see the module doc); returns the hook's handle."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from ._dropin.steps import Steps

    steps = Steps(config, None)
    return steps, register_optimizer_step_pre_hook(step_hook(trainer, steps))
