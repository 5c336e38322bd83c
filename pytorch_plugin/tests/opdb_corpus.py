"""PyTorch's OpInfo corpus through a DTR region: the logic shared by
``test_opdb.py`` and ``bench/opdb_report.py``.

For every OpInfo in ``op_db`` (the ops ``torch.testing._internal`` tests
itself with; it already holds ``opinfo.definitions.op_db``) and, on request,
``foreach_op_db``: the first :data:`SAMPLES` samples of
``op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd)``
(:class:`Setting` changes the dtype, the number of samples, runs the in-place
variant, or makes the op's arguments region tensors). Each sample runs

1. plainly, twice: the forward and, when the op supports autograd and has
   floating (or complex) outputs that require grad, ``torch.autograd.grad`` of
   ``sum((out * cotangent).sum())`` (cotangents: fixed, seeded) with respect to
   every input that requires grad; the two runs must agree bitwise, else the
   op is nondeterministic and skipped;
2. inside a fresh region, forward and backward both, on the same inputs as
   plain tensors (the region registers them as externals); outputs, gradients
   and the inputs afterwards (in-place ops) are unwrapped after the region
   exited and compared with the plain run bitwise
   (``assert_close(rtol=0, atol=0, equal_nan=True)``). The ops of
   :data:`EXCEPTIONS` take another path in PyTorch itself whenever a
   ``TorchDispatchMode`` is active (``isTensorSubclassLike`` is true for every
   tensor then): their reference is the plain run under a do-nothing dispatch
   mode, still compared bitwise (how far that path lands from the plain run
   is recorded);
3. in a stress region, also in a region that evicts nothing: the two must
   agree bitwise (what a region computes must not depend on what it evicted;
   a re-run must take the path its first run took).

The global RNG (torch, ``random``, numpy) is seeded identically before the
samples are built and before every run, so random ops must replay bitwise.

The region is chosen by :func:`region_mode`: ``stress`` (``dtr(stress=True)``:
every evictable tensor evicted as soon as no running op needs it, so every
recomputation path runs) when ``memscale.dtr`` accepts it, else ``unbudgeted``
(``dtr(budget=None)``), as ``auto`` does; ``MEMSCALE_OPDB_MODE`` or the
report's ``--mode`` picks one. ``harsh`` is ``stress`` made harsher: after every op and every re-run step
of a rebuild, everything evictable is evicted again (the engine's reclaim),
rebuilt tensors included (``stress`` evicts each storage at most once), so
every recorded op may be re-run many times and a side effect repeated by a
re-run shows. ``emulated-stress`` approximates ``stress``
from the outside for a ``memscale.dtr`` without it: a budget nothing reaches,
the ``lru`` heuristic, no minimum evictee size, and after every op the
engine's reclaim loop asked for everything (every evictable storage dropped).

Outcomes (per sample, then per op: the worst of its samples):

* ``bitwise``: identical to the plain run;
* ``exception``: an op of :data:`EXCEPTIONS` that differs from the plain run
  and is bitwise PyTorch's dispatch-mode path;
* ``skip``: a recorded reason (:data:`SKIP_REASONS`): no CPU support for the
  dtype, no samples, the sample fails plainly, a nondeterministic plain run, a
  non-strided (sparse...) layout refused by the region with a clear
  :class:`memscale.MemscaleError` (anything else the region does with such a
  sample is a failure);
* ``fail``: anything else that differs or raises. An op outside
  :data:`EXCEPTIONS` that equals the plain run under a do-nothing dispatch
  mode says so: either PyTorch's subclass formula (it belongs in the table,
  once checked against a run in higher precision) or a kernel that computes
  wrongly inside any mode's ``__torch_dispatch__`` (the Conjugate, Negative
  and ZeroTensor keys are excluded there: complex ``linalg.pinv`` is).

Importing this module stubs ``expecttest`` (a dependency of PyTorch's test
utilities that only their ``TestCase`` uses) when it is not installed.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import random
import sys
import time
import traceback
import types
import unittest
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import memscale
import torch
from _helpers import deadline
from memscale import MemscaleError, unwrap
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _get_current_dispatch_mode,
    _pop_mode,
)

#: Samples run per op (the first ones ``sample_inputs`` yields).
SAMPLES: Final[int] = 2
#: Seeds: the samples, every run's global RNG, the cotangents.
SAMPLE_SEED: Final[int] = 1234
RUN_SEED: Final[int] = 5678
COTANGENT_SEED: Final[int] = 91011
#: Seconds one op (all its samples, every run) may take before it fails.
OP_DEADLINE: Final[int] = 60

#: Ops whose results inside a region legitimately differ from the plain run's:
#: PyTorch itself computes them another way when an argument is a tensor
#: subclass or a dispatch mode is active (``isTensorSubclassLike`` in
#: ``FunctionsManual.cpp`` and in composite kernels; it is true for every tensor
#: while a ``TorchDispatchMode`` is active, so also for the region's plain
#: externals). Their reference is the plain run under a do-nothing dispatch
#: mode, compared bitwise. Keys are OpInfo ids (``name`` or ``name.variant``).
EXCEPTIONS: Final[dict[str, str]] = {
    "prod": (
        "prod_backward: for a subclass the gradient is computed by prod_safe_zeros_backward "
        "(cumulative products) instead of result / input"
    ),
    "masked_fill": (
        "masked_fill_backward: the gradient of a tensor `value` is at::where(mask, grad, 0).sum() "
        "instead of grad.masked_select(mask).sum() (another summation order)"
    ),
}

#: Reasons a sample or an op is skipped (not a failure).
NO_DTYPE: Final[str] = "no CPU support for the dtype"
NO_VARIANT: Final[str] = "no in-place variant"
NO_SAMPLES: Final[str] = "no samples (or building them fails)"
FAILS_PLAINLY: Final[str] = "the sample fails plainly"
NONDETERMINISTIC: Final[str] = "nondeterministic plain run"
REFUSED_LAYOUT: Final[str] = "non-strided layout refused with a MemscaleError"
SKIP_REASONS: Final[tuple[str, ...]] = (
    NO_DTYPE,
    NO_VARIANT,
    NO_SAMPLES,
    FAILS_PLAINLY,
    NONDETERMINISTIC,
    REFUSED_LAYOUT,
)

MODES: Final[tuple[str, ...]] = ("auto", "stress", "unbudgeted", "emulated-stress", "harsh")
#: Modes whose regions evict: each sample also runs in a region that evicts
#: nothing, and the two regions must agree bitwise.
STRESS_MODES: Final[tuple[str, ...]] = ("stress", "emulated-stress", "harsh")

# ---------------------------------------------------------------- the corpus


def _stub_expecttest() -> None:
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase  # type: ignore[attr-defined]
        stub.ACCEPT = False  # type: ignore[attr-defined]
        sys.modules["expecttest"] = stub


def op_id(op: Any) -> str:
    """The OpInfo's test id: its name, ``.variant`` when it has one."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def corpus(foreach: bool = False) -> list[Any]:
    """The OpInfos run: ``op_db`` (and ``foreach_op_db`` when asked), in order."""
    _stub_expecttest()
    from torch.testing._internal import common_methods_invocations as cmi

    ops = list(cmi.op_db)
    if foreach:
        ops += list(cmi.foreach_op_db)
    return ops


# ------------------------------------------------------------------- regions


def stress_supported() -> bool:
    """Whether ``memscale.dtr`` accepts ``stress=``."""
    return "stress" in inspect.signature(memscale.dtr).parameters


def region_mode(mode: str | None = None) -> str:
    """The concrete mode for ``mode`` (``None`` or ``auto``: ``MEMSCALE_OPDB_MODE``
    when set, else ``auto``'s choice)."""
    if not mode or mode == "auto":
        mode = os.environ.get("MEMSCALE_OPDB_MODE") or "auto"
    if mode not in MODES:
        raise ValueError(f"opdb mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "auto":
        return "stress" if stress_supported() else "unbudgeted"
    if mode == "stress" and not stress_supported():
        raise ValueError("opdb mode 'stress': this memscale.dtr has no stress= keyword")
    return mode


def region_call(mode: str) -> str:
    """How a region of ``mode`` is made, as code (for reports)."""
    return {
        "stress": "memscale.dtr(stress=True)",
        "unbudgeted": "memscale.dtr(budget=None)",
        "emulated-stress": (
            'memscale.dtr(1 << 40, heuristic="lru", evictee_min_size=0), every op followed '
            "by the engine's reclaim of everything evictable (harness emulation of stress=True)"
        ),
        "harsh": (
            "memscale.dtr(stress=True), every op (and every re-run of a rebuild) followed by the "
            "engine's reclaim of everything evictable, rebuilt tensors included"
        ),
    }[mode]


@contextlib.contextmanager
def open_region(mode: str) -> Iterator[Any]:
    """A fresh region of ``mode``, entered."""
    if mode in ("stress", "harsh"):
        region = memscale.dtr(stress=True)  # type: ignore[call-arg]
    elif mode == "unbudgeted":
        region = memscale.dtr(None)
    elif mode == "emulated-stress":
        region = memscale.dtr(1 << 40, heuristic="lru", evictee_min_size=0)
    else:
        raise ValueError(f"opdb mode {mode!r}")
    # These two settings reach into the Python region's internals: they run on it.
    with _python_region(mode in ("emulated-stress", "harsh")), region:
        if mode == "emulated-stress":
            session = region._session
            after_op = session.after_op

            def after_op_then_evict_all() -> None:
                after_op()
                session._carry_out(session.engine.reclaim(1 << 62))

            session.after_op = after_op_then_evict_all
        if mode == "harsh":
            with _evict_everything_after_each_op(region._session):
                yield region
            return
        yield region


@contextlib.contextmanager
def _python_region(wanted: bool) -> Iterator[None]:
    """``MEMSCALE_NATIVE=0`` for the block when ``wanted``."""
    if not wanted:
        yield
        return
    old = os.environ.get("MEMSCALE_NATIVE")
    os.environ["MEMSCALE_NATIVE"] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["MEMSCALE_NATIVE"]
        else:
            os.environ["MEMSCALE_NATIVE"] = old


@contextlib.contextmanager
def _evict_everything_after_each_op(session: Any) -> Iterator[None]:
    """The harsh setting: after every op the region runs, and after every
    re-run step of a rebuild, everything evictable is evicted (stress alone
    evicts a storage at most once, so a rebuilt tensor stays resident; here
    it is evicted again and rebuilt again by the next op that reads it)."""
    from memscale._region import mode as mode_module
    from memscale._region import rebuild as rebuild_module

    def evict_all() -> None:
        if not session.closed:
            session._carry_out(session.engine.reclaim(1 << 62))

    original_dispatch = mode_module.dispatch
    original_run_step = rebuild_module.run_step

    def dispatch_then_evict(s: Any, func: Any, args: Any, kwargs: Any) -> Any:
        out = original_dispatch(s, func, args, kwargs)
        if s is session:
            evict_all()
        return out

    def run_step_then_evict(s: Any, *args: Any, **kwargs: Any) -> Any:
        kept = original_run_step(s, *args, **kwargs)
        if s is session:
            evict_all()
        return kept

    mode_module.dispatch = dispatch_then_evict
    rebuild_module.run_step = run_step_then_evict
    try:
        yield
    finally:
        mode_module.dispatch = original_dispatch
        rebuild_module.run_step = original_run_step


# ------------------------------------------------------------------- results


@dataclass(frozen=True)
class Setting:
    """How the corpus runs. The defaults are the test's."""

    mode: str = "auto"  # see MODES; "auto" resolved by region_mode()
    samples: int = SAMPLES
    dtype: torch.dtype = torch.float32
    #: "leaves": the sample's tensors are the op's arguments (plain tensors:
    #: externals of the region); "intermediates": each is cloned first, inside
    #: the run, so the op's arguments are region tensors (evictable,
    #: rebuilt from the clone).
    inputs: str = "leaves"
    #: "function": ``op(...)``; "inplace": ``op.inplace_variant(...)`` on
    #: intermediates (the inputs are cloned whatever ``inputs`` says).
    variant: str = "function"
    deadline: int = OP_DEADLINE

    def resolved(self) -> Setting:
        return Setting(region_mode(self.mode), self.samples, self.dtype, self.inputs, self.variant, self.deadline)

    def describe(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return f"{self.mode}, {dtype}, {self.variant} variant, inputs as {self.inputs}, {self.samples} samples per op"


@dataclass
class Run:
    """What one run of a sample left: outputs, gradients, inputs afterwards."""

    outputs: list[Any]
    grads: list[Any] | None
    inputs: list[Any]
    layouts: set[Any]


@dataclass
class SampleOutcome:
    index: int
    status: str  # bitwise | exception | skip | fail
    reason: str = ""  # a SKIP_REASONS entry, or the failure's first line
    detail: str = ""  # traceback or mismatch
    backward: bool = False


@dataclass
class OpOutcome:
    op: str
    status: str  # bitwise | exception | skip | fail
    reason: str = ""
    samples: list[SampleOutcome] = field(default_factory=list)
    seconds: float = 0.0

    def failures(self) -> list[SampleOutcome]:
        return [s for s in self.samples if s.status == "fail"]


_RANK = {"bitwise": 0, "exception": 1, "skip": -1, "fail": 2}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass


def _leaves(x: Any, out: list[Any]) -> list[Any]:
    """Tensors and other values of a (nested) result, in order."""
    if isinstance(x, (list, tuple)):
        for y in x:
            _leaves(y, out)
    elif isinstance(x, dict):
        for key in sorted(x, key=str):
            _leaves(x[key], out)
    else:
        out.append(x)
    return out


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in _leaves(x, []) if isinstance(t, torch.Tensor)]


def _differentiable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())


def _cloned(x: Any) -> Any:
    """``x`` with every strided tensor cloned (same structure)."""
    if isinstance(x, torch.Tensor):
        return x.clone() if x.layout == torch.strided else x
    if type(x) in (list, tuple):
        return type(x)(_cloned(y) for y in x)
    if type(x) is dict:
        return {k: _cloned(v) for k, v in x.items()}
    return x


# -------------------------------------------------------------------- a run


def _backward(op: Any, dtype: torch.dtype) -> bool:
    return bool(op.supports_autograd) and dtype in op.supported_backward_dtypes("cpu")


def _samples(op: Any, setting: Setting) -> list[Any]:
    """The first samples of ``op``, each built after seeding the RNG.

    What ``op.sample_inputs`` yields, without its ``TrackedInputIter``: that
    wrapper looks for the running unittest test through ``inspect.stack()``
    (up to 0.3 s per op under pytest's deep stacks) and reseeds from it."""
    samples = iter(op.sample_inputs_func(op, "cpu", setting.dtype, _backward(op, setting.dtype)))
    out = []
    for _ in range(setting.samples):
        _seed(SAMPLE_SEED)
        try:
            out.append(next(samples))
        except StopIteration:
            break
    return out


def _execute(
    op: Any, sample: Any, setting: Setting, backward: bool, cotangents: list[torch.Tensor] | None
) -> tuple[Run, list[Any]]:
    """One run of ``sample``: returns the run and the cotangents used (made
    here, seeded, when ``cotangents`` is None)."""
    inputs = _tensors(((sample.input, *sample.args), sample.kwargs))
    layouts = {t.layout for t in inputs}
    _seed(RUN_SEED)
    first, args, kwargs = sample.input, sample.args, sample.kwargs
    if setting.inputs == "intermediates" or setting.variant == "inplace":
        first, args, kwargs = _cloned(first), _cloned(args), _cloned(kwargs)
    fn = op.inplace_variant if setting.variant == "inplace" else op
    out = fn(first, *args, **kwargs)
    grads = None
    used: list[Any] = []
    if backward:
        wrt: list[torch.Tensor] = []
        for t in inputs:
            if t.requires_grad and all(t is not u for u in wrt):
                wrt.append(t)
        diff = [t for t in _tensors(sample.output_process_fn_grad(out)) if _differentiable(t)]
        if wrt and diff:
            if cotangents is None:
                g = torch.Generator().manual_seed(COTANGENT_SEED)
                cotangents = [torch.randn(tuple(t.shape), dtype=t.dtype, generator=g) for t in diff]
            if len(cotangents) != len(diff):
                raise AssertionError(f"{len(diff)} differentiable outputs, the plain run had {len(cotangents)}")
            used = cotangents
            loss = None
            for t, ct in zip(diff, cotangents):
                term = (t * ct).sum()
                if term.is_complex():
                    term = torch.real(term)
                loss = term if loss is None else loss + term
            grads = list(torch.autograd.grad(loss, wrt, allow_unused=True))
    outputs = _leaves(out, [])
    for t in _tensors(outputs) + _tensors(grads or []):
        layouts.add(t.layout)
    # A snapshot of the inputs afterwards (in-place ops on them).
    after = [t.detach().clone() if t.layout == torch.strided else t for t in inputs]
    return Run(outputs, grads, after, layouts), used


def _compare(ref: Run, got: Run, tolerance: bool = False) -> None:
    """Raise AssertionError naming the first difference between two runs
    (bitwise, or within float32's default tolerance)."""
    kw: dict[str, Any] = {"equal_nan": True}
    if not tolerance:
        kw.update(rtol=0, atol=0)
    for what, a_list, b_list in (
        ("output", ref.outputs, got.outputs),
        ("gradient", ref.grads, got.grads),
        ("input after the run", ref.inputs, got.inputs),
    ):
        if (a_list is None) != (b_list is None):
            raise AssertionError(f"{what}s: one run has them, the other not")
        if a_list is None:
            continue
        if len(a_list) != len(b_list):
            raise AssertionError(f"{len(b_list)} {what}s, expected {len(a_list)}")
        for k, (a, b) in enumerate(zip(a_list, b_list)):
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
                    raise AssertionError(f"{what} {k}: {type(b).__name__}, expected {type(a).__name__}")
                try:
                    torch.testing.assert_close(unwrap(b), unwrap(a), **kw)
                except AssertionError as exc:
                    raise AssertionError(f"{what} {k}: {exc}") from None
            elif a != b and not (a != a and b != b):  # NaN == NaN here
                raise AssertionError(f"{what} {k}: {b!r}, expected {a!r}")


def _clean_modes() -> bool:
    """Pop dispatch modes a failed region left behind; whether there were any."""
    left = False
    while _get_current_dispatch_mode() is not None:
        left = True
        _pop_mode()
    return left


def run_samples(op: Any, setting: Setting) -> list[SampleOutcome]:
    """Run the first samples of ``op`` plainly twice and in a region.

    Every run gets samples built afresh from the same seed (an in-place op
    cannot leak one run's mutation into the next)."""
    try:
        n_samples = len(_samples(op, setting))
    except Exception:
        return []
    backward = _backward(op, setting.dtype)
    return [_run_one(op, i, setting, backward) for i in range(n_samples)]


def _run_one(op: Any, i: int, setting: Setting, backward: bool) -> SampleOutcome:
    def fresh() -> Any:
        return _samples(op, setting)[i]

    # 1. plainly (without the backward when only the backward fails)
    try:
        ref, cts = _execute(op, fresh(), setting, backward, None)
    except Exception as exc:
        if not backward:
            return SampleOutcome(i, "skip", FAILS_PLAINLY, _first_line(exc))
        backward = False
        try:
            ref, cts = _execute(op, fresh(), setting, False, None)
        except Exception as exc2:
            return SampleOutcome(i, "skip", FAILS_PLAINLY, _first_line(exc2))
    backward = backward and ref.grads is not None
    # 2. plainly again: deterministic?
    try:
        again, _ = _execute(op, fresh(), setting, backward, [c.clone() for c in cts])
        _compare(ref, again, tolerance=False)
    except Exception as exc:
        return SampleOutcome(i, "skip", NONDETERMINISTIC, _first_line(exc), backward)
    # 3. in a region: the sample's tensors and the cotangents enter it as
    # plain tensors
    sample = fresh()
    cts_in = [c.clone() for c in cts]
    non_strided = sorted(str(layout) for layout in ref.layouts if layout != torch.strided)
    try:
        with open_region(setting.mode):
            got, _ = _execute(op, sample, setting, backward, cts_in)
    except Exception as exc:
        left = _clean_modes()
        reason = _first_line(exc)
        if left:
            reason = f"a region left its dispatch mode behind ({reason})"
        elif non_strided:
            # The region must refuse these with a MemscaleError naming the layout.
            if isinstance(exc, MemscaleError) and any(name in str(exc) for name in non_strided):
                return SampleOutcome(i, "skip", REFUSED_LAYOUT, reason, backward)
            reason = f"a {'/'.join(non_strided)} sample: expected a MemscaleError naming the layout, got {reason}"
        return SampleOutcome(i, "fail", reason, traceback.format_exc(), backward)
    if _clean_modes():
        return SampleOutcome(i, "fail", "a region left its dispatch mode behind", "", backward)
    outcome = _judge(op, i, setting, backward, ref, got, lambda: _execute_moded(op, fresh(), setting, backward, cts))
    if outcome.status == "fail" or setting.mode not in STRESS_MODES:
        return outcome
    # 4. what a region computes must not depend on what it evicted: the same
    # sample in a region that evicts nothing
    try:
        sample, cts_in = fresh(), [c.clone() for c in cts]
        with open_region("unbudgeted"):
            calm, _ = _execute(op, sample, setting, backward, cts_in)
        _clean_modes()
        _compare(calm, got)
    except AssertionError as exc:
        reason = (
            "results depend on evictions: a region that evicts nothing computes " + _first_line(exc).split(": ", 1)[1]
        )
        return SampleOutcome(i, "fail", reason, str(exc), backward)
    except Exception as exc:
        _clean_modes()
        return SampleOutcome(
            i, "fail", f"in a region that evicts nothing: {_first_line(exc)}", traceback.format_exc(), backward
        )
    return outcome


def _execute_moded(op: Any, sample: Any, setting: Setting, backward: bool, cts: list[Any]) -> Run:
    """The plain run under a do-nothing dispatch mode (PyTorch's subclass paths)."""
    with _PassThrough():
        moded, _ = _execute(op, sample, setting, backward, [c.clone() for c in cts])
    return moded


def _judge(
    op: Any, i: int, setting: Setting, backward: bool, ref: Run, got: Run, moded: Callable[[], Run]
) -> SampleOutcome:
    """The region's run against the plain one (and PyTorch's dispatch-mode path)."""
    try:
        _compare(ref, got, tolerance=False)
        return SampleOutcome(i, "bitwise", backward=backward)
    except AssertionError as exc:
        bitwise_error = exc
    except Exception as exc:  # reading a result failed
        return SampleOutcome(i, "fail", _first_line(exc), traceback.format_exc(), backward)
    # PyTorch's own path under a dispatch mode: the reference of EXCEPTIONS.
    try:
        _compare(moded(), got)
    except Exception:
        first = _first_line(bitwise_error).split(": ", 1)[1]
        return SampleOutcome(i, "fail", f"differs: {first}", str(bitwise_error), backward)
    try:
        _compare(ref, got, tolerance=True)
        distance = "within float32's default tolerance of the plain run"
    except AssertionError as exc:
        distance = f"beyond float32's default tolerance of the plain run: {exc}"
    if op_id(op) in EXCEPTIONS:
        return SampleOutcome(i, "exception", "", distance, backward)
    return SampleOutcome(
        i,
        "fail",
        "differs from the plain run, as the plain run under a do-nothing dispatch mode does: PyTorch's "
        "subclass formula (document it in EXCEPTIONS) or a kernel that is wrong inside any mode's handler",
        f"{distance}\n{bitwise_error}",
        backward,
    )


class _PassThrough(TorchDispatchMode):
    """A dispatch mode that changes nothing but makes PyTorch take its
    subclass paths (``isTensorSubclassLike`` is true under any mode)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def run_op(op: Any, setting: Setting | None = None) -> OpOutcome:
    """Every outcome of ``op``'s first samples, and the op's own (the worst)."""
    setting = (setting or Setting()).resolved()
    name = op_id(op)
    t0 = time.perf_counter()
    if setting.dtype not in op.supported_dtypes("cpu"):
        return OpOutcome(name, "skip", NO_DTYPE)
    if setting.variant == "inplace" and op.inplace_variant is None:
        return OpOutcome(name, "skip", NO_VARIANT)
    if getattr(op, "has_nondeterministic_output", False):
        why = "OpInfo.has_nondeterministic_output (uninitialized memory)"
        return OpOutcome(name, "skip", NONDETERMINISTIC, [SampleOutcome(-1, "skip", NONDETERMINISTIC, why)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with deadline(setting.deadline):
                samples = run_samples(op, setting)
        except TimeoutError as exc:
            _clean_modes()
            samples = [SampleOutcome(-1, "fail", _first_line(exc), traceback.format_exc())]
    seconds = time.perf_counter() - t0
    if not samples:
        return OpOutcome(name, "skip", NO_SAMPLES, samples, seconds)
    worst = max(samples, key=lambda s: _RANK[s.status])
    if worst.status == "skip":
        reasons = sorted({s.reason for s in samples}, key=SKIP_REASONS.index)
        return OpOutcome(name, "skip", reasons[-1], samples, seconds)
    return OpOutcome(name, worst.status, worst.reason if worst.status == "fail" else "", samples, seconds)


def run_corpus(
    ops: list[Any], setting: Setting | None = None, progress: Callable[[OpOutcome], None] | None = None
) -> list[OpOutcome]:
    """:func:`run_op` over ``ops``."""
    setting = (setting or Setting()).resolved()
    outcomes = []
    for op in ops:
        outcome = run_op(op, setting)
        outcomes.append(outcome)
        if progress is not None:
            progress(outcome)
    return outcomes
