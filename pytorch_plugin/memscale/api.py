"""The drop-in API: run every training step of a model under a DTR region.

How a step is delimited
-----------------------
A region has to be open from the start of the forward pass until backward has
finished (autograd's backward ops are recorded too), and it has to be closed
before the optimizer updates the parameters so the update sees materialized,
ordinary tensors. memscale therefore does not wrap the model in another object;
it hooks the model you already have:

* a forward pre-hook opens the step's region (if one is not already open, so
  gradient accumulation over several forwards stays in one region);
* an optimizer step pre-hook closes it, just before ``optimizer.step()`` runs;
  the gradients of the model's parameters are materialized first;
* a forward that runs with gradients disabled (evaluation) closes the region it
  opened as soon as it returns.

``optimize(model, optimizer)`` hooks that optimizer. ``wrap(module)`` has no
optimizer to hook, so it registers a global optimizer step pre-hook that closes
the region of every wrapped module whose parameters that optimizer updates. A
training loop with no ``torch.optim`` optimizer must call
:func:`memscale.end_step(model) <end_step>` where the step ends.

``wrap(trainer)`` for a Hugging Face ``Trainer`` patches ``trainer.training_step``
(forward + backward run inside a region; the optimizer step runs after it) and
adds :class:`memscale.hf.MemscaleCallback`.

Budget
------
``Config.threshold`` or an explicit ``Config.mode`` gives the budget; with neither,
the eviction threshold does (``MEMSCALE_EVICTION_THRESHOLD`` or
``install(threshold=...)``, see :mod:`memscale._budget`), and without one the
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

import contextlib
import logging
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _stats
from ._compat import measure_step_peak, observe
from ._stats import Summary
from ._distributed import patch_fsdp, step_module
from ._fitting import FitRecord, PeakProbe, signature, untracked_steps_enabled
from ._budget import Budget, default_budget, threshold_budget
from .config import Config, is_percentage, parse_size
from .errors import MemscaleError
from .lightning import is_lightning_trainer
from .lightning import wrap_trainer as wrap_lightning

if TYPE_CHECKING:
    import torch

    from ._region import DTRRegion

log = logging.getLogger("memscale")



def _dtr() -> Any:
    try:
        from ._region import dtr
    except ImportError as exc:
        raise MemscaleError(f"the DTR region (memscale.dtr) is unavailable: {exc}") from exc
    return dtr


def _module_device_index(module: torch.nn.Module | None) -> int | None:
    """The CUDA device holding ``module``'s first parameter (None: CPU or unknown)."""
    if module is None:
        return None
    tensor = next(module.parameters(), None)
    if tensor is None:
        tensor = next(module.buffers(), None)
    if tensor is None or tensor.device.type != "cuda":
        return None
    return tensor.device.index or 0


def _module_device_bytes(module: torch.nn.Module) -> int | None:
    """Total memory of the GPU holding ``module``'s first parameter (None on CPU)."""
    import torch

    index = _module_device_index(module)
    if index is None:
        return None
    from .allocator import device_total_memory

    if torch.cuda.is_initialized():
        return int(torch.cuda.get_device_properties(index).total_memory)
    return device_total_memory(index)


class _Steps:
    """Opens one region per training step and keeps the totals.

    Not thread-safe by design: a step is opened and closed on the training
    thread (the region is a thread-local dispatch mode).
    """

    def __init__(self, config: Config, module: torch.nn.Module | None, on_demand: bool = False) -> None:
        self.config = config
        # With neither Config.threshold nor Config.mode nor an eviction
        # threshold: True evicts only when an allocation would fail (on a GPU
        # with the memscale allocator; memscale.enable), False uses DEFAULT_MODE.
        self._on_demand = on_demand
        self._module_ref = weakref.ref(module) if module is not None else None
        self._region: DTRRegion | None = None
        self._baseline_region: DTRRegion | None = None
        self._finished: list[dict[str, Any]] = []  # summaries of regions replaced
        self._open = False
        self._opened_by_forward = False
        self._steps = 0
        self._thread: int | None = None
        self._warmup = False  # the open region is a warmup step's (Config.warmup_steps)
        #: The step's peak measured on wrap()'s sample input (CPU, no device size).
        self.sample_peak: int | None = None
        #: Which step signatures fit the budget (they then run untracked).
        self.fits = FitRecord(untracked_steps_enabled(config.untracked_steps))
        self._signature: Any = None  # the open step's (None: not known)
        self._forwards: list[Any] = []  # the signatures of the open step's forwards
        self._device_bytes: int | None = None  # the GPU's memory, where the model is on one
        self._probe: PeakProbe | None = None  # set while an untracked step is open
        self._untracked_peak = 0

    @property
    def module(self) -> torch.nn.Module | None:
        """The hooked model, if still alive."""
        return self._module_ref() if self._module_ref is not None else None

    @property
    def is_open(self) -> bool:
        """Whether a step's region is open now."""
        return self._open

    def _make_region(self, module: torch.nn.Module | None) -> DTRRegion:
        budget = self._budget(module)
        if budget is None:
            # CPU, no explicit size: this step is the unbudgeted baseline.
            region = self._new_region(Budget(0, "unbudgeted baseline step (no device memory size on the CPU)"))
            self._baseline_region = region
            return region
        return self._new_region(budget)

    def _new_region(self, budget: Budget) -> DTRRegion:
        region: DTRRegion = _dtr()(budget, **self.config.region_kwargs())
        region.step_boundaries = False  # this object's hooks close the region at each step
        return region

    def _budget(self, module: torch.nn.Module | None) -> Budget | None:
        """The step's budget; ``None``: run an unbudgeted baseline step first
        (its peak is then the "device memory" the mode takes a fraction of)."""
        config = self.config
        device = _module_device_index(module)
        if config.threshold is None and config.mode is None:
            default = default_budget(device) if self._on_demand else threshold_budget(device)
            if default is not None:
                return default
        if config.threshold is not None and not is_percentage(config.threshold):
            # Bytes need no device size: no baseline step to measure one.
            return Budget(parse_size(config.threshold, name="Config.threshold"), config.describe_budget(0))
        device_bytes = config.device_bytes()
        if device_bytes is None and module is not None:
            device_bytes = _module_device_bytes(module)
        if device_bytes is None and self.sample_peak:
            return Budget(
                config.budget_for(self.sample_peak),
                config.describe_budget(self.sample_peak, of="the sample input's step peak"),
            )
        if device_bytes is None:
            return None
        return Budget(config.budget_for(device_bytes), config.describe_budget(device_bytes))

    def begin(self, module: torch.nn.Module | None = None, args: Any = None) -> bool:
        """Open the step's region unless one is open; return whether it opened.

        ``args``: the step's arguments (``None``: not known), whose signature
        lets a step that fitted the budget before run untracked
        (:mod:`memscale._fitting`).
        """
        if self._open:
            if self._thread != threading.get_ident():
                raise MemscaleError("a memscale step was opened on another thread and is still open")
            self._another_forward(module, args)
            return False
        if self._region is None:
            if self._steps < self.config.warmup_steps:
                self._warmup = True
                source = f"warmup step {self._steps + 1} of Config.warmup_steps={self.config.warmup_steps}"
                self._region = self._new_region(Budget(0, source))
            else:
                self._region = self._make_region(module if module is not None else self.module)
        region = self._region
        self._signature = None
        if self.fits.enabled and args is not None and region.budget > 0 and not self._warmup:
            if region is not self._baseline_region:
                keyed = module if module is not None else self.module
                self._signature = signature(keyed, args)
                if self._signature is not None:
                    self.fits.watch(keyed)
        self._forwards = [self._signature]
        if self._signature is not None and self._device_bytes is None:
            self._device_bytes = _module_device_bytes(module if module is not None else self.module)
        self._open = True
        self._thread = threading.get_ident()
        if self.fits.runs_untracked(self._signature):
            self._probe = PeakProbe()
        else:
            self._enter()
        return True

    def _enter(self) -> None:
        patch_fsdp()  # FSDP2's hooks run outside the region (memscale._distributed)
        assert self._region is not None
        try:
            self._region.__enter__()
        except BaseException:
            self._open = False
            raise

    def _another_forward(self, module: torch.nn.Module | None, args: Any) -> None:
        """A forward of the open step after its first (gradient accumulation):
        an untracked step meeting one its fits did not have is tracked from here."""
        if self._signature is None or args is None:
            return
        self._forwards.append(signature(module if module is not None else self.module, args))
        if self._probe is not None and not self.fits.follows(self._signature, self._forwards):
            self._probe.close()
            self._probe = None
            self.fits.promote(self._signature)
            self._signature = None  # the step's fit is not known: it is not recorded
            self._enter()

    def materialize(self, tensor: Any) -> Any:
        """Return ``tensor`` as an ordinary tensor (the region's ``unwrap``)."""
        if self._region is None:
            return tensor
        return self._region.unwrap(tensor)

    def end(self, exc: BaseException | None = None) -> None:
        """Close the open region (no-op when none is open)."""
        if not self._open:
            return
        region = self._region
        assert region is not None
        self._open = False
        self._opened_by_forward = False
        if self._probe is not None:  # an untracked step
            peak = self._probe.close()
            self._probe = None
            self._untracked_peak = max(self._untracked_peak, peak or 0)
            self.fits.ran_untracked(self._signature, peak, region.budget, ok=exc is None)
            self._steps += 1
            return
        # The region's exit makes escaping tensors resident and plain, and gives
        # the parameters plain .grad tensors: the optimizer step sees those.
        try:
            region.__exit__(type(exc) if exc is not None else None, exc, exc.__traceback__ if exc else None)
        except BaseException:
            self.fits.tracked(self._signature, {}, ok=False)
            raise
        self.fits.tracked(
            self._signature,
            region.last_summary(),
            ok=exc is None,
            forwards=self._forwards,
            device_bytes=self._device_bytes,
        )
        self._steps += 1
        if self._warmup and self._steps >= self.config.warmup_steps:
            self._finished.append({**region.summary(), "warmup": True})  # unbudgeted: no peak of a budgeted step
            self._region = None
            self._warmup = False
        elif region is self._baseline_region and exc is None:
            baseline = dict(region.summary())
            peak = int(baseline.get("peak_usage", 0))
            if peak > 0:  # later steps run under budget_for(peak) in a region of their own
                self._finished.append({**baseline, "baseline": True})
                budget = Budget(
                    self.config.budget_for(peak), self.config.describe_budget(peak, of="the baseline step's peak")
                )
                self._region = self._new_region(budget)

    @contextlib.contextmanager
    def step(self, module: torch.nn.Module | None = None, args: Any = None) -> Iterator[None]:
        """``with steps.step(): ...``: one whole step in a region (``args``: see :meth:`begin`)."""
        opened = self.begin(module, args)
        try:
            yield
        except BaseException as exc:
            if opened:
                self.end(exc)
            raise
        if opened:
            self.end()

    # Hooks -------------------------------------------------------------

    def forward_pre_hook(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        """Forward pre-hook (with keyword arguments): open the step's region."""
        if self.begin(module, (args, kwargs)):
            self._opened_by_forward = True

    def forward_hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """Forward hook (always called, also when forward raised).

        Closes the step's region when forward raised (the step is abandoned;
        PyTorch calls ``always_call`` hooks from its ``except`` block with
        ``output=None``), and closes a region opened for a no-grad forward.
        """
        import torch

        raised = sys.exc_info()[1] if output is None else None
        if raised is not None:
            self.end(raised)
        elif self._opened_by_forward and not torch.is_grad_enabled():
            self.end()
        self._opened_by_forward = False

    def optimizer_pre_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Optimizer step pre-hook: close the region before parameters change."""
        self.end()

    def updates(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` updates a parameter of the hooked model."""
        module = self.module
        if module is None:
            return False
        ids = {id(p) for p in module.parameters()}
        return any(id(p) in ids for group in optimizer.param_groups for p in group["params"])

    # Totals ------------------------------------------------------------

    def summary(self) -> Summary:
        """Totals over every region used so far."""
        out = Summary(
            steps=self._steps,
            untracked_steps=self.fits.untracked,
            untracked_over_budget=self.fits.over_budget,
            untracked_promoted=self.fits.promoted,
            peak_usage=self._untracked_peak,
        )
        summaries = list(self._finished)
        if self._region is not None:
            current = dict(self._region.summary())
            current["baseline"] = self._region is self._baseline_region
            current["warmup"] = self._warmup
            summaries.append(current)
        unbudgeted = [int(c.get("peak_usage", 0) or 0) for c in summaries if c.get("baseline") or c.get("warmup")]
        if unbudgeted:
            out.baseline_peak = max(unbudgeted)
        for current in summaries:
            for key in _stats.SUMMED_KEYS:
                setattr(out, key, getattr(out, key) + int(current.get(key, 0) or 0))
            if not (current.get("baseline") or current.get("warmup")):
                out.peak_usage = max(out.peak_usage, int(current.get("peak_usage", 0) or 0))
            budget = current.get("budget")
            out.budget = int(budget) if budget else None
            out.budget_source = current.get("budget_source") or out.budget_source
            out.tuning = current.get("tuning") or out.tuning
        return out

    def log_summary(self, what: str) -> None:
        """Log the totals if the config asks for it."""
        if self.config.log_summary:
            log.info("memscale %s: %s", what, self.summary())


class _Hooks:
    """The handles a wrap/optimize put on a model; removing them detaches."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


@dataclass
class _Attachment:
    steps: _Steps
    hooks: _Hooks
    kind: str  # "module", "trainer", "lightning" or "optimize"
    callback: Any = None
    original_training_step: Any = None  # an instance-level training_step that wrap replaced


# Module / Trainer / optimize handle -> attachment. Weak, so a wrapped model that
# is dropped is not kept alive by memscale.
_attached: weakref.WeakKeyDictionary[Any, _Attachment] = weakref.WeakKeyDictionary()
# Totals of detached objects, so summary() still answers after detach().
_detached: weakref.WeakKeyDictionary[Any, Summary] = weakref.WeakKeyDictionary()
_global_optimizer_hook: Any = None


def _on_any_optimizer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for attachment in list(_attached.values()):
        if attachment.kind == "module" and attachment.steps.is_open and attachment.steps.updates(optimizer):
            attachment.steps.end()


def _hook_module(module: torch.nn.Module, steps: _Steps, hooks: _Hooks) -> None:
    module = step_module(module)  # DDP: its wrapped module (see memscale._distributed)
    hooks.handles.append(module.register_forward_pre_hook(steps.forward_pre_hook, with_kwargs=True))
    hooks.handles.append(module.register_forward_hook(steps.forward_hook, always_call=True))


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
    if trainer_or_module in _attached:
        raise MemscaleError(f"{type(trainer_or_module).__name__} is already wrapped by memscale; detach() it first")
    if sample_input is not None and not isinstance(trainer_or_module, torch.nn.Module):
        raise MemscaleError("memscale.wrap(sample_input=...): a sample input is for a torch.nn.Module")
    observe(config)
    if isinstance(trainer_or_module, torch.nn.Module):
        module = trainer_or_module
        steps = _Steps(config, module)
        if sample_input is not None:
            steps.sample_peak = measure_step_peak(module, sample_input)
        hooks = _Hooks()
        _hook_module(module, steps, hooks)
        if _global_optimizer_hook is None:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            _global_optimizer_hook = register_optimizer_step_pre_hook(_on_any_optimizer_step)
        _attached[module] = _Attachment(steps=steps, hooks=hooks, kind="module")
        return module
    if _is_trainer(trainer_or_module):
        return _wrap_trainer(trainer_or_module, config)
    if is_lightning_trainer(trainer_or_module):
        steps, handle = wrap_lightning(trainer_or_module, config)
        hooks = _Hooks()
        hooks.handles.append(handle)
        _attached[trainer_or_module] = _Attachment(steps=steps, hooks=hooks, kind="lightning")
        return trainer_or_module
    raise MemscaleError(
        "memscale.wrap: expected a torch.nn.Module, a transformers.Trainer or a Lightning Trainer, "
        f"got {type(trainer_or_module).__name__}"
    )


def _wrap_trainer(trainer: Any, config: Config) -> Any:
    from .hf import MemscaleCallback

    steps = _Steps(config, trainer.model)
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
    _attached[trainer] = _Attachment(
        steps=steps, hooks=_Hooks(), kind="trainer", callback=callback, original_training_step=instance_patch
    )
    return trainer


def detach(obj: Any) -> Any:
    """Undo :func:`wrap` (close an open region, remove hooks, restore the Trainer).

    Returns:
        The same object. One that is not wrapped is returned unchanged, with a
        warning (as memscale 0.1 did).
    """
    global _global_optimizer_hook
    attachment = _attached.get(obj)
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
        _detached[obj] = attachment.steps.summary()
        del _attached[obj]
        if _global_optimizer_hook is not None and not any(a.kind == "module" for a in _attached.values()):
            _global_optimizer_hook.remove()
            _global_optimizer_hook = None
    attachment.steps.log_summary("detach")
    return obj


def end_step(obj: Any = None) -> None:
    """Close the open step region of a wrapped model, or with no argument of
    :func:`memscale.enable` (for loops without a ``torch.optim`` optimizer)."""
    if obj is None:
        from ._enable import enabled

        current = enabled()
        if current is None:
            raise MemscaleError("memscale.end_step(): memscale.enable() was not called; pass the wrapped model")
        current.end_step()
        return
    attachment = _attached.get(obj)
    if attachment is None:
        raise MemscaleError(f"{type(obj).__name__} is not wrapped by memscale")
    attachment.steps.end()


class Optimization:
    """The handle :func:`optimize` returns; a context manager.

    Inside ``with``, each step of ``model`` (first forward to ``optimizer.step()``)
    runs in a DTR region. ``summary()`` works during and after the block.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, config: Config) -> None:
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self._steps = _Steps(config, model)
        self._hooks = _Hooks()
        self._active = False

    def __enter__(self) -> Optimization:
        if self._active:
            raise MemscaleError("this memscale.optimize() block is already active")
        if self.model in _attached:
            raise MemscaleError(f"{type(self.model).__name__} is already wrapped by memscale; detach() it first")
        _hook_module(self.model, self._steps, self._hooks)
        if self.optimizer is not None:
            self._hooks.handles.append(self.optimizer.register_step_pre_hook(self._steps.optimizer_pre_hook))
        else:  # any optimizer that updates the model ends its step
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            def end_if_updates(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
                if self._steps.updates(optimizer):
                    self._steps.end()

            self._hooks.handles.append(register_optimizer_step_pre_hook(end_if_updates))
        _attached[self.model] = _Attachment(steps=self._steps, hooks=self._hooks, kind="optimize")
        _attached[self] = _attached[self.model]
        self._active = True
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._active = False
        try:
            self._steps.end(exc)
        finally:
            self._hooks.remove()
            _attached.pop(self.model, None)
            _attached.pop(self, None)
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

    A step runs from the model's first forward to ``optimizer.step()``, which
    sees materialized tensors; with no ``optimizer`` (memscale 0.1), the step
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
    observe(config)
    return Optimization(model, optimizer, config)


def attached_summaries() -> list[tuple[str, Summary]]:
    """``(class name and id, totals)`` of every object wrapped now (for
    :mod:`memscale.metrics`)."""
    seen: set[int] = set()
    out = []
    for obj, attachment in list(_attached.items()):
        if id(attachment) in seen or isinstance(obj, Optimization):
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
        from ._enable import enabled

        current = enabled()
        if current is None:
            raise MemscaleError("memscale.summary(): memscale.enable() was not called; pass the wrapped object")
        return current.summary()
    if isinstance(obj, Optimization):
        return obj.summary()
    attachment = _attached.get(obj)
    if attachment is not None:
        return attachment.steps.summary()
    if obj in _detached:
        return _detached[obj]
    raise MemscaleError(f"{type(obj).__name__} was never wrapped by memscale")
