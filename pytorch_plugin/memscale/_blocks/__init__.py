"""Block-level DTR: evict and recompute the activations of whole model blocks.

The region (:mod:`memscale._region`) tracks every ATen op, which costs tens of
microseconds of Python per op (bench/results/region-cost.md): more than a GPU
kernel of a mid-sized model takes, so a step under a region runs at the speed
of its bookkeeping. This package tracks a coarser unit: one call of a model
block (a transformer layer), through module hooks and autograd's saved-tensor
hooks, so ops run as plain PyTorch and the cost is a few microseconds per block
call and per saved tensor. The engine (Go) decides which blocks' activations to
evict under the budget; an evicted block is recomputed from its inputs when
backward first needs one of its tensors - activation checkpointing, chosen per
block and per step by the engine instead of fixed in the model.

* :mod:`.unit`: one block call - what it saved, how it is dropped and
  recomputed (random-number, autocast and buffer state replayed; checked;
  stopped at the last tensor the first run saved).
* :mod:`.find`: which modules are the model's repeated blocks (:func:`find_blocks`);
* :mod:`.tracker`: the hooks, the engine, the budget and the counters
  (:class:`BlockDTR`).
* :mod:`.device`: under a budget of the device's allocated bytes, what the
  rest of the program leaves the blocks - the tail after their forward (an
  LM head) made room for, the overshoot kept back as headroom, both learned
  from the allocator's watermark (:class:`~.device.DeviceShare`).
* :mod:`.drop_in`: ``memscale.wrap(model, Config(unit="block"))`` - the
  Config's budget converted, the drop-in API's summary.
"""

from __future__ import annotations

from .find import find_blocks
from .tracker import BlockDTR

__all__ = ["BlockDTR", "find_blocks"]
