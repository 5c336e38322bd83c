"""One DTR region per training step: what the drop-in API's hooks open and close.

:class:`Steps` is the state behind :func:`memscale.wrap`, :func:`memscale.optimize`,
:func:`memscale.enable` and the Trainer integrations (:mod:`memscale._dropin.api` says
where a step begins and ends): the step's budget (the eviction threshold, the
config's mode or threshold, a baseline step's peak on the CPU), the region the
steps run in, warmup and baseline steps, and whether a step needs a region at
all (steps whose shapes fitted the budget run untracked, :mod:`memscale._dropin.fitting`).
Its totals are the :class:`~memscale.Summary` users read.

Not thread-safe by design: a step is opened and closed on the training thread.
Holds no policy: the budget is converted to bytes here, evictions are the engine's.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import _stats
from .._allocator.boundary import step_boundary
from .._allocator.budget import Budget, default_budget, percentage_of_peak, threshold_budget, threshold_name
from .distributed import patch_fsdp
from .._allocator.device import module_device_index
from .._allocator.peak import PeakProbe
from .fitting import FitRecord, signature, untracked_steps_enabled
from .floors import Floors, Least
from .undo import Undo
from .._stats import Summary
from ..config import Config, format_bytes, is_percentage, parse_size
from ..errors import MemscaleError

if TYPE_CHECKING:
    import torch

    from .._region import DTRRegion

log = logging.getLogger("memscale")


def _dtr() -> Any:
    try:
        from .._region import dtr
    except ImportError as exc:
        raise MemscaleError(f"the DTR region (memscale.dtr) is unavailable: {exc}") from exc
    return dtr


def _region_open_here() -> bool:
    """Whether a DTR region is entered on this thread."""
    try:
        from .._region.steps import open_region
    except ImportError:  # no region here: none is open
        return False
    return open_region() is not None


def _module_device_bytes(module: torch.nn.Module) -> int | None:
    """Total memory of the GPU holding ``module``'s first parameter (None on CPU)."""
    import torch

    index = module_device_index(module)
    if index is None:
        return None
    from .._allocator.stats import device_total_memory

    if torch.cuda.is_initialized():
        return int(torch.cuda.get_device_properties(index).total_memory)
    return device_total_memory(index)


class Steps:
    """Opens one region per training step and keeps the totals.

    Not thread-safe by design: a step is opened and closed on the training
    thread (the region is a thread-local dispatch mode).
    """

    def __init__(
        self, config: Config, module: torch.nn.Module | None, on_demand: bool = False, measure: bool = False
    ) -> None:
        self.config = config
        # No threshold where nothing can be evicted against (the CPU): the steps
        # run unbudgeted to measure their peak, and steps whose signature ran
        # twice run untracked (memscale run prints the peak and the threshold
        # that would halve it).
        self._measure = measure
        # The threshold is a percentage with no GPU to take it of: of the
        # baseline step's peak (set when that step's budget is resolved).
        self._percentage: str | None = None
        # With neither Config.threshold nor Config.mode nor an eviction
        # threshold: True evicts only when an allocation would fail (on a GPU
        # with the memscale allocator; memscale.enable), False uses DEFAULT_MODE.
        self._on_demand = on_demand
        self._module_ref = weakref.ref(module) if module is not None else None
        self._region: DTRRegion | None = None
        self._baseline_region: DTRRegion | None = None
        self._finished: list[dict[str, Any]] = []  # summaries of regions replaced
        self._open = False
        self._opened_by: Any = None  # the hooked module whose forward opened the open step
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
        #: Modules whose forward ran in a step: their parameters' ``.grad`` are
        #: made plain when a step's region exits (see :meth:`_plain_gradients`).
        self._ran: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        #: Peak and minimum budget of steps that failed at their end (the
        #: region's exit raised, so its summary does not have them).
        self._failed_peak = 0
        self._failed_floor = 0
        #: The floor each step shape measured: a step below it fails before it runs.
        self.floors = Floors()
        self._floor_key: Any = None  # the open step's shape (memscale._dropin.floors)
        #: While the first step of a shape no step measured runs unbudgeted
        #: under a budget of a measured peak: the budgeted region it stands for.
        self._budgeted: DTRRegion | None = None
        #: The open step's buffers and gradients as it opened, when it may stop
        #: partway (its budget is not known to work for its shapes).
        self._undo: Undo | None = None
        self._floor_module: Any = None

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
        region.ends_on_failed_backward = True  # a backward that raised ends the step (begin, end)
        return region

    def _budget(self, module: torch.nn.Module | None) -> Budget | None:
        """The step's budget; ``None``: run an unbudgeted baseline step first
        (its peak is then the "device memory" the mode takes a fraction of)."""
        config = self.config
        device = module_device_index(module)
        if config.threshold is None and config.mode is None:
            self._percentage = percentage_of_peak(device)
            if self._percentage is not None:
                return None  # measured by a baseline step: see end()
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

    def begin(
        self, module: torch.nn.Module | None = None, args: Any = None, positional: Any = None, keyed_by: Any = None
    ) -> bool:
        """Open the step's region unless one is open; return whether it opened.

        ``args``: the step's arguments, ``(args, kwargs)`` (``None``: not
        known), whose signature lets a step that fitted the budget before run
        untracked (:mod:`memscale._dropin.fitting`); ``positional``: the
        positional arguments alone, where ``args`` is not known.

        Raises:
            BudgetBelowFloorError: the step's budget is below the floor a step
                of the same shape measured (:mod:`memscale._dropin.floors`);
                the step did not start.
        """
        if not self._open and _region_open_here():
            # The program entered a region of its own (memscale.dtr) before
            # this step's first forward: its region is the step's; regions do
            # not nest, so the step opens none.
            return False
        if self._open:
            if self._thread != threading.get_ident():
                raise MemscaleError("a memscale step was opened on another thread and is still open")
            failed = self._region.failed_backward if self._region is not None else None
            if failed is None:
                self._another_forward(module, args)
                return False
            # The open step's backward raised and the program caught it: that
            # step is over (closed as failed), and this forward starts the next.
            self.end(failed)
        if self._region is None:
            if self._steps < self.config.warmup_steps:
                self._warmup = True
                source = f"warmup step {self._steps + 1} of Config.warmup_steps={self.config.warmup_steps}"
                self._region = self._new_region(Budget(0, source))
            else:
                self._region = self._make_region(module if module is not None else self.module)
        region = self._region
        keyed = module if module is not None else self.module
        if keyed is None and keyed_by is not None:
            # No module opens it (an optimizer's closure under enable()): its
            # floor is kept under what runs it (the optimizer).
            keyed, positional = keyed_by, () if positional is None else positional
        shape = Floors.shape(keyed, args, positional)
        if not self._warmup and region is not self._baseline_region:
            if self._baseline_region is not None and region.budget > 0 and shape.key is not None \
                    and self.floors.measuring(shape, keyed):
                # The budget is of a measured step's peak (no GPU): the first
                # steps of shapes not measured yet (floors.MEASURED_STEPS: the
                # second carries in what the first made - gradients under
                # accumulation, a GAN's graph from the phase before) are
                # measured the same way - they run unbudgeted, and the steps
                # of their shapes after them are checked against their floor
                # and least threshold before they start.
                self._budgeted = region
                which = "one of the first steps" if self.floors.has(shape, keyed) else "the first step"
                region = self._region = self._new_region(
                    Budget(0, f"{which} of its shapes, measured (the budget {region.budget_source} is of a "
                              "measured step)"))
            else:
                self.floors.check(shape, keyed, region.budget, region.budget_source)
        # The first step of a shape measures its floor: its engine also
        # searches the least budget the step runs at (replays of its program).
        region.least_budget = shape.key is not None and not self.floors.known(shape, keyed)
        self._floor_key, self._floor_module = shape.key, keyed
        self._undo = None
        if region.budget > 0 and not self._warmup and isinstance(keyed, _nn_module()) \
                and not self.floors.works(shape, keyed, region.budget):
            self._undo = Undo(keyed)
        self._signature = None
        if self.fits.enabled and args is not None and (region.budget > 0 or self._measure) and not self._warmup:
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
        if module is not None:
            self._ran.add(module)
        if self.fits.runs_untracked(self._signature):
            self._probe = PeakProbe()
        else:
            self._enter()
        return True

    def _enter(self) -> None:
        patch_fsdp()  # FSDP2's hooks run outside the region (memscale._dropin.distributed)
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
        if exc is None:
            exc = region.failed_backward  # its backward raised: the step failed
        self._open = False
        self._opened_by = None
        shape = (self._floor_key, self._floor_module)
        self._floor_key = self._floor_module = None  # the module is not kept alive
        if self._probe is not None:  # an untracked step
            peak = self._probe.close()
            self._probe = None
            self._untracked_peak = max(self._untracked_peak, peak or 0)
            self.fits.ran_untracked(self._signature, peak, region.budget, ok=exc is None)
            self._undo = None
            self._steps += 1
            step_boundary(_cuda_device())  # no region: the allocator hears of the step here
            return
        # The region's exit makes escaping tensors resident and plain, and gives
        # the parameters plain .grad tensors: the optimizer step sees those.
        try:
            region.__exit__(type(exc) if exc is not None else None, exc, exc.__traceback__ if exc else None)
        except BaseException as failed:
            self.fits.tracked(self._signature, {}, ok=False)
            # A step that failed at its end (what leaves it does not fit the
            # budget): its stats come with the error, not the region's summary.
            stats = getattr(failed, "stats", None)
            if isinstance(stats, dict):
                self._failed_peak = max(self._failed_peak, int(stats.get("peak_usage", 0) or 0))
                self._failed_floor = max(self._failed_floor, int(stats.get("min_budget", 0) or 0))
                self._measured(shape, stats, whole=False)
            self._back_to_budget(region)
            self._undo_step(failed)
            raise
        last = region.last_summary()
        floor = int(last.get("min_budget", 0) or 0)
        if exc is None and region.budget > 0:
            # The step ran whole within its budget: that budget works, whatever
            # the engine's bound counts (a few bytes under the minimum evictee
            # size counted at once that were not).
            floor = min(floor, region.budget)
        self._measured(shape, {**last.get("engine", {}), "min_budget": floor}, whole=exc is None)
        self._plain_gradients(region)
        self.fits.tracked(
            self._signature,
            region.last_summary(),
            ok=exc is None,
            forwards=self._forwards,
            device_bytes=self._device_bytes,
            unbounded=self._measure,
        )
        if exc is not None:
            self._undo_step(exc)
        self._undo = None
        self._steps += 1
        self._back_to_budget(region)
        if self._warmup and self._steps >= self.config.warmup_steps:
            self._finished.append({**region.summary(), "warmup": True})  # unbudgeted: no peak of a budgeted step
            self._region = None
            self._warmup = False
        elif region is self._baseline_region and exc is None:
            baseline = dict(region.summary())
            peak = int(baseline.get("peak_usage", 0))
            if peak > 0:  # later steps run under budget_for(peak) in a region of their own
                self._finished.append({**baseline, "baseline": True})
                self._region = self._new_region(self._baseline_budget(peak))

    def _undo_step(self, exc: BaseException) -> None:
        """The step failed: what it changed in the model's buffers and
        gradients is put back, and a memscale error says so."""
        undo, self._undo = self._undo, None
        if undo is None:
            return
        undo.restore()
        if isinstance(exc, MemscaleError) and exc.args and isinstance(exc.args[0], str):
            exc.args = (f"{exc.args[0]} (the step's changes to the model's buffers - running statistics - and "
                        "gradients were undone: running it again does not count them twice)", *exc.args[1:])

    def _back_to_budget(self, region: DTRRegion) -> None:
        """A measuring step of new shapes ended (``region``: its): its counters
        are kept as a baseline step's, and the budgeted region is back."""
        budgeted, self._budgeted = self._budgeted, None
        if budgeted is not None:
            self._finished.append({**region.summary(), "baseline": True})
            self._region = budgeted

    def _measured(self, shape: tuple[Any, Any], stats: dict[str, Any], whole: bool) -> None:
        """The floor of the step that ended (``shape``: its key and module;
        ``stats``: its engine's), measured."""
        key, module = shape
        search = stats.get("least_budget")
        if isinstance(search, dict):
            tries = [(t.get("budget"), t.get("status"), round(t.get("overhead", 0), 2))
                     for t in search.get("tries") or ()]
            log.debug("memscale: step %d's least budget search: %s", self._steps + 1,
                      {k: v for k, v in search.items() if k != "tries"} | {"tries": tries})
        evicted = any(int(stats.get(name, 0) or 0) for name in ("evictions", "swaps_out"))
        self.floors.measured(
            key, module, int(stats.get("min_budget", 0) or 0), self._steps + 1, whole, stats.get("min_budget_parts"),
            peak=0 if evicted else int(stats.get("peak_usage", 0) or 0), least=Least.of(stats.get("least_budget")),
        )

    def _baseline_budget(self, peak: int) -> Budget:
        """The budget of the steps after the baseline step that peaked at ``peak``."""
        if self._percentage is not None:
            name = threshold_name()
            nbytes = max(1, parse_size(self._percentage, name=name, total=peak))
            given = f"{name} {self._percentage}" if name.startswith("--") else f"{name}={self._percentage}"
            return Budget(
                nbytes,
                f"{given}: of the first step's measured peak {format_bytes(peak)} (no GPU: a percentage is of the "
                "measured peak)",
            )
        return Budget(self.config.budget_for(peak), self.config.describe_budget(peak, of="the baseline step's peak"))

    @contextlib.contextmanager
    def step(self, module: torch.nn.Module | None = None, args: Any = None, keyed_by: Any = None) -> Iterator[None]:
        """``with steps.step(): ...``: one whole step in a region (``args``: see :meth:`begin`)."""
        opened = self.begin(module, args, keyed_by=keyed_by)
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
        """Forward pre-hook (with keyword arguments) of a hooked module: open
        the step's region, or note another forward of the open step."""
        if self.begin(module, (args, kwargs)):
            self._opened_by = module

    def forward_hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """Forward hook of a hooked module (always called, also when forward raised).

        Closes the step's region when a forward raised (the step is abandoned;
        PyTorch calls ``always_call`` hooks from its ``except`` block with
        ``output=None``), and closes a region that the no-grad forward of this
        module opened.
        """
        import torch

        opener = self._opened_by is module
        if opener:
            self._opened_by = None
        raised = sys.exc_info()[1] if output is None else None
        if raised is not None:
            self.end(raised)
        elif opener and not torch.is_grad_enabled():
            self.end()

    def ran(self, module: torch.nn.Module) -> None:
        """``module``'s forward ran in the open step (its parameters' gradients
        are made plain at the step's end)."""
        self._ran.add(module)

    def _plain_gradients(self, region: DTRRegion) -> None:
        """Plain ``.grad`` for every parameter of the modules the steps ran.

        The region makes plain the gradients of the parameters its ops read;
        a backward pass through a graph an earlier step built (a GAN's
        generator, trained through the discriminator in the next step) also
        accumulates into parameters this step's ops never read, and their
        first gradient would be left a region tensor.
        """
        import torch

        params: dict[int, torch.Tensor] = {}
        root = self.module
        if root is not None:
            params.update((id(p), p) for p in root.parameters())
        for module in list(self._ran):
            params.update((id(p), p) for p in module._parameters.values() if p is not None)
        with torch.no_grad():
            for param in params.values():
                grad = param.grad
                if grad is not None and type(grad) is not torch.Tensor:
                    plain = region.unwrap(grad)
                    if plain is not grad:
                        param.grad = plain

    def after_backward(self) -> None:
        """A backward pass returned (:mod:`memscale._dropin.backward`): the step
        open on this thread is over, whatever updates the parameters next."""
        if self._open and self._thread == threading.get_ident():
            self.end()

    def backward_raised(self, exc: BaseException) -> None:
        """A backward pass raised ``exc``: the step open on this thread is over,
        failed (closed before the error reaches the program)."""
        if self._open and self._thread == threading.get_ident():
            self.end(exc)

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
            peak_usage=max(self._untracked_peak, self._failed_peak),
            min_budget=self._failed_floor,
            least_threshold=self.floors.least_threshold(),
        )
        summaries = list(self._finished)
        if self._region is not None:
            current = dict(self._region.summary())
            current["baseline"] = self._region is self._baseline_region or self._budgeted is not None
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
            out.min_budget = max(out.min_budget, int(current.get("min_budget", 0) or 0))
            for key in _stats.GRANULE_KEYS:
                setattr(out, key, getattr(out, key) + int(current.get(key, 0) or 0))
            budget = current.get("budget")
            out.budget = int(budget) if budget else None
            out.budget_source = current.get("budget_source") or out.budget_source
            out.tuning = current.get("tuning") or out.tuning
        return out

    def log_summary(self, what: str) -> None:
        """Log the totals if the config asks for it."""
        if self.config.log_summary:
            log.info("memscale %s: %s", what, self.summary())


def _nn_module() -> type:
    import torch

    return torch.nn.Module


def _cuda_device() -> int | None:
    """The current CUDA device, or None without CUDA (an untracked step's boundary)."""
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() else None
