"""The hooks on a model's blocks, the engine behind them, and the budget.

:class:`BlockDTR` puts two hooks on each tracked block: a forward pre-hook
(first of the block's pre-hooks) that starts a :class:`~.unit.Unit` and pushes
its ``saved_tensors_hooks``, and a forward hook that runs even when the forward
raised and pops them. When the block returns, the unit's activations are
registered with the Go engine as the output of one op (cost: the block's
forward time; no inputs: the block's inputs stay with the program) and the
engine's budget loop runs; it names the units to evict, whose activations are
dropped. A slot unpacked in backward whose unit is evicted asks for a plan,
makes room and recomputes the unit (:meth:`BlockDTR.rebuild`). When autograd has
dropped a unit's last slot, the unit is released; when no unit of a step is
left, the step is over: its engine is closed (its counters kept) and the next
step gets a fresh one, with the budget a percentage resolves to once the first
step measured its peak.

When the budget bounds the device's allocated bytes (``allocated=``, or the
eviction threshold on a GPU), the blocks get what the rest of the program
leaves, less what it allocates between their hooks (the LM head's tail after
the forward, a block's temporaries), learned from the allocator's watermark
step by step: :class:`~.device.DeviceShare`, the model's forward hooks. With
the memscale allocator, an allocation that fails on the device also asks the
blocks to drop (:meth:`BlockDTR.reclaim`, through :mod:`memscale._region.reclaim`).

Ops run as plain PyTorch: nothing is intercepted per op, so the bookkeeping is
per block call and per saved tensor (a few microseconds each), not per op.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .._allocator.budget import THRESHOLD_ENV, threshold_budget
from .._hooks import ModuleHook
from .._native.engine import ACTION_DROP, STEP_RERUN, Engine, NoRoomError
from .._region import reclaim as reclaim_registry
from .._stats import overhead
from .._allocator.device import module_device_index
from .._allocator.boundary import step_boundary
from .._allocator.install import installed
from .._allocator.stats import Granules, memory_allocated
from ..config import format_bytes, is_percentage, parse_size
from ..errors import ConfigError, MemscaleError
from .device import DeviceShare
from .find import find_blocks
from .unit import Unit

perf_ns = time.perf_counter_ns
log = logging.getLogger("memscale")

#: A block's buffers up to this size are copied at every call (BatchNorm's
#: running statistics), so a call that updates them can still be recomputed;
#: larger ones only once the block was seen updating them.
_COPIED_BUFFER_BYTES = 1 << 20

#: Counters a step's engine contributes to :meth:`BlockDTR.summary`.
_COUNTERS = ("evictions", "bytes_evicted", "rematerializations", "base_cost_ns", "remat_cost_ns")


def device_allocated(index: int) -> Callable[[], int]:
    """``() -> bytes allocated on CUDA device index``: memscale's count when its
    allocator is PyTorch's (``torch.cuda.memory_allocated`` raises under a
    pluggable allocator), else PyTorch's."""
    if installed() is not None:
        return lambda: int(memory_allocated(index))
    return lambda: int(torch.cuda.memory_allocated(index))


def _no_training_cache(model: torch.nn.Module) -> None:
    """Turn off a Hugging Face model's key/value cache, as its own gradient
    checkpointing does: a block that appends to a cache does not repeat, so
    it could not be recomputed (and training never reads the cache)."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False) is True:
        config.use_cache = False
        log.info("memscale.blocks: set %s.config.use_cache = False (a cache makes blocks unrepeatable)", type(model).__name__)


class BlockDTR:
    """Block-level DTR on a model (see :func:`memscale.blocks`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        budget: int | str | None = None,
        modules: list[torch.nn.Module] | None = None,
        heuristic: str | None = None,
        allocated: Callable[[], int] | None = None,
    ) -> None:
        if modules is None:
            named = find_blocks(model)
        else:
            names = {id(m): n for n, m in model.named_modules()}
            named = [(names.get(id(m), type(m).__name__), m) for m in modules]
            if not named:
                raise ConfigError("memscale.blocks: modules=[] names no block; leave it out to find the blocks")
        self.blocks = named
        _no_training_cache(model)
        #: With the eviction threshold as the budget on a GPU, or given: the
        #: device's allocated bytes (the budget then bounds the whole device's
        #: memory, and the engine's budget is what it leaves the blocks).
        self.device_share = DeviceShare(allocated) if allocated is not None else None
        self._percent: str | None = None
        if budget is None:
            self._budget, self.budget_source = self._threshold_budget(model)
        elif is_percentage(budget):
            parse_size(budget, name="memscale.blocks(budget)", total=1 << 40)  # checks the range
            if allocated is not None:
                raise ConfigError(
                    f"memscale.blocks(budget={budget!r}, allocated=...): a percentage is of the blocks' "
                    "activations; with allocated= give the device's budget in bytes"
                )
            self._percent = str(budget)
            self._budget = 0  # the first step measures the peak
            self.budget_source = f"blocks(budget={budget!r}) of the first step's block activations"
        else:
            self._budget = parse_size(budget, name="memscale.blocks(budget)", allow_percent=False)
            if self._budget == 0:
                raise ConfigError("memscale.blocks(budget=0): give a positive size (\"2GiB\") or a percentage (\"50%\")")
            self.budget_source = f"blocks(budget={budget!r})"
        self._heuristic = heuristic
        self._engine: Engine | None = None
        #: Registered units by engine tensor id; weak: a unit lives as long as
        #: autograd holds one of its slots (or it waits in ``_done``).
        self._units: weakref.WeakValueDictionary[int, Unit] = weakref.WeakValueDictionary()
        self._open = 0  # units started and not released (registered or not)
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._done: list[Unit] = []  # released by autograd, not told to the engine yet
        #: Blocks seen changing their buffers in place (BatchNorm's running
        #: statistics): their calls copy the buffers first, for a recompute.
        self._mutating: set[int] = set()
        self._totals = dict.fromkeys(_COUNTERS, 0)
        self._steps = 0
        self._peak = 0  # of the budgeted steps
        self._first_peak = 0
        self._last_peak = 0
        self._largest = 0  # bytes of the largest unit registered
        #: Bytes a block call kept last time, per (block, input shapes).
        self._sizes: dict[tuple[Any, ...], int] = {}
        self._calls = 0
        self._handles: list[Any] = []
        for name, block in named:
            # ModuleHooks, not closures or bound methods: torch.save and
            # copy.deepcopy of the model meet them (memscale._hooks); a deep
            # copy is tracked by this tracker (see __deepcopy__).
            self._handles.append(
                block.register_forward_pre_hook(
                    ModuleHook(self, "_pre", name, share_on_copy=True), with_kwargs=True, prepend=True
                )
            )
            self._handles.append(
                block.register_forward_hook(ModuleHook(self, "_post", share_on_copy=True), always_call=True)
            )
        self._model_forwards = 0
        #: Block calls registered in the running forward, and in the last one
        #: (its last call starts the tail of a device budget).
        self._forward_calls = 0
        self._calls_per_forward = 0
        self._device_index: int | None = None
        #: What the memscale allocator did to its granules since the model's
        #: first training forward on a GPU.
        self._granules = Granules()
        #: The device whose allocator's reclaimer asks these blocks to drop.
        self._reclaims_for: int | None = None
        self._handles.append(model.register_forward_pre_hook(ModuleHook(self, "_model_forward", share_on_copy=True)))
        self._handles.append(model.register_forward_hook(ModuleHook(self, "_model_forward_end", share_on_copy=True)))

    # ------------------------------------------------------------ public

    def _threshold_budget(self, model: torch.nn.Module) -> tuple[int, str]:
        """The eviction threshold as the budget: of the device's allocated
        memory on a GPU, of the blocks' activations on the CPU."""
        threshold = threshold_budget()
        if threshold is None:
            raise ConfigError(
                f"memscale.blocks: no budget given and no {THRESHOLD_ENV} set; give one "
                '(bytes of block activations such as "2GiB", or a percentage of them such as "50%") '
                f"or set {THRESHOLD_ENV}"
            )
        index = module_device_index(model)
        if self.device_share is None and index is not None:
            self.device_share = DeviceShare(device_allocated(index))
        return threshold.nbytes, threshold.source

    @property
    def budget(self) -> int:
        """The budget of the block activations in bytes (0 while a percentage waits for the first step)."""
        return self._budget

    def set_budget(self, budget: int | str) -> None:
        """A new budget (bytes or a size string; of the device's memory when
        it is measured, see :func:`memscale.blocks`); the running step's
        engine gets it now."""
        nbytes = parse_size(budget, name="BlockDTR.set_budget", allow_percent=False)
        if nbytes == 0:
            raise ConfigError("BlockDTR.set_budget(0): give a positive size")
        with self._lock:
            self._percent = None
            self._budget = nbytes
            if self._engine is not None:
                self._engine.set_budget(nbytes)

    def summary(self) -> dict[str, Any]:
        """Counters over every step so far (the running step's included).

        A step ends when its last unit is told to the engine, which the next
        step's first block call does: the units autograd released since are
        told here first, so a step whose backward is over is counted (the
        last step of a run had no next step to end it)."""
        self._flush()
        with self._lock:
            totals = dict(self._totals)
            peak = self._peak
            if self._engine is not None:
                stats = self._engine.stats()
                for key in _COUNTERS:
                    totals[key] += int(stats[key])
                if self._budget:
                    peak = max(peak, int(stats["peak_usage"]))
        base = totals["base_cost_ns"]
        return {
            "blocks": len(self.blocks),
            "budget": self._budget,
            "steps": self._steps,
            "block_calls": self._calls,
            "peak_usage": peak,
            "first_step_peak": self._first_peak,
            "last_step_peak": self._last_peak,
            "largest_block": self._largest,
            # Device budgets (see DeviceShare): the tail after the forward and
            # the headroom kept back, in bytes, as learned so far.
            "device_tail": self.device_share.tail if self.device_share is not None else 0,
            "device_headroom": self.device_share.headroom if self.device_share is not None else 0,
            "evictions": totals["evictions"],
            "bytes_evicted": totals["bytes_evicted"],
            "rematerializations": totals["rematerializations"],
            "base_cost_ns": base,
            "remat_cost_ns": totals["remat_cost_ns"],
            "compute_overhead": overhead(base, totals["remat_cost_ns"]),
            # What the memscale allocator did to its granules, and the large
            # requests its step plans placed or missed, since the first
            # training forward (GPU with the allocator; 0 otherwise).
            **self._granules.totals(),
        }

    def detach(self) -> None:
        """Remove the hooks (units already made stay valid until backward)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._reclaims_for is not None:
            reclaim_registry.unregister(self, self._reclaims_for)
            self._reclaims_for = None

    @property
    def closed(self) -> bool:
        """Whether the hooks are gone (the allocator's reclaimer skips it)."""
        return not self._handles

    def reclaim(self, need: int) -> int:
        """An allocation of the device failed for ``need`` bytes (the memscale
        allocator's reclaimer, any thread): drop the units the engine names,
        whatever the budget; returns the bytes that freed (0: could not help).

        Only when no other thread is inside the tracker: the thread running a
        block's forward or a recompute holds it already and reclaims. A unit
        whose tensors backward holds right now frees only what it alone held,
        and is recomputed if backward needs more of it (same values: its
        state is replayed).
        """
        share = self.device_share
        if need <= 0 or share is None or not self._lock.acquire(blocking=False):
            return 0
        try:
            engine = self._engine
            if engine is None:
                return 0
            before = share.allocated()
            self._drop(engine.reclaim(need))
            return max(0, before - share.allocated())
        finally:
            self._lock.release()

    def __deepcopy__(self, memo: dict[int, Any]) -> BlockDTR:
        # copy.deepcopy(model) copies the hooks: the copy is tracked by the same
        # BlockDTR (an engine handle cannot be copied).
        return self

    def __enter__(self) -> BlockDTR:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # ------------------------------------------------------------ hooks

    def _model_forward(self, model: torch.nn.Module, args: Any) -> None:
        """A training forward of the model begins: the last step ends (its
        released units told to the engine), a device budget's share starts
        measuring; and say so, once, when the model trains but its blocks are
        never called through ``__call__`` (a model that calls
        ``block.forward()`` directly passes by module hooks: nothing would be
        tracked, silently)."""
        if not torch.is_grad_enabled():
            return
        self._flush()  # the last step ends before this one starts
        self._forward_calls = 0
        if not self._granules.running and installed() is not None:
            self._granules.start(module_device_index(model))
        share = self.device_share
        if share is not None and self._budget:
            self._device_index = module_device_index(model)
            if self._device_index is not None:
                share.forward_started(self._device_index)
        self._model_forwards += 1
        if self._model_forwards == 2 and self._calls == 0:
            log.warning(
                "memscale.blocks: %s ran a training forward and none of its %d blocks (%s, ...) was called "
                "through module hooks - a model that calls block.forward() directly bypasses them, so nothing "
                "is tracked; pass the modules it does call with modules=[...]",
                type(model).__name__, len(self.blocks), self.blocks[0][0],
            )

    def _model_forward_end(self, model: torch.nn.Module, args: Any, output: Any) -> None:
        """Device budgets: the tail starts here unless it did at the last block."""
        if not torch.is_grad_enabled():
            return
        self._calls_per_forward = self._forward_calls
        share = self.device_share
        if share is not None and not share.in_tail:
            self._start_tail(at_last_block=False)

    def _start_tail(self, at_last_block: bool) -> None:
        """Device budgets: make room for what the tail took last time, and measure it again."""
        share, index = self.device_share, self._device_index
        if share is None or index is None or not self._budget:
            return
        with self._lock:
            if self._engine is not None and share.tail:
                before = int(self._engine.status.usage)
                self._make_room(share.tail, None, share.tail)
                log.debug("memscale.blocks: room for a tail of %d: %d allocated, blocks %d -> %d",
                          share.tail, share.allocated(), before, int(self._engine.status.usage))
        share.tail_started(index, at_last_block)

    def _pre(self, name: str, block: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Forward pre-hook of block ``name``: a call begins (or a recompute captures)."""
        tls = self._tls
        recompute = getattr(tls, "recompute", None)
        if recompute is not None:
            unit, hooks = recompute
            if unit.block is block and getattr(tls, "capturing", None) is None:
                hooks.__enter__()
                tls.capturing = hooks
            return
        if not torch.is_grad_enabled() or getattr(tls, "unit", None) is not None:
            return  # evaluation, or a tracked block inside another
        self._flush()
        unit = Unit(self, block, name, args, kwargs)
        expected = self._sizes.get(unit.signature)
        if expected and self._budget:
            # The same call saved this much last time: make room before
            # it runs, so usage stays within the budget.
            with self._lock:
                self._make_room(expected, unit, expected)
        if unit.buffer_versions and (
            id(block) in self._mutating or unit.buffer_bytes() <= _COPIED_BUFFER_BYTES
        ):
            # A recompute starts from the buffers' values before this call.
            with torch.no_grad():
                unit.buffers_before = [(b, b.clone()) for b, _ in unit.buffer_versions]
        tls.unit = unit
        with self._lock:  # released (decremented) from autograd's threads too
            self._open += 1
        unit.hooks.__enter__()
        unit.started_ns = perf_ns()

    def _post(self, block: torch.nn.Module, args: Any, output: Any) -> None:
        tls = self._tls
        capturing = getattr(tls, "capturing", None)
        if capturing is not None:
            recompute = tls.recompute
            if recompute is not None and recompute[0].block is block:
                tls.capturing = None
                capturing.__exit__(None, None, None)
            return
        unit: Unit | None = getattr(tls, "unit", None)
        if unit is None or unit.block is not block:
            return
        tls.unit = None
        unit.hooks.__exit__(None, None, None)
        cost = perf_ns() - unit.started_ns
        if output is None:  # the forward raised: nothing of it will be backpropagated
            self._forget(unit)
            return
        unit.finished(output)
        self._register(unit, cost, pinned=unit.mutated_inputs())
        self._forward_calls += 1
        share = self.device_share
        if share is not None and self._budget:
            if self._forward_calls == self._calls_per_forward:
                self._start_tail(at_last_block=True)  # the forward's last block, as last time
            else:
                share.block_returned()

    # ------------------------------------------------------------ engine

    def _engine_now(self) -> Engine:
        if self._engine is None:
            config: dict[str, Any] = {"defaults": "region", "budget": self._budget, "heuristic": self._heuristic}
            self._engine = Engine(config)
            index = self._device_index
            if self.device_share is not None and index is not None and self._reclaims_for is None:
                if installed() is not None:  # allocation failures on the device ask these blocks to drop too
                    reclaim_registry.register(self, index)
                    self._reclaims_for = index
        return self._engine

    def _register(self, unit: Unit, cost_ns: int, pinned: bool) -> None:
        """Tell the engine of a finished unit and run the budget loop."""
        if unit.mutated_buffers() and unit.buffers_before is None:
            # A recompute must start from the buffers' values before this call,
            # which were not copied (the block was not known to change them):
            # this call stays resident; the block's later calls copy them first.
            self._mutating.add(id(unit.block))
            pinned = True
        with self._lock:
            self._calls += 1
            if not unit.saved:
                self._forget(unit)  # nothing saved: no slot will release it
                return
            if unit.nbytes == 0 or unit.live == 0:
                return  # nothing to evict; released with its last slot
            engine = self._engine_now()
            if pinned:
                unit.tensor_id = engine.tensor(unit.nbytes, pinned=True)
            else:
                unit.op_id, (unit.tensor_id,) = engine.call(b"block", [], [unit.nbytes], [-1], cost_ns)
            self._units[unit.tensor_id] = unit
            self._largest = max(self._largest, unit.nbytes)
            self._sizes[unit.signature] = unit.nbytes
            self._make_room(0, unit, unit.nbytes)

    def _drop(self, victims: Iterable[tuple[int, int]]) -> None:
        """Drop the units the engine named (``(tensor id, action)`` pairs, from
        :meth:`Engine.evict` or :meth:`Engine.reclaim`)."""
        for root, action in victims:
            victim = self._units.get(root)
            if victim is None:
                continue  # released since
            if action != ACTION_DROP:
                raise MemscaleError(f"memscale.blocks: the engine asked for action {action}; only drops are used")
            victim.drop()

    def _make_room(self, extra: int, unit: Unit | None, need: int) -> None:
        """The budget loop: drop the units the engine names until usage +
        ``extra`` fits (``extra``: the bytes ``unit`` is about to make);
        ``need``: the bytes of ``unit``'s activations (for the message).
        ``unit`` None: room for the tail after the model's forward, as much
        as the budget allows (what it cannot hold is not the blocks' to fix)."""
        engine = self._engine_now()
        outside = 0
        share = self.device_share
        if share is not None:
            # The blocks get what the threshold leaves beside everything else
            # on the device (parameters, gradients, optimizer state, the rest
            # of the step): measured now, so the engine's budget follows it.
            budget, outside = share.engine_budget(self._budget, int(engine.status.usage), need)
            engine.set_budget(budget)
        if unit is None:
            extra = min(extra, int(engine.status.budget))
        try:
            self._drop(engine.evict(extra))
        except MemscaleError as exc:
            if unit is None:  # pinned units stay: the tail goes over the budget
                log.debug("memscale.blocks: room for the tail after the forward: %s", exc)
                return
            budget = int(engine.status.budget)
            if isinstance(exc, NoRoomError) or need > budget:
                where = (
                    f"threshold {format_bytes(self._budget)} less {format_bytes(outside)} allocated outside the "
                    f"blocks leaves {format_bytes(budget)}, which"
                    if share is not None
                    else f"budget {format_bytes(budget)}"
                )
                raise MemscaleError(
                    f"memscale.blocks: {where} cannot hold the activations of "
                    f"{unit.name} ({format_bytes(need)}) next to those that must stay (blocks that changed "
                    f"their inputs in place, or their buffers the first time); the least budget that can work is "
                    f"one block's activations - every block recomputed, as activation checkpointing - so raise it "
                    f"to at least {format_bytes(need + outside)}. The engine said: {exc}"
                ) from exc
            raise

    def rebuild(self, unit: Unit) -> None:
        """Make an evicted unit's activations resident again (a slot was unpacked)."""
        with self._lock:
            if unit.resident:
                return
            self._flush()  # the units whose backward is over free their share first
            engine = self._engine_now()
            plan = engine.plan(unit.tensor_id)
            if [kind for kind, _ in plan] != [STEP_RERUN] or plan[0][1] != unit.op_id:
                raise MemscaleError(f"memscale.blocks: unexpected plan {plan} for {unit.name} (op {unit.op_id})")
            self._make_room(unit.nbytes, unit, unit.nbytes)
            t0 = perf_ns()
            unit.recompute()
            engine.rematerialized(unit.op_id, perf_ns() - t0)

    def recomputing(self, unit: Unit | None, hooks: Any) -> None:
        """:meth:`Unit.recompute` starts (``unit``, its capture hooks) or ends (``None``)."""
        tls = self._tls
        if unit is None:
            capturing = getattr(tls, "capturing", None)
            if capturing is not None:  # the block raised before its forward hook
                tls.capturing = None
                capturing.__exit__(None, None, None)
            tls.recompute = None
            return
        tls.recompute = (unit, hooks)

    # ------------------------------------------------------------ releases

    def unit_done(self, unit: Unit) -> None:
        """Autograd dropped the unit's last slot (any thread, any time: only queue)."""
        self._done.append(unit)
        share = self.device_share
        if share is not None and len(self._done) >= self._open:
            share.backward_done()  # every unit of the step is done: its backward is over

    def _forget(self, unit: Unit) -> None:
        """A unit that will never be registered: released now if no slot will release it."""
        with self._lock:
            if unit.live == 0:
                self._release(unit)
                if self._open == 0:
                    self._end_step()

    def _release(self, unit: Unit) -> None:
        """``unit`` is over (once): no longer open, and told to the engine if registered."""
        if unit.released:
            return
        unit.released = True
        self._open -= 1
        if unit.tensor_id >= 0 and self._engine is not None:
            self._units.pop(unit.tensor_id, None)
            self._engine.release(unit.tensor_id)

    def _flush(self) -> None:
        """Tell the engine of the units autograd released; end the step when none is left."""
        if not self._done:
            return
        with self._lock:
            while self._done:
                done, self._done = self._done, []
                for unit in done:
                    self._release(unit)
            if self._open == 0:
                self._end_step()

    def _end_step(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        if self.device_share is not None:
            self.device_share.step_ended(self._budget)
        stats = engine.stats()
        engine.close()
        step_boundary(self._granules.device)  # the step's allocator plans (a GPU with the memscale allocator)
        for key in _COUNTERS:
            self._totals[key] += int(stats[key])
        peak = int(stats["peak_usage"])
        if self._budget:
            self._peak = max(self._peak, peak)
            self._last_peak = peak
        self._steps += 1
        self._units.clear()
        if self._percent is not None and self._budget == 0:
            self._first_peak = peak
            self._budget = max(1, parse_size(self._percent, name="memscale.blocks(budget)", total=peak)) if peak else 0
