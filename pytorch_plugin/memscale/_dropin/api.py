"""The drop-in API: run every training step of a model under a DTR region.

How a step is delimited
-----------------------
A region has to be open from the start of the forward pass until backward has
finished (autograd's backward ops are recorded too), and it has to be closed
before the optimizer updates the parameters so the update sees materialized,
ordinary tensors. memscale therefore does not wrap the model in another object;
it hooks the model you already have:

* a forward pre-hook on the model and on each of its direct children opens the
  step's region (if one is not already open, so gradient accumulation over
  several forwards stays in one region; a loop that calls the model's parts,
  as a GAN's generator and discriminator, opens it at the first part);
* the end of the backward pass closes it (:mod:`memscale._dropin.backward`):
  the gradients of the model's parameters are materialized, and the update -
  ``optimizer.step()`` or a hand-written one - runs on ordinary tensors; each
  micro-batch of gradient accumulation is a step of its own;
* an optimizer step pre-hook closes it too, if still open, just before
  ``optimizer.step()`` runs;
* a forward that runs with gradients disabled (evaluation) closes the region it
  opened as soon as it returns.

``optimize(model, optimizer)`` hooks that optimizer. ``wrap(module)`` has no
optimizer to hook, so it registers a global optimizer step pre-hook that closes
the region of every wrapped module whose parameters that optimizer updates. A
step that runs no backward ends at the next backward, optimizer step or
:func:`memscale.end_step(model) <end_step>`.

``wrap(trainer)`` for a Hugging Face ``Trainer`` patches ``trainer.training_step``
(forward + backward run inside a region; the optimizer step runs after it) and
adds :class:`memscale.hf.MemscaleCallback`.

Budget
------
``Config.threshold`` or an explicit ``Config.mode`` gives the budget; with neither,
the eviction threshold does (``MEMSCALE_EVICTION_THRESHOLD`` or
``install(threshold=...)``, see :mod:`memscale._allocator.budget`), and without one the
default mode (``"balanced"``). A mode's budget is ``Config.budget_for(device_bytes)``;
``device_bytes`` is
``Config.device_memory`` when set, else the total memory of the GPU holding the
model's parameters; for a model on the CPU with no ``device_memory``, the first
step runs unbudgeted as a baseline, and every later step gets
``budget_for(peak usage of the baseline step)``.

Python only converts the budget to bytes; which tensor to evict, when and how is
decided by the Go engine behind :func:`memscale.dtr`.
"""

from __future__ import annotations


import warnings
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .._hooks import ModuleHook
from .backward import listen
from .compat import measure_step_peak, observe
from .._stats import Summary
from .distributed import step_module
from .attached import Attachment, Hooks, Summarized, attached, detached
from .steps import Steps
from ..config import Config
from ..errors import MemscaleError
from ..lightning import is_lightning_trainer
from ..lightning import wrap_trainer as wrap_lightning

if TYPE_CHECKING:
    import torch


_global_optimizer_hook: Any = None


def _on_any_optimizer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for attachment in list(attached.values()):
        if attachment.kind == "module" and attachment.steps.is_open and attachment.steps.updates(optimizer):
            attachment.steps.end()


def _hook_module(module: torch.nn.Module, steps: Steps, hooks: Hooks) -> None:
    """Hook ``module`` and its direct children: a step opens at the first of
    their forwards, so a loop that calls the parts of a model (a GAN's
    generator and discriminator, a VAE's encoder and decoder) instead of the
    model itself is stepped too."""
    module = step_module(module)  # DDP: its wrapped module (see memscale._dropin.distributed)
    for part in (module, *module.children()):
        # ModuleHook, not bound methods: torch.save / copy.deepcopy of the model
        # meet these (memscale._hooks); a copy is a plain model.
        hooks.handles.append(part.register_forward_pre_hook(ModuleHook(steps, "forward_pre_hook"), with_kwargs=True))
        hooks.handles.append(part.register_forward_hook(ModuleHook(steps, "forward_hook"), always_call=True))


def _is_trainer(obj: Any) -> bool:
    return any(cls.__name__ == "Trainer" and cls.__module__.startswith("transformers") for cls in type(obj).__mro__)


def wrap(trainer_or_module: Any, config: Config | None = None, sample_input: Any = None) -> Any:
    """Run every training step of a model or a Hugging Face / Lightning Trainer under DTR.

    Args:
        trainer_or_module: a ``torch.nn.Module`` (hooked in place), a
            ``transformers.Trainer`` (its ``training_step`` is patched in
            place) or a Lightning ``Trainer`` (:mod:`memscale.lightning`).
        config: settings; ``Config()`` when ``None`` (the eviction threshold,
            else balanced mode).
        sample_input: (a module, memscale 0.1) one batch: a tensor, a tuple
            of arguments or a dict of keyword arguments. On the CPU with no
            ``Config.device_memory``, the mode's budget is then a fraction of
            the peak of one forward and backward of it (measured now, the
            model's state put back), instead of an unbudgeted first step.

    Returns:
        The same object, now wrapped (:func:`detach` undoes it).

    Raises:
        MemscaleError: already wrapped, or not a module / Trainer.
    """
    import torch

    global _global_optimizer_hook
    config = config or Config()
    if not isinstance(config, Config):
        raise MemscaleError(f"config={config!r}: expected a memscale.Config")
    if trainer_or_module in attached:
        raise MemscaleError(f"{type(trainer_or_module).__name__} is already wrapped by memscale; detach() it first")
    if sample_input is not None and not isinstance(trainer_or_module, torch.nn.Module):
        raise MemscaleError("memscale.wrap(sample_input=...): a sample input is for a torch.nn.Module")
    observe(config)
    if config.unit == "auto":
        from .._blocks.drop_in import block_unit

        target = trainer_or_module.model if _is_trainer(trainer_or_module) else trainer_or_module
        uses_blocks = isinstance(target, torch.nn.Module) and block_unit(config, target)
        config = replace(config, unit="block" if uses_blocks else "op")
    if config.unit == "block":
        # Blocks need no step boundaries: a module, or a Hugging Face Trainer's
        # model, gets their hooks and nothing else.
        if isinstance(trainer_or_module, torch.nn.Module):
            model = trainer_or_module
        elif _is_trainer(trainer_or_module):
            model = trainer_or_module.model
        else:
            raise MemscaleError(
                f"memscale.wrap(Config(unit='block')): expected a torch.nn.Module or a transformers.Trainer, got "
                f"{type(trainer_or_module).__name__} (for a Lightning Trainer, wrap its LightningModule)"
            )
        if sample_input is not None:
            raise MemscaleError("memscale.wrap(Config(unit='block'), sample_input=...): blocks measure their first step")
        from .._blocks.drop_in import BlockSteps

        block_steps = BlockSteps(config, model)
        hooks = Hooks()
        hooks.handles.append(block_steps)
        attached[trainer_or_module] = Attachment(steps=block_steps, hooks=hooks, kind="blocks")  # type: ignore[arg-type]
        return trainer_or_module
    if isinstance(trainer_or_module, torch.nn.Module):
        module = trainer_or_module
        steps = Steps(config, module)
        if sample_input is not None:
            steps.sample_peak = measure_step_peak(module, sample_input)
        hooks = Hooks()
        _hook_module(module, steps, hooks)
        hooks.handles.append(listen(steps.after_backward, steps.backward_raised))
        if _global_optimizer_hook is None:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            _global_optimizer_hook = register_optimizer_step_pre_hook(_on_any_optimizer_step)
        attached[module] = Attachment(steps=steps, hooks=hooks, kind="module")
        weakref.finalize(module, _dropped_unwrapped, hooks)
        return module
    if _is_trainer(trainer_or_module):
        return _wrap_trainer(trainer_or_module, config)
    if is_lightning_trainer(trainer_or_module):
        steps, handle = wrap_lightning(trainer_or_module, config)
        hooks = Hooks()
        hooks.handles.append(handle)
        attached[trainer_or_module] = Attachment(steps=steps, hooks=hooks, kind="lightning")
        return trainer_or_module
    raise MemscaleError(
        "memscale.wrap: expected a torch.nn.Module, a transformers.Trainer or a Lightning Trainer, "
        f"got {type(trainer_or_module).__name__}"
    )


def _dropped_unwrapped(hooks: Hooks) -> None:
    """A wrapped module was garbage-collected without :func:`detach`: its
    hooks go with it - the backward listener above all, which would otherwise
    keep ``torch.autograd.backward`` wrapped and its steps alive for good
    (nothing after it can detach a module that is gone). After detach this
    removes nothing."""
    hooks.remove()
    _drop_optimizer_hook_if_unused()


def _drop_optimizer_hook_if_unused() -> None:
    """Remove the process-wide optimizer-step hook once no wrapped module is left."""
    global _global_optimizer_hook
    if _global_optimizer_hook is not None and not any(a.kind == "module" for a in attached.values()):
        _global_optimizer_hook.remove()
        _global_optimizer_hook = None


def _wrap_trainer(trainer: Any, config: Config) -> Any:
    from ..hf import MemscaleCallback

    steps = Steps(config, trainer.model)
    original = trainer.training_step  # bound method (or an earlier instance patch)
    instance_patch = vars(trainer).get("training_step")  # restored by detach()

    def training_step(model: torch.nn.Module, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        # The batch's shapes key the step; the rest (num_items_in_batch, a count
        # of tokens that changes every step) leaves its memory as it is.
        with steps.step(model, inputs):
            loss = original(model, inputs, *args, **kwargs)
        return steps.materialize(loss)

    trainer.training_step = training_step
    callback = MemscaleCallback(trainer, enabled=config.log_summary)
    trainer.add_callback(callback)
    attached[trainer] = Attachment(
        steps=steps, hooks=Hooks(), kind="trainer", callback=callback, original_training_step=instance_patch
    )
    return trainer


def detach(obj: Any) -> Any:
    """Undo :func:`wrap` (close an open region, remove hooks, restore the Trainer).

    Returns:
        The same object. One that is not wrapped is returned unchanged, with a
        warning (as memscale 0.1 did).
    """
    attachment = attached.get(obj)
    if attachment is None or attachment.kind == "optimize":
        warnings.warn(f"memscale.detach: {type(obj).__name__} is not wrapped by memscale.wrap()", stacklevel=2)
        return obj
    try:
        attachment.steps.end()  # may raise (the region could not finish); undo the rest anyway
    finally:
        attachment.hooks.remove()
        if attachment.kind == "trainer":
            if attachment.original_training_step is None:
                del obj.training_step  # the class's method shows through again
            else:
                obj.training_step = attachment.original_training_step
            obj.remove_callback(attachment.callback)
        detached[obj] = attachment.steps.summary()
        del attached[obj]
        _drop_optimizer_hook_if_unused()
    attachment.steps.log_summary("detach")
    return obj


class Optimization(Summarized):
    """The handle :func:`optimize` returns; a context manager.

    Inside ``with``, each step of ``model`` (first forward to the end of its
    backward pass, or ``optimizer.step()``) runs in a DTR region. ``summary()`` works during and after the block.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, config: Config) -> None:
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self._steps = Steps(config, model)
        self._hooks = Hooks()
        self._active = False

    def __enter__(self) -> Optimization:
        if self._active:
            raise MemscaleError("this memscale.optimize() block is already active")
        if self.model in attached:
            raise MemscaleError(f"{type(self.model).__name__} is already wrapped by memscale; detach() it first")
        _hook_module(self.model, self._steps, self._hooks)
        self._hooks.handles.append(listen(self._steps.after_backward, self._steps.backward_raised))
        if self.optimizer is not None:
            self._hooks.handles.append(self.optimizer.register_step_pre_hook(self._steps.optimizer_pre_hook))
        else:  # any optimizer that updates the model ends its step
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            def end_if_updates(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
                if self._steps.updates(optimizer):
                    self._steps.end()

            self._hooks.handles.append(register_optimizer_step_pre_hook(end_if_updates))
        attached[self.model] = Attachment(steps=self._steps, hooks=self._hooks, kind="optimize")
        attached[self] = attached[self.model]
        self._active = True
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._active = False
        try:
            self._steps.end(exc)
        finally:
            self._hooks.remove()
            attached.pop(self.model, None)
            attached.pop(self, None)
        self._steps.log_summary("optimize")

    def end_step(self) -> None:
        """Close the current step's region now (for steps without ``optimizer.step()``)."""
        self._steps.end()

    def summary(self) -> Summary:
        """Totals so far."""
        return self._steps.summary()


def optimize(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, config: Config | None = None
) -> Optimization:
    """``with memscale.optimize(model, optimizer) as run:`` - train steps under DTR.

    A step runs from the model's first forward to the end of its backward pass
    (or ``optimizer.step()``); the update sees materialized tensors; with no ``optimizer`` (memscale 0.1), the step
    of any optimizer that updates the model's parameters. ``run.summary()``
    reports what happened.
    """
    import torch

    config = config or Config()
    if not isinstance(config, Config):
        raise MemscaleError(f"config={config!r}: expected a memscale.Config")
    if not isinstance(model, torch.nn.Module):
        raise MemscaleError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise MemscaleError(f"optimizer: expected a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
    if config.unit == "block":
        raise MemscaleError(
            "memscale.optimize(Config(unit='block')): blocks need no step boundaries; use "
            "memscale.wrap(model, Config(unit='block')) or memscale.blocks(model)"
        )
    if config.unit == "auto":  # optimize() delimits steps for the region
        config = replace(config, unit="op")
    observe(config)
    return Optimization(model, optimizer, config)
