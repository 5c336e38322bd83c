"""``Config(unit="block")``: block-level DTR behind the drop-in API and ``enable()``.

:class:`BlockSteps` stands where :class:`memscale._dropin.steps.Steps` stands for the
region: the drop-in API keeps it per wrapped model and asks it for the
:class:`~memscale.Summary`; :class:`BlockModels` is ``memscale.enable()``'s
(``python -m memscale run --unit block``): block-level DTR on every model that
trains. Blocks need no step region, so there is nothing to
open or close; :func:`blocks_budget` turns the Config's budget (threshold,
mode, device memory) into what :class:`~.tracker.BlockDTR` takes.

Holds no policy: the budget is converted to bytes here, evictions are the engine's.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .._allocator.budget import percentage_of_peak, threshold_budget
from .._stats import GRANULE_KEYS, Summary
from .._allocator.device import module_device_index
from ..config import Config, is_percentage, parse_size
from ..errors import ConfigError
from .find import find_blocks
from .tracker import BlockDTR, device_allocated

log = logging.getLogger("memscale")


def blocks_budget(config: Config, model: torch.nn.Module) -> tuple[int | str | None, Callable[[], int] | None]:
    """``(budget, allocated)`` for :class:`BlockDTR` from ``config``.

    On a GPU the Config's threshold or mode is a bound of the device's
    allocated memory (``allocated`` reads it); on the CPU bytes are bytes of
    block activations and a percentage (or a mode) is of what the first step's
    blocks held, unless ``Config.device_memory`` gives the memory to take it
    of. ``None``: the eviction threshold (no threshold or mode in the Config
    and one is set); a threshold that is a percentage with no GPU to take it
    of is of the first step's block activations, as a Config's.
    """
    index = module_device_index(model)
    if config.threshold is None and config.mode is None:
        percentage = percentage_of_peak(index)
        if percentage is not None:  # no GPU to take it of (memscale run --threshold 50% on the CPU)
            return percentage, None  # of the first step's block activations
        if threshold_budget(index) is not None:
            return None, None
    device_bytes = config.device_bytes()
    if index is not None:
        from .._allocator.stats import device_total_memory

        total = device_bytes or device_total_memory(index)
        if total:
            return config.budget_for(int(total)), device_allocated(index)
    if device_bytes:
        return config.budget_for(device_bytes), None
    if config.threshold is not None and not is_percentage(config.threshold):
        return parse_size(config.threshold, name="Config.threshold", allow_percent=False), None
    if config.threshold is not None:
        return str(config.threshold), None
    return f"{config.fraction * 100:g}%", None


def summary_of(tracker: BlockDTR) -> Summary:
    """A tracker's counters as the drop-in API's :class:`~memscale.Summary`."""
    s = tracker.summary()
    return Summary(
        steps=int(s["steps"]),
        evictions=int(s["evictions"]),
        bytes_evicted=int(s.get("bytes_evicted", 0)),
        rematerializations=int(s["rematerializations"]),
        base_cost_ns=int(s["base_cost_ns"]),
        remat_cost_ns=int(s["remat_cost_ns"]),
        peak_usage=int(s["peak_usage"]),
        budget=int(s["budget"]) or None,
        baseline_peak=int(s["first_step_peak"]) or None,
        budget_source=tracker.budget_source,
        **{key: int(s.get(key, 0)) for key in GRANULE_KEYS},
    )


def block_unit(config: Config, model: torch.nn.Module) -> bool:
    """Whether ``model`` runs block-level DTR under ``config``: ``unit="block"``,
    or ``unit="auto"`` and the model has repeated blocks."""
    if config.unit != "auto":
        return config.unit == "block"
    try:
        find_blocks(model)
    except ConfigError:
        return False
    return True


class BlockSteps:
    """The drop-in API's state of a model wrapped with ``Config(unit="block")``
    (the part of :class:`memscale._dropin.steps.Steps`'s interface the API uses)."""

    #: Blocks open no region per step: there is never one to close.
    is_open = False

    def __init__(self, config: Config, model: torch.nn.Module) -> None:
        budget, allocated = blocks_budget(config, model)
        self.config = config
        self.tracker = BlockDTR(model, budget, heuristic=config.heuristic, allocated=allocated)

    def end(self, exc: BaseException | None = None) -> None:
        """A step ends: nothing to close (units end with their backward)."""

    def updates(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` ends a step of this model: never needed here."""
        return False

    def remove(self) -> None:
        """Detach: the blocks' hooks go (what the API's hook list calls)."""
        self.tracker.detach()

    def summary(self) -> Summary:
        """The totals in the drop-in API's terms."""
        return summary_of(self.tracker)

    def log_summary(self, where: str) -> None:
        """Log the totals (``Config.log_summary``)."""
        if self.config.log_summary:
            log.info("memscale (%s, blocks): %s", where, self.summary())


def _budget_name(config: Config) -> str:
    """Where a Config's budget comes from, in words."""
    if config.threshold is not None:
        return f"Config.threshold={config.threshold!r}"
    if config.mode is not None:
        return f"Config.mode={config.mode!r}"
    return "the eviction threshold"


class BlockModels:
    """``memscale.enable(Config(unit="block"))``: every model that trains in
    the process gets block-level DTR (``unit="auto"``: every model with
    repeated blocks; the others are left to the region's hooks).

    A global forward pre-hook sees the first training forward of each
    outermost module (a module not inside a model seen before) and puts a
    :class:`BlockDTR` on it, with the Config's budget; from then on the
    blocks' own hooks do the work. A model without repeated blocks is an
    error (the budget would not apply to it: ``unit="auto"`` gives such
    models a region per step); a module without parameters (a loss) is
    left alone.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.trackers: list[BlockDTR] = []
        self._inside: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # modules of models seen
        self._tracked: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # modules of tracked models
        self._handle: Any = None

    def tracks(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` is (inside) a model with block-level DTR, which
        ``Config(unit="auto")``'s regions then leave alone."""
        return module in self._tracked

    def hook(self) -> None:
        """Start watching forwards (idempotent)."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        if self._handle is None:
            self._handle = register_module_forward_pre_hook(self._first_forward)

    def _first_forward(self, module: torch.nn.Module, args: Any) -> None:
        if module in self._inside or not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return
        self._inside.update(module.modules())
        if not block_unit(self.config, module):
            return  # auto, and no repeated blocks: the region's (its hook comes after this one)
        try:
            budget, allocated = blocks_budget(self.config, module)
            self.trackers.append(BlockDTR(module, budget, heuristic=self.config.heuristic, allocated=allocated))
            self._tracked.update(module.modules())
        except ConfigError as exc:
            if next(module.parameters(), None) is None:
                return  # no parameters (a loss module): no model's activations to hold
            # Never train with the threshold silently dropped.
            raise ConfigError(
                f"memscale (unit='block'): {type(module).__name__} cannot have block-level DTR, so its budget "
                f"({_budget_name(self.config)}) "
                f"would not apply: {exc}. Use unit 'auto' (MEMSCALE_UNIT=auto, --unit auto): block-level DTR "
                "for models with repeated blocks and a region per step for the others"
            ) from exc

    def summary(self) -> Summary:
        """Totals over every tracked model."""
        total = Summary()
        for part in map(summary_of, self.trackers):
            total = total.merged(part)
        return total

    def remove(self) -> None:
        """Stop: the global hook and every model's block hooks go."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        for tracker in self.trackers:
            tracker.detach()
