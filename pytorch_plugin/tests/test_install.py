"""memscale.install(): swapping libmemscale.so into PyTorch, and every refusal.

A swap cannot be undone in a process, so the tests that really swap run in a
fresh interpreter; the refusal tests run here and check that nothing changed.
On this CPU-only machine install() works (the CUDA build of torch swaps its
allocator without a GPU; nothing allocates until CUDA is used). With a GPU the
child also allocates a CUDA tensor through memscale.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import pytest

import memscale
from _helpers import run_child
from memscale import (
    AlreadyInstalledError,
    ConfigError,
    CUDAAlreadyInitializedError,
    InstallError,
)
from memscale._allocator import install as allocator_module
from memscale._native import lib as _lib

torch = pytest.importorskip("torch")

needs_library = pytest.mark.skipif(
    _lib.unavailable_reason() is not None,
    reason=f"libmemscale.so not built: {_lib.unavailable_reason()}",
)
needs_cuda_build = pytest.mark.skipif(
    not hasattr(torch._C, "_cuda_customAllocator"),
    reason=f"torch {torch.__version__} has no CUDA support (no pluggable allocator)",
)




@pytest.fixture
def untouched(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Checks that a refused install() left the process as it found it."""
    for var in (allocator_module.THRESHOLD_ENV, allocator_module.LIMIT_ENV):
        monkeypatch.delenv(var, raising=False)
    backend = os.environ.get(allocator_module.BACKEND_ENV)
    current_allocator = torch._C._cuda_getAllocator  # the real one, tests may patch it
    assert memscale.installed() is None, "a test swapped the allocator in the pytest process"
    yield
    assert os.environ.get(allocator_module.BACKEND_ENV) == backend
    assert memscale.installed() is None
    assert current_allocator() is None


@needs_library
@needs_cuda_build
def test_pluggable_allocator_constructs_with_the_library() -> None:
    path = str(_lib.find_library())
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "memscale_malloc", "memscale_free")
    assert isinstance(alloc._allocator, torch._C._CUDAPluggableAllocator)
    for setter, export in allocator_module._HOOKS:
        getattr(alloc._allocator, setter)(ctypes.cast(getattr(_lib.lib(), export), ctypes.c_void_p).value)
    assert torch._C._cuda_getAllocator() is None  # constructing swaps nothing


@needs_library
@needs_cuda_build
def test_install_swaps_the_allocator() -> None:
    proc = run_child(
        """
        import torch, memscale
        from memscale import AlreadyInstalledError
        inst = memscale.install(threshold="1GiB", limit="2GiB", backend="sim")
        assert torch._C._cuda_getAllocator() is inst.allocator._allocator
        assert inst.thresholds == {0: 1 << 30} or torch.cuda.device_count() > 1, inst
        assert inst.limits[0] == 2 << 30, inst
        assert memscale.installed() is inst
        assert memscale.install() is inst                      # no-op
        assert memscale.install("1GiB", "2GiB", "sim") is inst  # same settings: no-op
        try:
            memscale.install(threshold="3GiB")
        except AlreadyInstalledError as exc:
            assert "set_threshold" in str(exc)
        else:
            raise AssertionError("a second install with other settings was accepted")
        stats = memscale.memory_stats()
        assert stats["eviction_threshold_bytes"] == 1 << 30, stats["eviction_threshold_bytes"]
        assert stats["limit_bytes"] == 2 << 30, stats["limit_bytes"]
        assert memscale.set_threshold("512MiB") == 512 << 20
        assert memscale.memory_stats()["eviction_threshold_bytes"] == 512 << 20
        assert memscale.set_limit("50%") == memscale.device_total_memory() // 2
        assert isinstance(memscale.memory_stats(), dict)
        if torch.cuda.is_available():
            base = memscale.memory_allocated()
            x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
            assert memscale.memory_allocated() >= base + (1 << 20)
            del x
            assert memscale.memory_allocated() == base
            torch.cuda.empty_cache()
        else:
            try:
                torch.empty(4, device="cuda")
            except RuntimeError:
                pass  # no driver: torch refuses before allocating
            else:
                raise AssertionError("allocated on CUDA without a GPU")
        print("installed", inst.library)
        """,
        MEMSCALE_BACKEND=None,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "installed" in proc.stdout


@needs_library
@needs_cuda_build
def test_install_reads_the_threshold_from_the_environment() -> None:
    proc = run_child(
        """
        import memscale
        inst = memscale.install()
        stats = memscale.memory_stats()
        assert inst.thresholds[0] == stats["device_total_bytes"] * 3 // 4, (inst, stats["device_total_bytes"])
        assert stats["eviction_threshold_bytes"] == inst.thresholds[0]
        assert stats["limit_bytes"] == inst.limits[0] == 14 << 30, stats["limit_bytes"]
        print("ok")
        """,
        MEMSCALE_EVICTION_THRESHOLD="75%",
        MEMSCALE_MEMORY_LIMIT="14GiB",
        MEMSCALE_SIM_CAPACITY="16GiB",
        MEMSCALE_BACKEND="sim",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


@needs_library
@needs_cuda_build
@needs_library
@needs_cuda_build
@pytest.mark.slow
def test_failed_swap_restores_everything() -> None:
    proc = run_child(
        """
        import os, torch, memscale
        from memscale import CUDAAlreadyInitializedError
        def refuse(alloc):
            raise RuntimeError("Can't swap an already initialized allocator")
        torch.cuda.memory.change_current_allocator = refuse
        try:
            memscale.install(threshold="1GiB", limit="2GiB", backend="sim")
        except CUDAAlreadyInitializedError as exc:
            assert "before any CUDA use" in str(exc), exc
        else:
            raise AssertionError("install() did not report the refused swap")
        assert "MEMSCALE_BACKEND" not in os.environ
        assert memscale.installed() is None
        assert torch._C._cuda_getAllocator() is None
        stats = memscale.memory_stats()   # the library's defaults are back
        assert stats["eviction_threshold_bytes"] == 0, stats["eviction_threshold_bytes"]
        assert stats["limit_bytes"] == stats["device_total_bytes"], stats["limit_bytes"]
        print("restored")
        """,
        MEMSCALE_BACKEND=None,
        MEMSCALE_EVICTION_THRESHOLD=None,
        MEMSCALE_MEMORY_LIMIT=None,
    )
    assert proc.returncode == 0, proc.stderr
    assert "restored" in proc.stdout


@needs_library
@needs_cuda_build
@pytest.mark.slow
def test_backend_cannot_change_once_the_library_runs() -> None:
    proc = run_child(
        """
        import torch, memscale
        from memscale import InstallError
        memscale.memory_stats()           # loads the library with backend sim
        inst = memscale.install(backend="sim")
        assert torch._C._cuda_getAllocator() is inst.allocator._allocator
        print("ok")
        """,
        MEMSCALE_BACKEND="sim",
    )
    assert proc.returncode == 0, proc.stderr
    proc = run_child(
        """
        import torch, memscale
        from memscale import InstallError
        memscale.memory_stats()
        try:
            memscale.install(backend="cuda")
        except InstallError as exc:
            assert "already running with backend" in str(exc), exc
        else:
            raise AssertionError("backend change accepted")
        assert torch._C._cuda_getAllocator() is None
        print("ok")
        """,
        MEMSCALE_BACKEND="sim",
    )
    assert proc.returncode == 0, proc.stderr


def test_install_after_cuda_is_initialized_is_refused(monkeypatch: pytest.MonkeyPatch, untouched: None) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    if not hasattr(torch._C, "_cuda_customAllocator"):
        monkeypatch.setattr(torch._C, "_cuda_customAllocator", object(), raising=False)
        monkeypatch.setattr(torch._C, "_cuda_getAllocator", lambda: None, raising=False)
    loaded = _lib.is_loaded()
    with pytest.raises(CUDAAlreadyInitializedError) as info:
        memscale.install(threshold="1GiB", backend="sim")
    assert "memscale.install() at the very start" in str(info.value)
    assert isinstance(info.value, InstallError)
    assert _lib.is_loaded() == loaded  # refused before even loading the library


def test_install_with_another_pluggable_allocator_is_refused(monkeypatch: pytest.MonkeyPatch, untouched: None) -> None:
    monkeypatch.setattr(torch._C, "_cuda_customAllocator", object(), raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getAllocator", lambda: object(), raising=False)
    with pytest.raises(AlreadyInstalledError, match="another pluggable CUDA allocator"):
        memscale.install(backend="sim")


def test_install_without_cuda_support_is_refused(monkeypatch: pytest.MonkeyPatch, untouched: None) -> None:
    monkeypatch.delattr(torch._C, "_cuda_customAllocator", raising=False)
    with pytest.raises(InstallError, match="no CUDA support"):
        memscale.install()


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("MEMSCALE_EVICTION_THRESHOLD", "lots"),
        ("MEMSCALE_EVICTION_THRESHOLD", "12 GB please"),
        ("MEMSCALE_EVICTION_THRESHOLD", "150%"),
        ("MEMSCALE_MEMORY_LIMIT", "-4GiB"),
    ],
)
def test_bad_environment_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, untouched: None, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        memscale.install()
    assert var in str(info.value)
    assert repr(value) in str(info.value)
    monkeypatch.delenv(var)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"threshold": "lots"}, "threshold='lots'"),
        ({"limit": -1}, "limit=-1"),
        ({"backend": "opencl"}, "backend='opencl'"),
    ],
)
def test_bad_argument_names_it(untouched: None, kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        memscale.install(**kwargs)  # type: ignore[arg-type]
