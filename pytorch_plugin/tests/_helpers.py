"""Helpers shared by the plugin tests (imported by module name: pytest puts this
directory on sys.path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


import memscale
from memscale._native import lib as _lib


def require_engine() -> None:
    """Skip the calling test module when the DTR engine's exports cannot be loaded."""
    import pytest

    from memscale._native import engine as _engine

    reason = _engine.unavailable_reason()
    if reason is not None:
        pytest.skip(f"the DTR engine is unavailable: {reason}", allow_module_level=True)


def run_child(code: str, timeout: float = 120, **env: str | None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that loads the same library (``None`` unsets a variable)."""
    child_env = {**os.environ, _lib.LIBRARY_ENV: str(_lib.find_library())}
    for name, value in env.items():
        if value is None:
            child_env.pop(name, None)
        else:
            child_env[name] = value
    child_env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(memscale.__file__).resolve().parent.parent), child_env.get("PYTHONPATH", "")]
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail with TimeoutError instead of hanging after ``seconds`` (no limit
    off the main thread, where signals cannot be used, or for ``seconds <= 0``)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def boom(signum: int, frame: Any) -> None:
        raise TimeoutError(f"exceeded {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def assert_same_steps(ref: list[dict[str, Any]], got: list[dict[str, Any]], what: str) -> None:
    """Assert two runs' recorded steps are bitwise equal: the loss, every
    gradient, and the buffers and parameters when the steps recorded them."""
    import torch

    for step, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert torch.equal(a["loss"], b["loss"]), f"{what} step {step}: loss {b['loss']} != {a['loss']}"
        for kind, key in (("gradient", "grads"), ("buffer", "buffers"), ("parameter", "params")):
            for name, x in a.get(key, {}).items():
                assert torch.equal(x, b[key][name]), f"{what} step {step}: {kind} of {name} differs"


def steady_clock(monkeypatch: Any) -> None:
    """Measure every op the region runs or re-runs (and every block call of
    :mod:`memscale._blocks`) at exactly 1 us.

    The engine's decisions depend on measured op costs; with this they depend
    on the program alone, so whether a step fits a tight budget never depends
    on the machine's load (tests must be deterministic)."""
    import importlib
    import itertools

    ticks = itertools.count(step=1000)

    def now() -> int:
        return next(ticks)

    for module in ("memscale._region.dispatch", "memscale._region.replay", "memscale._blocks.tracker"):
        monkeypatch.setattr(importlib.import_module(module), "perf_ns", now)
    # The native path times its ops in C++: the same 1 us each.
    monkeypatch.setattr(importlib.import_module("memscale._region.native"), "TEST_OP_COST", (1000, 0))


def native_region() -> bool:
    """Whether this run asks for the native region (``MEMSCALE_NATIVE=1``)."""
    return os.environ.get("MEMSCALE_NATIVE") == "1"


def force_native(monkeypatch: Any) -> Iterator[None]:
    """An autouse fixture's body for the native region's own tests: every
    region entry of the test runs native, and a build that cannot be used
    fails the test, naming why."""
    import pytest

    from memscale._native import region_ext

    monkeypatch.setenv("MEMSCALE_NATIVE", "1")
    if region_ext.extension() is None:
        pytest.fail(f"the native region's extension cannot be used: {region_ext.unavailable_reason()}")
    yield


def python_region_only(reason: str) -> Any:
    """Mark a test that checks what only the Python region has by design:
    skipped under ``MEMSCALE_NATIVE=1``; ``reason`` names what the native region lacks."""
    import pytest

    return pytest.mark.skipif(native_region(), reason=f"the native region has no {reason}")


def is_region_tensor(t: Any) -> bool:
    """Whether ``t`` is a tensor of a DTR region, on either path: the Python
    region's wrapper (``DTRTensor``) or the native region's (a plain
    ``torch.Tensor`` whose TensorImpl is the extension's wrapper)."""
    import torch

    from memscale._native import region_ext
    from memscale._region.tensor import DTRTensor

    if isinstance(t, DTRTensor):
        return True
    # The extension as loaded by a native entry (None if none ran: then no
    # tensor can be its wrapper); never built or loaded from here.
    ext = region_ext._module
    return ext is not None and isinstance(t, torch.Tensor) and bool(ext.is_wrapper(t))


def is_plain_tensor(t: Any) -> bool:
    """Whether ``t`` is a plain ``torch.Tensor``, not a tensor of a region on
    either path (the native wrapper's type is ``torch.Tensor`` too)."""
    import torch

    return type(t) is torch.Tensor and not is_region_tensor(t)


def region_kind(t: Any) -> str:
    """``"region"`` for a tensor of a DTR region (either path), ``"plain"`` for
    any other tensor, and the type's name for what is not a tensor (``"NoneType"``)."""
    import torch

    if is_region_tensor(t):
        return "region"
    return "plain" if isinstance(t, torch.Tensor) else type(t).__name__
