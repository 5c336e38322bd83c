"""What a region's entry changes in the process around the program's code,
and undoes.

* **Compiled code runs eagerly** (:func:`compiled_code_runs_eagerly`) while
  an entry is open, so the region sees, and records, every ATen op.
* **The collector's heap is frozen** (:func:`freeze_heap`, :func:`thaw_heap`)
  while an entry is open: its full collections cost more per op than the
  region's own work.
* **The autograd queue is drained** (:func:`drain_autograd_queue`) when an
  entry is left by an exception, so a failed backward's tasks do not outlive
  the step (or crash the interpreter at exit).

Holds the count of open entries that froze the heap (process-wide, like the
collector); decides nothing about tensors.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes


def compiled_code_runs_eagerly() -> Any:
    """Make ``torch.compile``d code run eagerly until the returned context
    manager exits (``None`` where torch has no compiler stances).

    A region must see every ATen op to record it: a compiled graph runs its
    kernels without dispatching them one by one, and Dynamo would otherwise
    try to trace the region's own Python. Inside a region, compiled modules
    and functions therefore run as the eager code they were compiled from
    (``torch.compiler.set_stance("force_eager")``); outside it, they run
    compiled as before.
    """
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:
        return None
    return set_stance("force_eager")  # takes effect now; __exit__ restores


#: Entries open now whose freeze of the garbage collector's heap this module
#: owns (see :func:`freeze_heap`).
_frozen_entries = 0


def freeze_heap() -> bool:
    """Keep the objects that exist before an entry out of the garbage
    collector's full collections until it exits; returns whether this entry
    froze them (undone by :func:`thaw_heap`).

    A region keeps several objects per op alive (cells, recorded ops), so the
    collector's full collections, each a walk over every object of the
    process (some 330,000 with torch imported), come every few thousand ops;
    they cost more than anything else the region does per op (7-15 us per
    op measured on the 2-core machine, about 1-3 us with the heap frozen).
    Frozen objects are not collected meanwhile: a reference cycle made
    unreachable during the entry among objects older than it is collected
    after the exit. Nothing is frozen when the program froze objects itself
    (``gc.freeze``, before forking workers): that freeze is its own.
    """
    global _frozen_entries
    if _frozen_entries:
        _frozen_entries += 1
        return True
    if not gc.isenabled() or gc.get_freeze_count():
        return False
    gc.freeze()
    _frozen_entries = 1
    return True


def thaw_heap() -> None:
    """Undo one :func:`freeze_heap` that returned True."""
    global _frozen_entries
    _frozen_entries -= 1
    if _frozen_entries == 0:
        gc.unfreeze()


def drain_autograd_queue() -> None:
    """Free what a failed backward left in this thread's autograd queue.

    When an error escapes a backward that ran nested inside another (a
    reentrant ``torch.utils.checkpoint``, as Hugging Face's gradient
    checkpointing uses), PyTorch leaves the failed graph's pending tasks in
    the thread's ready queue, holding graph nodes and their saved tensors
    until the next backward on this thread pops and discards them, or until
    the thread's storage is destroyed at process exit, after Python is
    finalized: a node whose saved tensors had Python hooks then takes the
    GIL that no longer exists and the process dies of SIGSEGV instead of
    exiting with the error. A one-element backward pops them now (tasks of a
    finished graph are dropped unrun), so their memory comes back and the
    exit is clean. Called when a region is left by an exception.
    """
    leaf = torch.ones(1, requires_grad=True)
    try:
        with _disable_current_modes():
            (leaf * 2).sum().backward()
    except RuntimeError:  # pragma: no cover - best effort, on an error path
        logging.getLogger("memscale").debug("draining the autograd queue failed", exc_info=True)
