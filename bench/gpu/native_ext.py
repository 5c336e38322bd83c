"""Build (or load) the native region's torch extension once, before the GPU steps use it.

The native region (issue 28; ``MEMSCALE_NATIVE=1``) runs its per-op path in
C++: ``pytorch_plugin/memscale/_native/csrc``, a torch extension that
``memscale._native.region_ext`` builds with ``torch.utils.cpp_extension`` at
first use against the torch it runs under and keeps in the memscale cache
directory (``~/.cache/memscale/torch-extensions``). On the GPU machine it is
built there, against its torch; ``run_all.sh`` starts this script in the
background at the beginning, so that the build (a minute or two: a compiler
and ninja are needed) overlaps the first steps and every later process loads
the cached module.

Writes ``native_ext.json``: ``status`` ``ok`` (built or loaded, then one op
inside ``memscale.dtr(None)`` with ``MEMSCALE_NATIVE=1`` ran on the native
path and matched plain PyTorch, and the paths that depend on the device -
``rms_norm``'s fused kernel and its formula on CUDA, a factory op inside an
entry - ran on the device under stress, bitwise: ``device_paths``) or
``unavailable`` with ``reason``
(``region_ext.unavailable_reason()``) and, when a build failed, the end of its
output; the seconds it took, whether it was built or found in the cache, the
torch version, and the compiler and ninja found. Exit status 1 when
unavailable. Without CUDA it skips itself (the GPU steps that need the
extension skip too) unless ``--device cpu``.

    PYTHONPATH=pytorch_plugin MEMSCALE_LIBRARY=build/libmemscale.so python bench/gpu/native_ext.py --out native_ext.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

import _common

STEP = "native_ext"


def tools() -> dict[str, Any]:
    """What a build needs, as found on this machine."""
    out: dict[str, Any] = {name: shutil.which(name) for name in ("c++", "g++", "gcc", "ninja")}
    out["CXX"] = os.environ.get("CXX")
    out["MAX_JOBS"] = os.environ.get("MAX_JOBS")
    try:
        from torch.utils import cpp_extension

        out["ninja_available"] = bool(cpp_extension.is_ninja_available())
    except Exception as exc:  # noqa: BLE001 - informational
        out["ninja_available"] = f"? ({type(exc).__name__}: {exc})"
    try:
        import sysconfig

        include = sysconfig.get_paths().get("include")
        out["python_h"] = bool(include and os.path.exists(os.path.join(include, "Python.h")))
    except Exception:  # noqa: BLE001 - informational
        out["python_h"] = None
    return out


@contextlib.contextmanager
def native_forced() -> Iterator[None]:
    """``MEMSCALE_NATIVE=1`` for the block (the region must take the native path)."""
    old = os.environ.get("MEMSCALE_NATIVE")
    os.environ["MEMSCALE_NATIVE"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MEMSCALE_NATIVE", None)
        else:
            os.environ["MEMSCALE_NATIVE"] = old


def check_op() -> dict[str, Any]:
    """One small op inside ``memscale.dtr(None)`` on the native path (CPU tensors)."""
    import torch

    import memscale

    with native_forced():
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        want = (x * 2 + 1).sum(dim=0)
        region = memscale.dtr(None)
        with region:
            y = (x * 2 + 1).sum(dim=0)
        got = region.unwrap(y)
        return {"native_path": bool(getattr(region, "native", False)), "equal": bool(torch.equal(got, want))}


def check_paths(device: str) -> dict[str, Any]:
    """The native paths whose behaviour depends on the device, on ``device``
    under ``memscale.dtr(stress=True)`` (every evictable tensor evicted and
    rebuilt): ``rms_norm`` forward and backward on region tensors (on CUDA its
    fused kernel and formula, on the CPU the decomposition: the grad_fn must be
    plain PyTorch's), and a factory op inside the entry (a region tensor,
    rebuilt from its generator state). Each: bitwise against plain."""
    import torch

    import memscale
    from memscale._native import region_ext

    with native_forced():
        torch.manual_seed(0)
        x = torch.randn(4, 64, 256, device=device, requires_grad=True)
        w = torch.randn(256, device=device, requires_grad=True)

        def step() -> tuple[str, list[Any]]:
            x.grad = w.grad = None
            noise = torch.randn(4, 64, 256, device=device)
            y = torch.nn.functional.rms_norm(x * 1.5 + noise, [256], w)
            name = type(y.grad_fn).__name__
            y.square().mean().backward()
            return name, [y.detach().clone(), x.grad.clone(), w.grad.clone()]

        torch.manual_seed(1)
        plain_fn, plain = step()
        region = memscale.dtr(stress=True)
        torch.manual_seed(1)
        with region:
            got_fn, got = step()
            factory_is_region = bool(region_ext.extension().is_wrapper(torch.zeros(2, device=device)))
        got = [region.unwrap(t) for t in got]
        bitwise = all(torch.equal(a, b) for a, b in zip(plain, got))
        return {
            "device": device,
            "native_path": bool(getattr(region, "native", False)),
            "rms_norm_grad_fn": {"plain": plain_fn, "region": got_fn},
            "bitwise": bitwise,
            "factory_is_region_tensor": factory_is_region,
            "rematerializations": int(region.summary()["rematerializations"]),
            "ok": bool(bitwise and plain_fn == got_fn and factory_is_region and getattr(region, "native", False)),
        }


def run(a: argparse.Namespace) -> int:
    import torch

    from memscale._native import region_ext

    result = _common.record(STEP, status="unavailable", torch=torch.__version__, tools=tools())
    state: dict[str, Any] = {"built": False}
    build = getattr(region_ext, "_build", None)
    if build is not None:  # keep the whole of a failed build's output (the reason is its first line)
        def timed_build(target: Any) -> Any:
            state["built"] = True
            t0 = time.monotonic()
            try:
                return build(target)
            except BaseException:
                state["build_error"] = traceback.format_exc()[-6000:]
                raise
            finally:
                state["build_s"] = round(time.monotonic() - t0, 1)

        region_ext._build = timed_build  # type: ignore[attr-defined]
    try:
        result["path"] = str(region_ext.cached_path())
        result["cached_before"] = region_ext.cached_path().exists()
    except Exception as exc:  # noqa: BLE001 - the extension() call below says why
        result["path"] = f"? ({type(exc).__name__}: {exc})"
    print(f"native region's extension: torch {torch.__version__}, {result['path']} "
          f"({'cached' if result.get('cached_before') else 'to build'}); tools {result['tools']}", flush=True)
    t0 = time.monotonic()
    ext = region_ext.extension()
    result["seconds"] = round(time.monotonic() - t0, 1)
    result.update(state)
    if ext is None:
        result["reason"] = region_ext.unavailable_reason()
        print(f"UNAVAILABLE {STEP}: {result['reason']} (after {result['seconds']} s)", flush=True)
        if state.get("build_error"):
            print(state["build_error"], flush=True)
        _common.write_json(a.out, result)
        return 1
    try:
        result["check"] = check_op()
    except Exception as exc:  # noqa: BLE001 - reported
        result.update(status="failed", error=f"check: {type(exc).__name__}: {str(exc)[:2000]}")
        traceback.print_exc()
        _common.write_json(a.out, result)
        return 1
    # The operators with the region's kernel, and how many through an unboxed
    # entry (csrc/unboxed.h: each listed at::_ops struct compiled against this torch).
    result["kernels"] = {"registered": int(ext.registered_kernels()), "unboxed": int(ext.unboxed_kernels())}
    try:
        result["device_paths"] = check_paths(a.device)
    except Exception as exc:  # noqa: BLE001 - reported
        result["device_paths"] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
        traceback.print_exc()
    ok = result["check"]["native_path"] and result["check"]["equal"] and result["device_paths"]["ok"]
    result["status"] = "ok" if ok else "failed"
    if not ok:
        result["error"] = f"the check op: {result['check']}; the device's paths: {result['device_paths']}"
    print(f"{'ok' if ok else 'FAIL'} {STEP}: {'built' if state['built'] else 'loaded from the cache'} in "
          f"{result['seconds']} s; check op {result['check']}; kernels {result['kernels']}; "
          f"device paths {result['device_paths']}", flush=True)
    _common.write_json(a.out, result)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="JSON result file")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: build or load without a GPU")
    p.add_argument("--dry-run", action="store_true", help="say what would be built; build nothing")
    a = p.parse_args(argv)
    _common.setup_env()
    if a.dry_run:
        import torch

        from memscale._native import region_ext

        print(f"{STEP} --dry-run: would build or load {region_ext.cached_path()} "
              f"(exists: {region_ext.cached_path().exists()}) with torch {torch.__version__}; tools {tools()}")
        return 0
    skipped = _common.skip_without_cuda(STEP, a.device, a.out)
    if skipped is not None:
        return skipped
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
