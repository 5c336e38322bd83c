"""Steps that fit the budget run untracked: plain PyTorch, no region.

A region costs Python work on every op (``bench/results/plugin-bench.md``), and
a step that never comes near the budget pays it for nothing. So the drop-in
API (:func:`memscale.wrap`, :func:`memscale.enable`, ``python -m memscale run``,
the Hugging Face Trainer) runs a step *untracked* when the same step has
already fitted: its *signature* (the module, the grad mode, and the shapes,
dtypes and devices of its tensor arguments, with its plain-number arguments)
ran :data:`CONFIRMATIONS` tracked steps in a row that finished within the
budget with no eviction, swap or error (on a GPU also at least
:data:`DEVICE_HEADROOM` of its memory below the card's size: an untracked step
cannot evict when an allocation would fail). An untracked step is the program run
by PyTorch alone, so its values are bitwise those of a plain run; a step with
new shapes (another sequence length, the last short batch) is tracked again.

A step may run several forwards of its module (gradient accumulation): the
tracked steps that fitted record the signatures of all of them, and an
untracked step whose later forward is not the one they had (a short last
micro-batch, an extra forward) enters its region there and is tracked from
that forward on (tensors made before it are plain, as any tensor from outside
a region); its shapes need two fitting steps again.

What can make an untracked step differ from the tracked ones of its signature
is memory the shapes do not determine: ops whose output sizes depend on the
data (``nonzero``, routing), or tensors the program keeps from step to step.
On a GPU with the memscale allocator the untracked step's peak is measured
(the allocator's watermark, through an engine that only reads it): a step
that went over the budget is logged, counted (``untracked_over_budget``), and
its signature is tracked from then on. On the CPU, where usage is what the
engine registers, an untracked step is not measured.

``Config(untracked_steps=False)`` or ``MEMSCALE_UNTRACKED_STEPS=0`` tracks
every step. Unbudgeted steps (a baseline, warmup steps) and steps whose
arguments are not known (an optimizer closure, Lightning) are always tracked.

Holds no policy about tensors: which tensor to evict is the engine's; this
module only decides whether a step needs the engine at all.
"""

from __future__ import annotations

import enum
import logging
import os
import weakref
from collections.abc import Hashable, Mapping
from typing import Any, Final

import torch

from ..config import format_bytes
from ..errors import ConfigError

log = logging.getLogger("memscale")

#: Consecutive tracked steps of one signature that must fit before its steps
#: run untracked: the second sees what the first step's optimizer update
#: allocated (its state), which the first could not.
CONFIRMATIONS: Final[int] = 2

#: The share of a GPU's memory a step must leave free to run untracked: an
#: untracked step cannot evict, so one near the card's size (no threshold
#: set, or a threshold near 100 %) keeps a margin for what shapes do not
#: determine (allocator rounding, data-dependent sizes).
DEVICE_HEADROOM: Final[float] = 0.05

#: The environment variable that turns untracked steps off (``0``) or on (``1``).
UNTRACKED_ENV: Final[str] = "MEMSCALE_UNTRACKED_STEPS"

#: Argument types that are part of a signature by value.
_BY_VALUE: Final[tuple[type, ...]] = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, enum.Enum)

#: How deep a signature follows nested containers (deeper: opaque).
_MAX_DEPTH: Final[int] = 8


def untracked_steps_enabled(setting: bool | None) -> bool:
    """Whether fitting steps may run untracked: ``setting`` when given, else
    :data:`UNTRACKED_ENV` (default on).

    Raises:
        ConfigError: the environment variable is not ``0`` or ``1``.
    """
    if setting is not None:
        return setting
    raw = os.environ.get(UNTRACKED_ENV, "").strip()
    if raw in ("", "1"):
        return True
    if raw == "0":
        return False
    raise ConfigError(f"{UNTRACKED_ENV}={raw!r}: expected 1 (fitting steps run untracked, the default) or 0")


class _Opaque(Exception):
    """An argument whose tensors, if any, cannot be seen."""


def _part(x: Any, depth: int) -> Hashable:
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype, x.device, x.layout, x.requires_grad)
    if isinstance(x, _BY_VALUE):
        return (type(x), x)
    if depth < _MAX_DEPTH:
        if isinstance(x, Mapping):  # dicts, Hugging Face's BatchEncoding and ModelOutput
            return (type(x), tuple((k, _part(v, depth + 1)) for k, v in x.items()))
        if isinstance(x, (list, tuple)):
            return (type(x), tuple(_part(v, depth + 1) for v in x))
    raise _Opaque


def signature(module: Any, args: Any) -> Hashable | None:
    """What determines a step's memory as far as its start can tell: the module
    it starts at, the grad mode, and every argument - tensors by shape, dtype,
    device, layout and ``requires_grad``; numbers, strings, dtypes, devices and
    enums by value; mappings, lists and tuples by their items. ``None`` when an
    argument is anything else (an object that may hold tensors unseen): such a
    step is always tracked."""
    try:
        sig = (id(module), torch.is_grad_enabled(), _part(args, 0))
        hash(sig)
    except (_Opaque, TypeError):  # TypeError: something unhashable inside
        return None
    return sig


class FitRecord:
    """Which step signatures fit the budget, and the count of untracked steps.

    Args:
        enabled: whether any step may run untracked.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._fits: dict[Hashable, int] = {}  # signature -> tracked fits in a row
        self._forwards: dict[Hashable, tuple[Hashable, ...]] = {}  # signature -> its fits' forwards
        self._watched: set[int] = set()  # ids of the modules whose death forgets their signatures
        self._refused: set[Hashable] = set()  # went over the budget untracked
        #: Steps run untracked so far.
        self.untracked = 0
        #: Untracked steps whose measured peak went over the budget.
        self.over_budget = 0
        #: Untracked steps that met a forward their fits did not have and
        #: were tracked from there on.
        self.promoted = 0

    def watch(self, module: Any) -> None:
        """Forget the signatures of ``module`` (keyed by its id) when it dies:
        a module made later at the same address is another model."""
        key = id(module)
        if key in self._watched:
            return
        self._watched.add(key)
        weakref.finalize(module, self._forget, key).atexit = False

    def _forget(self, key: int) -> None:
        self._watched.discard(key)
        for table in (self._fits, self._forwards):
            for sig in [s for s in table if s[0] == key]:  # type: ignore[index]
                del table[sig]
        self._refused = {s for s in self._refused if s[0] != key}  # type: ignore[index]

    def runs_untracked(self, sig: Hashable | None) -> bool:
        """Whether a step of signature ``sig`` (``None``: unknown) runs untracked."""
        return (
            self.enabled
            and sig is not None
            and sig not in self._refused
            and self._fits.get(sig, 0) >= CONFIRMATIONS
        )

    def follows(self, sig: Hashable, forwards: list[Hashable]) -> bool:
        """Whether ``forwards`` (the signatures of an untracked step's forwards
        so far, its first being ``sig``) are how the fits of ``sig`` began."""
        expected = self._forwards.get(sig, ())
        return None not in forwards and tuple(forwards) == expected[: len(forwards)]

    def promote(self, sig: Hashable) -> None:
        """An untracked step of ``sig`` met a forward its fits did not have: it
        is tracked from there, and ``sig`` needs :data:`CONFIRMATIONS` fits again."""
        self.promoted += 1
        self._fits[sig] = 0

    def tracked(
        self,
        sig: Hashable | None,
        last: dict[str, Any],
        ok: bool,
        forwards: list[Hashable] | None = None,
        device_bytes: int | None = None,
        unbounded: bool = False,
    ) -> None:
        """A tracked step of ``sig`` ended; ``last`` is its region's
        :meth:`~memscale.DTRRegion.last_summary`, ``ok`` whether it ended
        without an error, ``forwards`` the signatures of its forwards (``[sig]``
        when not given), ``device_bytes`` the memory of the GPU it ran on
        (``None``: the CPU), ``unbounded`` whether the step had no budget to
        fit on purpose (no threshold: the steps are measured, and any step fits)."""
        if sig is None:
            return
        seen = tuple(forwards) if forwards else (sig,)
        budget = int(last.get("budget", 0) or 0)
        if device_bytes:
            budget = min(budget, int(device_bytes * (1 - DEVICE_HEADROOM)))
        fitted = (
            ok
            and None not in seen  # a forward whose arguments could not be seen
            and (unbounded or (budget > 0 and int(last.get("peak_usage", 0)) <= budget))
            and not any(int(last.get(key, 0) or 0) for key in ("evictions", "swaps_out", "rematerializations"))
        )
        if not fitted:
            self._fits[sig] = 0
        elif self._forwards.get(sig) != seen:
            self._fits[sig] = 1  # a run of fits has the same forwards
        else:
            self._fits[sig] = self._fits.get(sig, 0) + 1
        self._forwards[sig] = seen

    def ran_untracked(self, sig: Hashable, peak: int | None, budget: int, ok: bool = True) -> None:
        """An untracked step of ``sig`` ended with measured ``peak`` bytes
        (``None``: not measured); ``ok``: without an error (a step that raised,
        an out-of-memory error among others, is followed by tracked ones
        until its shapes fit twice again)."""
        self.untracked += 1
        if not ok:
            self._fits[sig] = 0
        if peak is not None and budget > 0 and peak > budget:
            self.over_budget += 1
            self._refused.add(sig)
            log.warning(
                "memscale: an untracked step (its shapes had fitted the budget twice) peaked at %s, over the "
                "budget of %s; steps of its shapes are tracked from now on (MEMSCALE_UNTRACKED_STEPS=0 tracks "
                "every step)",
                format_bytes(peak),
                format_bytes(budget),
            )
