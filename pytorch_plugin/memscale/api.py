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
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from . import _stats
from ._distributed import patch_fsdp, step_module
from ._budget import Budget, default_budget, threshold_budget
from .config import Config, format_bytes
from .errors import MemscaleError

if TYPE_CHECKING:
    import torch

    from ._region import DTRRegion

log = logging.getLogger("memscale")



@dataclass
class Summary:
    """What memscale did over the wrapped run.

    Attributes:
        steps: training steps completed under a region (the baseline step
            included).
        evictions / rematerializations / swaps_out / swaps_in: engine counts.
        bytes_evicted: bytes freed by evictions (drop or swap), in total.
        base_cost_ns: measured run time of the ops the engine recorded.
        remat_cost_ns: measured time spent recomputing evicted tensors;
            :attr:`overhead` is ``(base + remat) / base``.
        peak_usage: highest usage seen by a budgeted region, in bytes.
        budget: the budget of the latest region (``None``: unbudgeted).
        baseline_peak: peak usage of the unbudgeted baseline step, when one ran.
        budget_source: where the latest region's budget came from
            (``MEMSCALE_EVICTION_THRESHOLD=...``, ``Config.mode=...``...).
        tuning: the latest region's ``summary()["tuning"]``: ``None`` until the
            engine tuned a budgeted region (an explicit heuristic never tunes),
            else its choice, ``overhead``, ``default_overhead``, ``wall_ns``,
            ``instructions`` and ``config``, or ``{"error": message}``.
    """

    steps: int = 0
    evictions: int = 0
    rematerializations: int = 0
    swaps_out: int = 0
    swaps_in: int = 0
    bytes_evicted: int = 0
    base_cost_ns: int = 0
    remat_cost_ns: int = 0
    peak_usage: int = 0
    budget: int | None = None
    baseline_peak: int | None = None
    tuning: dict[str, Any] | None = None
    budget_source: str | None = None

    @property
    def overhead(self) -> float:
        """``(base + remat) / base`` compute time, as ``DTRRegion.summary()`` defines it (1.0: none)."""
        return _stats.overhead(self.base_cost_ns, self.remat_cost_ns)

    @property
    def bytes_saved(self) -> int | None:
        """``baseline_peak - peak_usage`` when a baseline step was measured."""
        if self.baseline_peak is None:
            return None
        return self.baseline_peak - self.peak_usage

    def as_dict(self) -> dict[str, Any]:
        """All fields plus ``overhead`` and ``bytes_saved``."""
        out = asdict(self)
        out["overhead"] = self.overhead
        out["bytes_saved"] = self.bytes_saved
        return out

    def __str__(self) -> str:
        budget = "unbudgeted" if self.budget is None else f"budget {format_bytes(self.budget)}"
        if self.budget_source:
            budget += f" from {self.budget_source}"
        text = (
            f"{self.steps} steps, {budget}, peak {format_bytes(self.peak_usage)}, "
            f"{self.evictions} evictions ({format_bytes(self.bytes_evicted)}), "
            f"{self.rematerializations} rematerializations, {self.swaps_out} swaps out / "
            f"{self.swaps_in} in, compute overhead x{self.overhead:.3f}"
        )
        if self.bytes_saved is not None:
            text += f", saved {format_bytes(self.bytes_saved)} vs baseline peak {format_bytes(self.baseline_peak or 0)}"
        if self.tuning is not None:
            text += f", tuned: {self.tuning.get('choice') or 'failed: ' + str(self.tuning.get('error'))}"
        return text


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
        device_bytes = config.device_bytes()
        if device_bytes is None and module is not None:
            device_bytes = _module_device_bytes(module)
        if device_bytes is None:
            return None
        return Budget(config.budget_for(device_bytes), config.describe_budget(device_bytes))

    def begin(self, module: torch.nn.Module | None = None) -> bool:
        """Open the step's region unless one is open; return whether it opened."""
        if self._open:
            if self._thread != threading.get_ident():
                raise MemscaleError("a memscale step was opened on another thread and is still open")
            return False
        if self._region is None:
            self._region = self._make_region(module if module is not None else self.module)
        patch_fsdp()  # FSDP2's hooks run outside the region (memscale._distributed)
        self._region.__enter__()
        self._open = True
        self._thread = threading.get_ident()
        return True

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
        # The region's exit makes escaping tensors resident and plain, and gives
        # the parameters plain .grad tensors: the optimizer step sees those.
        region.__exit__(type(exc) if exc is not None else None, exc, exc.__traceback__ if exc else None)
        self._steps += 1
        if region is self._baseline_region and exc is None:
            baseline = dict(region.summary())
            peak = int(baseline.get("peak_usage", 0))
            if peak > 0:  # later steps run under budget_for(peak) in a region of their own
                self._finished.append(baseline)
                budget = Budget(
                    self.config.budget_for(peak), self.config.describe_budget(peak, of="the baseline step's peak")
                )
                self._region = self._new_region(budget)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """``with steps.step(): ...``: one whole step in a region."""
        opened = self.begin()
        try:
            yield
        except BaseException as exc:
            if opened:
                self.end(exc)
            raise
        if opened:
            self.end()

    # Hooks -------------------------------------------------------------

    def forward_pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        """Forward pre-hook: open the step's region."""
        if self.begin(module):
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
        out = Summary(steps=self._steps)
        summaries = list(self._finished)
        baseline = self._baseline_region
        if self._region is not None:
            summaries.append(dict(self._region.summary()))
        if baseline is not None and summaries:
            out.baseline_peak = int(summaries[0].get("peak_usage", 0))
        for i, current in enumerate(summaries):
            for key in _stats.SUMMED_KEYS:
                setattr(out, key, getattr(out, key) + int(current.get(key, 0) or 0))
            budgeted = not (baseline is not None and i == 0)
            if budgeted:
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
    kind: str  # "module", "trainer" or "optimize"
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
    hooks.handles.append(module.register_forward_pre_hook(steps.forward_pre_hook))
    hooks.handles.append(module.register_forward_hook(steps.forward_hook, always_call=True))


def _is_trainer(obj: Any) -> bool:
    return any(cls.__name__ == "Trainer" and cls.__module__.startswith("transformers") for cls in type(obj).__mro__)


def wrap(trainer_or_module: Any, config: Config | None = None) -> Any:
    """Run every training step of a model or a Hugging Face Trainer under DTR.

    Args:
        trainer_or_module: a ``torch.nn.Module`` (hooked in place) or a
            ``transformers.Trainer`` (its ``training_step`` is patched in place).
        config: settings; ``Config()`` when ``None`` (the eviction threshold,
            else balanced mode).

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
    if isinstance(trainer_or_module, torch.nn.Module):
        module = trainer_or_module
        steps = _Steps(config, module)
        hooks = _Hooks()
        _hook_module(module, steps, hooks)
        if _global_optimizer_hook is None:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            _global_optimizer_hook = register_optimizer_step_pre_hook(_on_any_optimizer_step)
        _attached[module] = _Attachment(steps=steps, hooks=hooks, kind="module")
        return module
    if _is_trainer(trainer_or_module):
        return _wrap_trainer(trainer_or_module, config)
    raise MemscaleError(
        f"memscale.wrap: expected a torch.nn.Module or a transformers.Trainer, got {type(trainer_or_module).__name__}"
    )


def _wrap_trainer(trainer: Any, config: Config) -> Any:
    from .hf import MemscaleCallback

    steps = _Steps(config, trainer.model)
    original = trainer.training_step  # bound method (or an earlier instance patch)
    instance_patch = vars(trainer).get("training_step")  # restored by detach()

    def training_step(model: torch.nn.Module, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        with steps.step():
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
        The same object.

    Raises:
        MemscaleError: ``obj`` is not wrapped.
    """
    global _global_optimizer_hook
    attachment = _attached.get(obj)
    if attachment is None or attachment.kind == "optimize":
        raise MemscaleError(f"{type(obj).__name__} is not wrapped by memscale.wrap()")
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

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: Config) -> None:
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
        self._hooks.handles.append(self.optimizer.register_step_pre_hook(self._steps.optimizer_pre_hook))
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


def optimize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: Config | None = None) -> Optimization:
    """``with memscale.optimize(model, optimizer) as run:`` - train steps under DTR.

    A step runs from the model's first forward to ``optimizer.step()``, which
    sees materialized tensors. ``run.summary()`` reports what happened.
    """
    import torch

    config = config or Config()
    if not isinstance(config, Config):
        raise MemscaleError(f"config={config!r}: expected a memscale.Config")
    if not isinstance(model, torch.nn.Module):
        raise MemscaleError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise MemscaleError(f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    return Optimization(model, optimizer, config)


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
