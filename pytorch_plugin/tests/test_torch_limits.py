"""What a pluggable allocator breaks in PyTorch, under memscale.install().

Each test runs in a fresh interpreter (an allocator swap cannot be undone):
cuDNN autotuning is kept off with a warning (PyTorch's pluggable allocator
raises in cacheInfo, which autotuning calls), CUDA graph capture fails at
once with memscale's error thrown by its begin-allocate-to-pool hook, and
CUDA IPC fails with a message that says what to do. On this CPU-only
machine the CUDA build of torch installs the allocator on the simulated
device; the hook is reached through
``torch._C._cuda_beginAllocateCurrentThreadToPool``, the call
``torch.cuda.use_mem_pool`` makes, which needs no GPU.
"""

from __future__ import annotations

import pytest

from _helpers import run_child
from memscale._native import lib as _lib

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(_lib.unavailable_reason() is not None, reason=f"libmemscale.so: {_lib.unavailable_reason()}"),
    pytest.mark.skipif(not hasattr(torch._C, "_cuda_customAllocator"), reason="torch has no CUDA support"),
]


def _child(code: str) -> str:
    proc = run_child(code, MEMSCALE_BACKEND=None)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout + proc.stderr


def test_cudnn_benchmark_is_kept_off_with_a_warning() -> None:
    out = _child(
        """
        import warnings, torch, memscale
        torch.backends.cudnn.benchmark = True            # set before install: turned off
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            memscale.install(backend="sim")
        assert torch.backends.cudnn.benchmark is False
        assert torch._C._get_cudnn_benchmark() is False
        assert any("cacheInfo" in str(w.message) and "#98481" in str(w.message) for w in caught), caught
        torch.backends.cudnn.benchmark = True            # set later: turned off
        assert torch.backends.cudnn.benchmark is False
        with torch.backends.cudnn.flags(enabled=True, benchmark=True):
            assert torch.backends.cudnn.benchmark is False
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True         # other flags untouched
        assert torch.backends.cudnn.deterministic is True
        print("kept off")
        """
    )
    assert "kept off" in out
    assert out.count("cannot work under a pluggable CUDA allocator") == 1, "warned once (logging), not per set"


def test_cudnn_benchmark_untouched_without_install() -> None:
    out = _child(
        """
        import torch, memscale
        torch.backends.cudnn.benchmark = True
        assert torch.backends.cudnn.benchmark is True
        print("untouched")
        """
    )
    assert "untouched" in out


def test_cuda_graph_capture_fails_in_the_hook() -> None:
    out = _child(
        """
        import torch, memscale
        inst = memscale.install(backend="sim")
        try:
            # What CUDAGraph::capture_begin and use_mem_pool call before a capture starts.
            torch._C._cuda_beginAllocateCurrentThreadToPool(0, (7, 0))
        except RuntimeError as exc:
            msg = str(exc)
            assert msg.startswith("memscale: CUDA graph capture is not supported"), msg
            assert "device 0, pool (7, 0)" in msg and "reduce-overhead" in msg, msg
            print("refused")
        else:
            raise AssertionError("capture was not refused")
        """
    )
    assert "refused" in out


def test_cuda_graph_capture_is_refused_before_the_generators_enter_capture() -> None:
    # torch's CUDAGraph::capture_begin puts the CUDA generators into capture
    # mode before it calls the allocator's hook; refused there, they stayed in
    # it and every later dropout failed (H200, 2026-11-27). memscale's
    # capture_begin asks the hook first: the original is never reached.
    out = _child(
        """
        import torch, memscale
        memscale.install(backend="sim")
        patched = torch.cuda.CUDAGraph.capture_begin
        original = patched.__memscale_original__
        # object() as self: had the original been reached, it would raise a TypeError.
        for pool in [(7, 0), None, type("Pool", (), {"id": (5, 6)})()]:
            try:
                patched(object(), pool)
            except RuntimeError as exc:
                msg = str(exc)
                assert msg.startswith("memscale: CUDA graph capture is not supported"), msg
                want = {None: (0, 0)}.get(pool, pool if isinstance(pool, tuple) else (5, 6))
                assert f"pool ({want[0]}, {want[1]})" in msg, (pool, msg)
            else:
                raise AssertionError("capture was not refused")
        assert original is not patched
        print("refused first")
        """
    )
    assert "refused first" in out


def test_cuda_ipc_fails_with_a_clear_message() -> None:
    out = _child(
        """
        import types, torch, memscale
        from memscale import MemscaleError
        memscale.install(backend="sim")
        fake_cuda_storage = types.SimpleNamespace(device=torch.device("cuda", 0))
        for call in (lambda: torch.UntypedStorage._share_cuda_(fake_cuda_storage),
                     lambda: torch.UntypedStorage._new_shared_cuda(0, b"handle", 0)):
            try:
                call()
            except MemscaleError as exc:
                assert "CUDA IPC" in str(exc) and "tensor.cpu()" in str(exc), exc
            else:
                raise AssertionError("IPC was not refused")
        # CPU storages are not affected.
        s = torch.UntypedStorage(8)
        try:
            s._share_cuda_()
        except MemscaleError:
            raise AssertionError("a CPU storage got memscale's IPC error")
        except Exception:
            pass
        print("ipc refused")
        """
    )
    assert "ipc refused" in out
