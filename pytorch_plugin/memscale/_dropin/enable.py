"""Zero-code DTR: ``memscale.enable()`` and ``python -m memscale run script.py``.

:func:`enable` makes every training step of the process run under a DTR region,
with no change to the model or the loop:

* on a GPU it installs the memscale allocator (before CUDA is used), which reads
  ``MEMSCALE_EVICTION_THRESHOLD``;
* a global forward pre-hook opens the step's region at the first forward that
  runs with gradients enabled (evaluation under ``no_grad`` or
  ``inference_mode`` opens none);
* the step ends when its backward pass returns (:mod:`memscale._dropin.backward`),
  so the update - a ``torch.optim`` step or a hand-written one - gradient
  clipping, checkpoint saving, logging and the next batch's loading see
  ordinary tensors; each micro-batch of gradient accumulation and each phase
  of a GAN is a step of its own. A global optimizer step pre-hook also closes
  an open step before any ``torch.optim`` optimizer updates parameters; an
  optimizer step given a closure (LBFGS, Lightning) runs the closure's forward
  and backward in a region of its own;
* a forward with gradients enabled that no backward follows (sampling without
  ``no_grad``) joins the next step; :func:`memscale.end_step` ends a step by hand;
* at exit the totals are logged (and printed by ``python -m memscale run``).

The budget is the eviction threshold (:mod:`memscale._allocator.budget`); without one, on
a GPU with the allocator, the engine evicts only when an allocation would
otherwise fail. On the CPU without a threshold there is nothing to evict
against, so :func:`enable` says so and changes nothing.

Holds the process's one enablement (a module-level singleton, as the hooks
are process-wide); no policy.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import weakref
from typing import Any

from .._allocator.budget import default_budget, percentage_of_peak
from .._hooks import ModuleHook
from .auto import StepUnits, unit_steps
from .backward import listen
from .distributed import opens_no_step
from .._region.steps import wrap_closure
from .._stats import Summary
from .steps import Steps
from ..config import Config
from ..errors import MemscaleError

log = logging.getLogger("memscale")


class Enabled:
    """The process-wide enablement :func:`enable` returns.

    Attributes:
        config: the settings the steps run with.
        allocator_installed: whether :func:`enable` installed the memscale
            allocator (a GPU was present and CUDA not yet initialized).
    """

    def __init__(self, config: Config, steps: Steps | None, allocator_installed: bool) -> None:
        self.config = config
        self.allocator_installed = allocator_installed
        self._steps = steps
        #: With ``Config(unit="block")`` (or ``"auto"``): block-level DTR on
        #: every model that trains (with ``"auto"``: every model with blocks).
        self._blocks: Any = None
        #: With ``Config(unit="auto")``: which unit the open step runs under
        #: (memscale._dropin.auto: a step opened by a model with blocks is the
        #: blocks', its loss module included).
        self._units: StepUnits | None = None
        self._handles: list[Any] = []
        #: id of a module that opened a step -> (the module, weakly; its own
        #: pre-hook, which sees keyword arguments). Keyed by id: a module may
        #: define ``__eq__``.
        self._with_kwargs: dict[int, tuple[weakref.ref[Any], Any]] = {}

    @property
    def active(self) -> bool:
        """Whether steps run under DTR (``False``: nothing to evict against)."""
        return self._steps is not None or self._blocks is not None

    def summary(self) -> Summary:
        """Totals over every step so far (with ``unit="auto"``: the regions'
        and the blocks' together)."""
        if self._blocks is not None and self._steps is not None:
            regions = self._steps.summary()
            total = regions.merged(self._blocks.summary())
            if self._units is not None:  # the steps as auto chose them (a blocks step ends with its backward)
                total.steps = regions.steps + self._units.block_steps
                total.unit_steps = unit_steps(self._units, regions.steps)
            return total
        if self._blocks is not None:
            return self._blocks.summary()
        return self._steps.summary() if self._steps is not None else Summary()

    def end_step(self) -> None:
        """End the open step's region now (a loop without a ``torch.optim`` optimizer)."""
        if self._units is not None:
            self._units.end()
        if self._steps is not None:
            self._steps.end()

    # Hooks -------------------------------------------------------------

    def _in_a_step(self, module: Any) -> bool:
        import torch

        return torch.is_grad_enabled() and not torch.is_inference_mode_enabled() and not opens_no_step(module)

    def _blocks_step(self, module: Any) -> bool:
        """Config(unit="auto"): whether ``module``'s forward is in a step the
        blocks run (one is open, or this forward of a model with blocks opens
        one): it opens no region (memscale._dropin.auto)."""
        units = self._units
        if units is None:
            return False
        import torch

        training = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        return units.claims(module, training)

    def _forward_pre_hook_with_kwargs(self, module: Any, args: Any, kwargs: Any) -> None:
        steps = self._steps
        if steps is None or self._blocks_step(module):
            return
        if self._in_a_step(module):  # opens a step, or another forward of the open one
            steps.begin(module, (args, kwargs))

    def _after_backward(self) -> None:
        """A backward pass returned: the step open on this thread is over."""
        if self._units is not None:
            self._units.end()
        if self._steps is not None:
            self._steps.after_backward()

    def _backward_raised(self, exc: BaseException) -> None:
        """A backward pass raised: the step open on this thread is over, failed."""
        if self._units is not None:
            self._units.end(failed=True)
        if self._steps is not None:
            self._steps.backward_raised(exc)

    def _hook(self) -> None:
        import torch
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        steps = self._steps
        assert steps is not None
        with_kwargs = self._with_kwargs

        in_a_step = self._in_a_step

        def forward_pre_hook(module: torch.nn.Module, args: Any) -> None:
            # A global pre-hook is not given keyword arguments, and a step's
            # signature needs them (memscale._dropin.fitting): a module that opened a
            # step gets a pre-hook of its own that sees them and opens its
            # later steps. This step's arguments are not known: it is tracked.
            if steps.is_open:
                steps.ran(module)
                return
            if self._blocks_step(module) or not in_a_step(module):
                return
            known = with_kwargs.get(id(module))
            if known is not None and known[0]() is module:
                return
            steps.begin(module, positional=args)
            if known is not None:  # a module that had this id died
                known[1].remove()
            with_kwargs[id(module)] = (
                weakref.ref(module),
                # A ModuleHook, not a closure: torch.save / copy.deepcopy of
                # the module meet it (memscale._hooks).
                module.register_forward_pre_hook(ModuleHook(self, "_forward_pre_hook_with_kwargs"), with_kwargs=True),
            )

        def forward_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if output is None:
                raised = sys.exc_info()[1]
                if raised is None:
                    return
                if steps.is_open:  # forward raised: the step is abandoned
                    steps.end(raised)
                if self._units is not None:
                    self._units.raised(module)

        def optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
            if self._units is not None:
                self._units.end()
            steps.end()
            return _closure_in_its_own_step(steps, args, kwargs, self._units, optimizer)

        self._handles = [
            listen(self._after_backward, self._backward_raised),  # the step ends when its backward pass returns
            register_module_forward_pre_hook(forward_pre_hook),
            register_module_forward_hook(forward_hook, always_call=True),
            register_optimizer_step_pre_hook(optimizer_pre_hook),
        ]

    def disable(self) -> None:
        """Close the open step, remove the hooks (the allocator stays installed:
        PyTorch cannot swap allocators back)."""
        global _enabled
        try:
            if self._units is not None:
                self._units.end()
            if self._steps is not None:
                self._steps.end()
            if self._blocks is not None:
                self._blocks.remove()
        finally:
            for handle in [*self._handles, *(h for _, h in self._with_kwargs.values())]:
                handle.remove()
            self._handles.clear()
            self._with_kwargs.clear()
            with _lock:
                if _enabled is self:
                    _enabled = None


def _closure_in_its_own_step(
    steps: Steps, args: Any, kwargs: Any, units: StepUnits | None = None, optimizer: Any = None
) -> tuple[Any, Any] | None:
    """An optimizer step's closure (its forward and backward) wrapped to run in
    a region that closes when it returns, before the update. With
    ``unit="auto"`` (``units``) the closure's first forward chooses the unit
    (a model with blocks runs it as the blocks'), and whichever step it opened
    ends when it returns."""

    def in_a_step(closure: Any) -> Any:
        def closure_in_a_step() -> Any:
            if units is None:
                with steps.step(keyed_by=optimizer):  # the floors of its steps are the optimizer's
                    result = closure()
                return steps.materialize(result)
            try:
                result = closure()
            except BaseException as exc:
                units.end(failed=True)
                steps.end(exc)
                raise
            units.end()
            steps.end()
            return steps.materialize(result)

        return closure_in_a_step

    return wrap_closure(args, kwargs, in_a_step)


_lock = threading.Lock()
_enabled: Enabled | None = None


def enable(config: Config | None = None) -> Enabled:
    """Run every training step of this process under DTR, with no code change.

    Call it first thing (before any CUDA use); ``python -m memscale run
    script.py`` calls it for you. Idempotent: a second call returns the same
    :class:`Enabled` (a different ``config`` is an error).

    Args:
        config: settings of the steps' regions (``Config()``: the eviction
            threshold; without one, on a GPU, evict only when an allocation
            would fail). ``Config(unit="block")``: block-level DTR
            (:func:`memscale.blocks`) on every model that trains, instead of
            a region per step; ``"auto"``: per training step, block-level DTR
            for a step a model with repeated blocks opens (its loss module
            included: :mod:`memscale._dropin.auto`), a region for the others.

    Returns:
        The enablement: ``.summary()``, ``.end_step()``, ``.disable()``.

    Raises:
        MemscaleError: enabled already with another config, or a malformed
            setting (``ConfigError``, naming it).
    """
    global _enabled
    config = config or Config()
    if not isinstance(config, Config):
        raise MemscaleError(f"memscale.enable(config={config!r}): expected a memscale.Config")
    with _lock:
        if _enabled is not None:
            if _enabled.config != config:
                raise MemscaleError(
                    f"memscale.enable() was called already with {_enabled.config}; disable() it first"
                )
            return _enabled
        installed = _install_if_gpu()
        explicit = config.threshold is not None or config.mode is not None or config.device_memory is not None
        if not explicit and percentage_of_peak() is None and default_budget().nbytes == 0:
            # Nothing to evict against: the steps run unbudgeted, to measure
            # their peak (steps of shapes seen twice run untracked).
            log.info(
                "memscale.enable(): no eviction threshold and no GPU allocator: nothing is evicted; the training "
                "steps' peak is measured (set MEMSCALE_EVICTION_THRESHOLD: bytes such as 4GiB, or a percentage "
                "of the measured peak such as 50%%)"
            )
            enabled = Enabled(config, Steps(config, None, on_demand=True, measure=True), installed)
            enabled._hook()
            _enabled = enabled
            atexit.register(_at_exit, enabled)
            return enabled
        if config.unit == "op":
            enabled = Enabled(config, Steps(config, None, on_demand=True), installed)
            enabled._hook()
        else:
            from .._blocks.drop_in import BlockModels

            steps = Steps(config, None, on_demand=True) if config.unit == "auto" else None
            enabled = Enabled(config, steps, installed)
            enabled._blocks = BlockModels(config)
            if steps is not None:
                enabled._units = StepUnits(enabled._blocks)
            enabled._blocks.hook()  # before the region's hooks: it decides first which models it takes
            if steps is not None:
                enabled._hook()
        _enabled = enabled
    atexit.register(_at_exit, enabled)
    return enabled


def enabled() -> Enabled | None:
    """The process's enablement, if :func:`enable` was called."""
    return _enabled


def _install_if_gpu() -> bool:
    """Install the memscale allocator when there is a GPU and it is not yet installed."""
    import torch

    from .._allocator.install import install, installed
    from ..errors import CUDAAlreadyInitializedError

    if installed() is not None:
        return False
    if not torch.cuda.is_available():
        return False
    try:
        install()
    except CUDAAlreadyInitializedError as exc:
        log.warning(
            "memscale.enable(): %s. DTR runs on PyTorch's own allocator: usage is counted by the engine "
            "and an allocation that fails is not retried after evictions",
            exc,
        )
        return False
    return True


def _at_exit(enabled: Enabled) -> None:
    try:
        enabled.disable()
    except Exception as exc:  # the process is ending: report, do not raise
        log.warning("memscale: closing the last step at exit failed: %s", exc)
    if enabled.active:
        log.info("memscale: %s", enabled.summary())
