"""The Dynamic Tensor Rematerialization region: ``with memscale.dtr(budget=...): ...``.

Design
------
Inside a region every ATen op goes through a ``TorchDispatchMode``. Its outputs
are returned as wrapper tensors that hold no storage of their own, only a *cell*:
the engine's tensor id and the real tensor, or ``None`` once the engine evicted
it. An evicted tensor can therefore never be read by accident: the next op that
needs it asks the engine for a plan and rebuilds it first.

Python makes no eviction decision. The Go engine (``memscale_dtr_*``, bound once
in :mod:`memscale._native.engine`) chooses victims, counts usage, makes room for what an
op is about to allocate, plans rebuilds, applies the region's defaults (the
minimum evictee size, the tuning policy) and tunes itself; Python reports ops and
references and carries out drops, swaps and re-runs. What Python keeps is only
what the engine cannot: the real tensors, how to re-run an op, and which
wrappers are alive.

The life of an op, in the order it meets the modules below: the session syncs
with the engine; the op's facts come from its schema; its arguments become cells
(plain tensors become pinned *externals*); evicted inputs are rebuilt and every
input is locked; under a budget the engine makes room for the predicted output
bytes; the op runs, is registered and recorded, and its outputs are wrapped. A
wrapper that dies is released to the engine at the next op. The engine hears
of an op once: its registration carries the releases queued since the last
call and hands back the storages the engine freed (``memscale_dtr_op``, one
ctypes crossing); an op that fits the budget makes no other call. At exit, what
escapes the region is made resident (the engine lets usage exceed the budget if
it must: ``memscale_dtr_finish``) and detached: outside a region a wrapper
behaves as its plain tensor, and ``.grad`` of every parameter seen is a plain
tensor again, so the optimizer step works on ordinary tensors. *Escaping
tensors* are handed back: after a successful exit every escaping wrapper
that does not require grad is turned into a plain ``torch.Tensor`` in place
(``torch.utils.swap_tensors`` with an alias of its data: same object, same
storage and geometry; views are handed back before their bases), so what a
program keeps from a step (an accuracy in a meter, predictions) is an
ordinary tensor. One that requires grad (its autograd history lives on the
wrapper), or that anything else still references (an autograd graph that
saved it), stays a wrapper; a wrapper formats, prints, converts
(``.numpy()``, ``.item()``, ``.tolist()``), compares and pickles as its plain
tensor. After a failed exit nothing is handed back.

Named notes the modules cite: *views* share their base's storage and are
evicted, swapped and rebuilt with it; *in-place ops* create new versions and
the old version stays recomputable; *side effects* never run twice: an op
that updates state in place as a side effect is rebuilt without repeating
the update - arguments its schema marks written (``(a!)``) and those PyTorch
writes without declaring them (``native_batch_norm``'s running statistics
while training, :data:`.schema.UNDECLARED_STATE_WRITES`) are mutations: the
written tensors get new versions (a region tensor's old version stays
recomputable; a pinned one is copied on write), a re-run of the op's fresh
results writes into scratch copies, and a re-run of a new version works on a
copy of the old one and writes no other argument (the op_db corpus's
``harsh`` setting, which evicts everything after every op and every re-run,
checks it; ``bench/results/side-effects.md``); *RNG ops* replay the generator state they
ran with (a rebuilt dropout mask is bitwise the original); *gradients* are
pinned once accumulated; *tuning*: a budgeted region with no heuristic given
lets the engine record its first entry and choose the configuration of the
later ones (``memscale_dtr_tune``).

Tensor flags: a wrapper carries its tensor's conjugate and negative bits (so
PyTorch resolves a lazily conjugated view before an op that reads its data,
as it does for plain tensors), and a view's geometry keeps them when it is
re-derived or swapped back. In-place shape ops (``squeeze_``, ``transpose_``,
``t_``, ``as_strided_``...), which PyTorch's own decompositions call on their
intermediates, register a new view and rebase the wrapper's metadata. Tensors
without storage (efficient zero tensors) are constants, never held. A re-run
runs under the grad mode of its first run. An in-place op that overwrites a
pinned tensor (an external: running statistics, an input) whose old value a
recorded op read copies the old data first (copy-on-write, counted in the
budget), so everything computed from it stays rebuildable. Compiled code
(``torch.compile``) runs eagerly inside a region. The stress setting
(``dtr(stress=True)``) and verified rebuilds (:mod:`.verify`) are how
:func:`memscale.check` tests a model.

Cost: per op the region does Python work next to the kernel (about 4x an
empty ``TorchDispatchMode`` on the CPU, see ``bench/results/plugin-bench.md``);
it never waits for the device (op costs come from CUDA events read once they
completed; copies are asynchronous), and what does wait is counted
(``summary()["synchronizations"]``, :mod:`.device`). While an entry is open the
garbage collector's heap is frozen, so its full collections do not walk every
object of the process every few thousand ops.

Known limits: ``resize_`` and ``set_`` on region tensors are refused; sparse
and other non-strided results are refused; a plain tensor taken out with
``DTRRegion.unwrap`` and fed back into the region's ops is a new external; on
CUDA an op's cost is approximate (:mod:`.device`).

Map
---
The modules in layers, bottom to top: a module imports only from the groups
below its own (type-only imports included; ``tests/test_layers.py`` checks
it). A lower module that needs an upper object takes it as an argument typed
by a ``Protocol`` of its own (:class:`.cells.Owner`, :class:`.arguments.CellSource`,
:class:`.state.RegionSettings`, :class:`.steps.SteppedRegion`,
:class:`.counters.Entry`); the session is a stack of classes, one module each
(:class:`.state.SessionState`, :class:`.externals.SessionExternals`,
:class:`.session.Session`), so the modules between them work on the layer
below and never import the session.

==========  ============  =====================================================
layer       module        holds
==========  ============  =====================================================
facts       schema        :class:`OpInfo`: what an ATen overload's schema says (cached)
            cells         cells, storage groups, recorded ops, :class:`HeldCells` (locks)
            volatile      storages freed behind the region's back (FSDP)
            reclaim       allocation failures ask the open sessions to evict
            entry         what an entry changes around the program (compiler
                          stance, frozen collector heap, autograd queue drained
                          on an error)
            counters      a region's counters over its entries, the tuning
                          carried between them
tensors     tensor        :class:`DTRTensor`, :func:`unwrap`, ops on wrappers outside a mode
            device        op timing on CUDA, host bandwidth, swap copies
            arguments     argument collection, templates for re-runs, output-size prediction
re-runs     replay        re-running a recorded op (RNG state, copies, scratch arguments)
            verify        fingerprints checking that every rebuild is bitwise its first run
            steps         optimizer steps inside a region end a training step
session     state         the session's state: engine, tables, budget,
                          evictions, releases (:class:`~.state.SessionState`)
            rebuild       materializing from the engine's plans
            native        the native path's session and mode (``MEMSCALE_NATIVE=1``: the
                          per-op path in C++, ``memscale/_native/csrc``)
            externals     plain tensors as pinned externals, pinned gradients,
                          reads (:class:`~.externals.SessionExternals`)
op path     outputs       registering an op's outputs, their wrappers
            shapes        in-place ops that change a tensor's shape (views, resizes)
            inplace       in-place ops: new versions, aliases, copy-on-write
            dispatch      one op inside a region (the mode's ``__torch_dispatch__``)
            session       :class:`Session`: the op path and the exit
region      mode          the dispatch mode of an entry (suspended ops, failed backwards)
            region        :class:`DTRRegion`, :func:`dtr`
            check         :func:`memscale.check`: a model under the stress setting
==========  ============  =====================================================

The drop-in API (:mod:`memscale._dropin.api`) opens one region per training step; the
trace recorder (:mod:`memscale.trace`) listens to a region's registrations.
"""

from __future__ import annotations

from .region import DEFAULT_HEURISTIC, DTRRegion, dtr
from .tensor import DTRTensor, EvictedTensorError, unwrap

__all__ = ["DEFAULT_HEURISTIC", "DTRRegion", "DTRTensor", "EvictedTensorError", "dtr", "unwrap"]
