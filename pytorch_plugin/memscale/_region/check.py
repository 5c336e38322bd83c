"""``memscale.check``: is a model safe under DTR?

:func:`check` runs one training step twice: plainly, and in a DTR region in
the stress setting (``dtr(stress=True)``: every evictable tensor is evicted as
soon as no running op needs it, so every tensor the step reads again is
rebuilt) with every rebuild verified against a fingerprint of its first run.
It reports whether the loss, every gradient and every buffer are bitwise those
of the plain run, and otherwise where it went wrong: the first op whose
rebuild differed or that failed, with the module it ran in.

``python -m memscale check SCRIPT`` does the same for a script's first
training step (see :mod:`memscale.__main__`); this module is private, its names are exported by ``memscale``.

Both runs start from the same state: the random number generators are forked
and seeded, buffers (batch-norm statistics) and gradients are put back after
each run, so the model is left as it was.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.module_tracker import ModuleTracker

from .region import dtr
from .tensor import DTRTensor, unwrap


@dataclass
class CheckReport:
    """What :func:`check` found.

    Attributes:
        safe: the step under stress was bitwise the plain step and raised
            nothing; for a step that is not deterministic by itself (see
            ``unstable``): every rebuild was bitwise its first run and
            nothing raised.
        error: the first failure (a rebuild that differed, an op that raised),
            or ``None``.
        where: the module path the failing op ran in ("" when not known).
        differences: names of the results that differ from the plain run
            (``"loss"``, ``"grad of layers.0.weight"``, ``"buffer bn.running_mean"``).
        evictions / rematerializations: what the stress run did.
        unstable: the results two plain runs of the step, seeded alike,
            already disagree on (a model that seeds itself from the
            operating system's entropy, as Reformer's reversible layers do);
            empty for a deterministic step. Those results say nothing about
            DTR: the stressed run is compared on the others only.
    """

    safe: bool
    error: str | None = None
    where: str = ""
    differences: list[str] = field(default_factory=list)
    evictions: int = 0
    rematerializations: int = 0
    unstable: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.safe:
            head = "memscale.check: NOT safe under DTR"
        elif self.unstable:
            head = (
                f"memscale.check: safe under DTR as far as rebuilds tell ({self.evictions} evictions, "
                f"{self.rematerializations} rebuilds verified bitwise against their first runs)"
            )
        else:
            head = (
                f"memscale.check: safe under DTR (bitwise; {self.evictions} evictions, "
                f"{self.rematerializations} rebuilds verified)"
            )
        lines = [head]
        if self.unstable:
            shown = ", ".join(self.unstable[:4])
            more = f" and {len(self.unstable) - 4} more" if len(self.unstable) > 4 else ""
            lines.append(
                f"  the step is not deterministic by itself: two plain runs, seeded alike, differ in {shown}{more}; "
                "the stressed run was not compared on those"
            )
        if self.error is not None:
            lines.append(f"  first failure: {self.error}")
            if self.where:
                lines.append(f"  in module: {self.where}")
        if self.differences:
            shown = ", ".join(self.differences[:8])
            more = f" and {len(self.differences) - 8} more" if len(self.differences) > 8 else ""
            lines.append(f"  differs from the plain run: {shown}{more}")
        return "\n".join(lines)


class _Tracker(ModuleTracker):
    """PyTorch's module tracker, made unable to break the program it watches.

    To follow backward it hooks the gradients of each module's tensors
    (``register_multi_grad_hook``), which raises for a tensor autograd has no
    node for: Reformer's reversible layers run their modules under
    ``no_grad`` inside a custom ``autograd.Function`` on leaves that require
    grad ("Expected gradient function to be set"). There the module is named
    in forward and not in that backward, and the program runs on.
    """

    def _fw_pre_hook(self, mod: Any, input: Any) -> None:
        try:
            super()._fw_pre_hook(mod, input)
        except (AssertionError, RuntimeError):
            pass

    def _fw_post_hook(self, mod: Any, input: Any, output: Any) -> None:
        try:
            super()._fw_post_hook(mod, input, output)
        except (AssertionError, RuntimeError):
            pass


class _Places:
    """The module path the program is in now (forward and backward)."""

    def __init__(self) -> None:
        self.tracker = _Tracker()

    def __call__(self) -> str:
        parents = [p for p in self.tracker.parents if p != "Global"]
        if not parents:
            return ""
        return max(parents, key=len)


def check(
    step: torch.nn.Module | Callable[..., Any],
    *inputs: Any,
    params: dict[str, torch.Tensor] | None = None,
    seed: int = 0,
    buffers: dict[str, torch.Tensor] | None = None,
) -> CheckReport:
    """Run one step plainly and under DTR's stress setting, and compare.

    Args:
        step: a module (the step is ``loss_of(step(*inputs))`` and its
            backward) or a function running a forward and returning the loss
            (a tensor; its backward is run here when it requires grad).
        inputs: the batch.
        params: the tensors whose gradients to compare, by name (default:
            the module's named parameters; for a function, none - its loss
            is still compared, and every rebuild is verified).
        seed: the seed both runs start from.
        buffers: the tensors the step updates in place (batch-norm running
            statistics, spectral norm's vectors), by name: put back before
            each run and compared (default: the module's named buffers; for
            a function, none - pass them, or each run starts from what the
            one before left, and the step looks as if it differed from
            itself).

    Returns:
        A :class:`CheckReport`; ``str(report)`` is a readable summary.
    """
    module = step if isinstance(step, torch.nn.Module) else None
    named = dict(params) if params is not None else (dict(module.named_parameters()) if module is not None else {})
    if buffers is not None:
        buffers = dict(buffers)
    else:
        buffers = dict(module.named_buffers()) if module is not None else {}

    def run() -> Any:
        out = step(*inputs)
        loss = _loss_of(out) if module is not None else out
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.backward()
        return loss

    with _preserved(named, buffers):
        with _seeded(seed):
            plain_loss = run()
        plain = _results(plain_loss, named, buffers)

    report = CheckReport(safe=True)
    places = _Places()
    region = dtr(stress=True)
    region.verify_where = places
    with _preserved(named, buffers):
        try:
            with places.tracker, _seeded(seed), region:
                loss = run()
            stressed = _results(loss, named, buffers)
        except Exception as exc:  # the report names it: a check must not stop the program
            report.safe = False
            report.error = f"{type(exc).__name__}: {exc}"
            report.where = getattr(exc, "where", None) or places()
            stressed = None
    summary = region.summary()
    report.evictions = int(summary["evictions"])
    report.rematerializations = int(summary["rematerializations"])
    if stressed is not None:
        report.differences = [k for k in plain if not _bitwise(plain[k], stressed.get(k))]
        if report.differences:
            # Does the step differ from itself? Then the comparison says
            # nothing about DTR: the verified rebuilds are the evidence.
            with _preserved(named, buffers):
                with _seeded(seed):
                    again_loss = run()
                again = _results(again_loss, named, buffers)
            report.unstable = [k for k in plain if not _bitwise(plain[k], again.get(k))]
            report.differences = [k for k in report.differences if k not in report.unstable]
        report.safe = not report.differences
    return report


def _loss_of(out: Any) -> Any:
    """The loss of a module's output: ``.loss`` (Hugging Face), else the sum of
    the first floating tensor."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        out = next((x for x in out if isinstance(x, torch.Tensor) and x.is_floating_point()), None)
    if not isinstance(out, torch.Tensor):
        raise TypeError("memscale.check: the module returned no tensor to take a loss of; pass a step function")
    return out.float().sum()


def _results(loss: Any, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if isinstance(loss, torch.Tensor):
        results["loss"] = unwrap(loss).detach().clone()
    for name, p in params.items():
        grad = p.grad
        results[f"grad of {name}"] = None if grad is None else unwrap(grad).detach().clone()
    for name, b in buffers.items():
        results[f"buffer {name}"] = unwrap(b).detach().clone()
    return results


def _bitwise(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if type(b) is DTRTensor:
        b = unwrap(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Fork the random number generators and seed them: torch's (every
    device's), Python's ``random`` and NumPy's global one (models draw from
    those too: wav2vec2's time masks come from ``np.random``), so the plain
    and the stressed run draw the same numbers; put back afterwards."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    py_state = random.getstate()
    np_random = _numpy_random()
    np_state = np_random.get_state() if np_random is not None else None
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            random.seed(seed)
            if np_random is not None:
                np_random.seed(seed)
            yield
    finally:
        random.setstate(py_state)
        if np_random is not None:
            np_random.set_state(np_state)


def _numpy_random() -> Any:
    """``numpy.random`` when NumPy is installed (torch does not require it)."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy.random


@contextlib.contextmanager
def _preserved(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> Iterator[None]:
    """Gradients and buffers as they were before, whatever the block did."""
    grads = {name: p.grad for name, p in params.items()}
    saved = {name: b.detach().clone() for name, b in buffers.items()}
    for p in params.values():
        p.grad = None
    try:
        yield
    finally:
        with torch.no_grad():
            for name, p in params.items():
                p.grad = grads[name]
            for name, b in buffers.items():
                b.copy_(saved[name])


class _StepsDone(BaseException):
    """Stops a checked script after its last checked training step."""


def check_program(run: Callable[[], None], steps: int = 1) -> CheckReport:
    """Run a whole program's first ``steps`` training steps under the stress
    setting, every rebuild verified (``python -m memscale check SCRIPT``).

    The program runs inside one stress region; each ``torch.optim`` step ends
    a training step (see :meth:`DTRRegion.end_step`), and after the
    ``steps``-th the program is stopped. Without a plain run to compare with,
    safety here means: every tensor rebuilt was bitwise what its op first
    computed, and nothing failed.
    """
    if steps < 1:
        raise ValueError(f"memscale.check: steps={steps}: check at least one step")
    places = _Places()
    region = dtr(stress=True)
    region.verify_where = places
    report = CheckReport(safe=True)
    done = [0]

    def count(optimizer: Any, args: Any, kwargs: Any) -> None:
        done[0] += 1
        if done[0] >= steps:
            raise _StepsDone

    from torch.optim.optimizer import register_optimizer_step_post_hook

    hook = register_optimizer_step_post_hook(count)
    try:
        with places.tracker, region:
            run()
    except _StepsDone:
        pass
    except Exception as exc:  # reported, not raised: the check's answer
        report.safe = False
        report.error = f"{type(exc).__name__}: {exc}"
        report.where = getattr(exc, "where", None) or places()
    finally:
        hook.remove()
    summary = region.summary()
    report.evictions = int(summary["evictions"])
    report.rematerializations = int(summary["rematerializations"])
    return report
