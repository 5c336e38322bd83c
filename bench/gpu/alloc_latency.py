"""Latency of a malloc+free pair: memscale (C ABI through ctypes) vs the CUDA driver.

For each size (512 B, 64 KiB, 1 MiB, 16 MiB, 256 MiB) this times, from Python
through ctypes:

* ``memscale_malloc(size, 0, NULL)`` + ``memscale_free(p, size, 0, NULL)`` on
  libmemscale.so with ``MEMSCALE_BACKEND=cuda`` (the block is cached after the
  first pair, which is the point of a caching allocator);
* ``cuMemAlloc_v2`` + ``cuMemFree_v2`` on libcuda.so.1, with the device's primary
  context current (``cuInit``, ``cuDevicePrimaryCtxRetain``, ``cuCtxSetCurrent``).

Both go through the same ctypes call path; the ``ctypes floor`` row (two calls
of libc's ``abs``) is the Python-side cost included in every pair. Samples of
many pairs are timed with ``time.perf_counter_ns``; the table gives the median,
minimum and 90th percentile ns per pair.

Before timing, a memscale pointer of each size is checked to be real device
memory: ``cuPointerGetAttribute(MEMORY_TYPE)`` and a ``cuMemsetD8`` +
``cuMemcpyDtoH`` round trip.

No torch needed. Without a GPU (libcuda.so.1 missing, ``cuInit`` failing or no
device) it prints a skip message and exits 0. ``--backend sim
--no-cuda-baseline`` runs the memscale half on the simulated device (for
testing this script on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import _common

STEP = "alloc_latency"
DEFAULT_SIZES = (512, 64 << 10, 1 << 20, 16 << 20, 256 << 20)

c_int, c_uint, c_size_t, c_void_p, c_uint64 = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_uint64
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_MEMORYTYPE_DEVICE = 2


class CudaError(RuntimeError):
    """A CUDA driver call returned an error."""


def size_name(n: int) -> str:
    """512 B / 64 KiB / 1 MiB style."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


class Driver:
    """The few CUDA driver calls this benchmark needs, through ctypes."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        protos: dict[str, list[Any]] = {
            "cuInit": [c_uint],
            "cuDeviceGetCount": [ctypes.POINTER(c_int)],
            "cuDeviceGet": [ctypes.POINTER(c_int), c_int],
            "cuDeviceGetName": [ctypes.c_char_p, c_int, c_int],
            "cuDeviceTotalMem_v2": [ctypes.POINTER(c_size_t), c_int],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(c_void_p), c_int],
            "cuDevicePrimaryCtxRelease_v2": [c_int],
            "cuCtxSetCurrent": [c_void_p],
            "cuCtxSynchronize": [],
            "cuMemAlloc_v2": [ctypes.POINTER(c_uint64), c_size_t],
            "cuMemFree_v2": [c_uint64],
            "cuMemsetD8_v2": [c_uint64, ctypes.c_ubyte, c_size_t],
            "cuMemcpyDtoH_v2": [c_void_p, c_uint64, c_size_t],
            "cuPointerGetAttribute": [c_void_p, c_int, c_uint64],
            "cuGetErrorString": [c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuDriverGetVersion": [ctypes.POINTER(c_int)],
        }
        self.missing: list[str] = []
        for name, argtypes in protos.items():
            try:
                fn = getattr(self.lib, name)
            except AttributeError:
                self.missing.append(name)
                continue
            fn.argtypes = argtypes
            fn.restype = c_int
        self.dev = c_int(0)
        self.ctx = c_void_p()

    def check(self, rc: int, what: str) -> None:
        """Raise :class:`CudaError` naming ``what`` unless ``rc`` is CUDA_SUCCESS."""
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            text = msg.value.decode() if msg.value else "unknown error"
            raise CudaError(f"{what} failed: CUresult {rc} ({text})")

    def open(self, ordinal: int = 0) -> dict[str, Any]:
        """cuInit, pick the device, make its primary context current; returns its description."""
        required = [n for n in self.missing if n not in ("cuMemsetD8_v2", "cuMemcpyDtoH_v2", "cuPointerGetAttribute")]
        if required:
            raise CudaError(f"libcuda.so.1 lacks {', '.join(required)}")
        self.check(self.lib.cuInit(0), "cuInit(0)")
        count = c_int(0)
        self.check(self.lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        if count.value <= ordinal:
            raise CudaError(f"cuDeviceGetCount reports {count.value} device(s); device {ordinal} does not exist")
        self.check(self.lib.cuDeviceGet(ctypes.byref(self.dev), ordinal), f"cuDeviceGet({ordinal})")
        name = ctypes.create_string_buffer(256)
        self.check(self.lib.cuDeviceGetName(name, 256, self.dev), "cuDeviceGetName")
        total = c_size_t(0)
        self.check(self.lib.cuDeviceTotalMem_v2(ctypes.byref(total), self.dev), "cuDeviceTotalMem_v2")
        version = c_int(0)
        self.check(self.lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        return {
            "name": name.value.decode(errors="replace"),
            "total_memory": int(total.value),
            "driver_api_version": int(version.value),
            "device_count": int(count.value),
        }

    def close(self) -> None:
        """Release the primary context retained by :meth:`open`."""
        if self.ctx.value:
            self.lib.cuDevicePrimaryCtxRelease_v2(self.dev)
            self.ctx = c_void_p()

    def check_device_pointer(self, ptr: int, size: int) -> dict[str, Any]:
        """Is ``ptr`` device memory that can be written and read back?"""
        out: dict[str, Any] = {"size": size}
        if self.missing:
            out["ok"] = None
            out["skipped"] = f"libcuda.so.1 lacks {', '.join(self.missing)}"
            return out
        mtype = c_uint(0)
        rc = self.lib.cuPointerGetAttribute(ctypes.byref(mtype), CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
        out["memory_type"] = int(mtype.value) if rc == 0 else f"cuPointerGetAttribute error {rc}"
        out["memory_type_is_device"] = rc == 0 and mtype.value == CU_MEMORYTYPE_DEVICE
        n = min(size, 4096)
        pattern = 0xA5
        self.check(self.lib.cuMemsetD8_v2(ptr, pattern, size), f"cuMemsetD8_v2({size_name(size)})")
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        host = (ctypes.c_ubyte * n)()
        self.check(self.lib.cuMemcpyDtoH_v2(host, ptr + size - n, n), "cuMemcpyDtoH_v2")
        out["roundtrip_ok"] = all(b == pattern for b in host)
        out["ok"] = bool(out["roundtrip_ok"])
        return out


def load_memscale(path: str, backend: str) -> ctypes.CDLL:
    """Load libmemscale.so with ``MEMSCALE_BACKEND=backend`` (read by Go at load time)."""
    os.environ["MEMSCALE_BACKEND"] = backend
    lib = ctypes.CDLL(path)
    lib.memscale_malloc.restype = c_void_p
    lib.memscale_malloc.argtypes = [ctypes.c_ssize_t, c_int, c_void_p]
    lib.memscale_free.restype = None
    lib.memscale_free.argtypes = [c_void_p, ctypes.c_ssize_t, c_int, c_void_p]
    lib.memscale_init.restype = None
    lib.memscale_init.argtypes = [c_int]
    lib.memscale_allocated.restype = ctypes.c_int64
    lib.memscale_allocated.argtypes = [c_int]
    lib.memscale_config_json.restype = c_void_p
    lib.memscale_config_json.argtypes = []
    lib.memscale_string_free.restype = None
    lib.memscale_string_free.argtypes = [c_void_p]
    lib.memscale_last_error.restype = ctypes.c_char_p
    lib.memscale_last_error.argtypes = []
    lib.memscale_error_count.restype = c_int
    lib.memscale_error_count.argtypes = []
    lib.memscale_version.restype = ctypes.c_char_p
    lib.memscale_version.argtypes = []
    return lib


def memscale_config(lib: ctypes.CDLL) -> dict[str, Any]:
    """``memscale_config_json`` parsed."""
    p = lib.memscale_config_json()
    if not p:
        raise RuntimeError(f"memscale_config_json failed: {lib.memscale_last_error().decode()}")
    try:
        return json.loads(ctypes.string_at(p).decode())
    finally:
        lib.memscale_string_free(p)


def measure(fn: Callable[[int], None], min_ms: float, max_samples: int, row_seconds: float) -> dict[str, Any]:
    """Time ``fn(n)`` (n pairs) in samples of >= ``min_ms``; per-pair ns statistics."""
    fn(4)  # warm: caches the block, attaches the thread
    n = 1
    while True:  # calibrate on the fastest of three
        best = min(_elapsed(fn, n) for _ in range(3))
        if best >= min_ms * 1e6 or n >= 1 << 22:
            break
        n *= 2
    per: list[float] = []
    deadline = time.monotonic() + row_seconds
    while len(per) < max_samples and (len(per) < 5 or time.monotonic() < deadline):
        per.append(_elapsed(fn, n) / n)
    per.sort()
    return {
        "median_ns": round(_common.median(per) or 0.0, 1),
        "min_ns": round(per[0], 1),
        "p90_ns": round(per[min(len(per) - 1, (len(per) * 9) // 10)], 1),
        "samples": len(per),
        "pairs_per_sample": n,
    }


def _elapsed(fn: Callable[[int], None], n: int) -> float:
    t0 = time.perf_counter_ns()
    fn(n)
    return float(time.perf_counter_ns() - t0)


def memscale_pairs(lib: ctypes.CDLL, size: int) -> Callable[[int], None]:
    """n memscale_malloc+memscale_free pairs of ``size`` bytes."""
    m, f = lib.memscale_malloc, lib.memscale_free

    def run(n: int) -> None:
        for _ in range(n):
            p = m(size, 0, None)
            if not p:
                raise RuntimeError(f"memscale_malloc({size}) failed: {lib.memscale_last_error().decode()}")
            f(p, size, 0, None)

    return run


def cuda_pairs(drv: Driver, size: int) -> Callable[[int], None]:
    """n cuMemAlloc_v2+cuMemFree_v2 pairs of ``size`` bytes."""
    alloc, free = drv.lib.cuMemAlloc_v2, drv.lib.cuMemFree_v2
    ptr = c_uint64(0)
    ref = ctypes.byref(ptr)

    def run(n: int) -> None:
        for _ in range(n):
            rc = alloc(ref, size)
            if rc:
                drv.check(rc, f"cuMemAlloc_v2({size})")
            rc = free(ptr)
            if rc:
                drv.check(rc, "cuMemFree_v2")

    return run


def ctypes_floor() -> Callable[[int], None]:
    """n pairs of libc abs() calls: the ctypes overhead of one pair of calls."""
    libc = ctypes.CDLL(None)
    fn = libc.abs
    fn.argtypes = [c_int]
    fn.restype = c_int

    def run(n: int) -> None:
        for _ in range(n):
            fn(1)
            fn(2)

    return run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSON result file")
    p.add_argument("--library", default=None, help="libmemscale.so (default: $MEMSCALE_LIBRARY or build/libmemscale.so)")
    p.add_argument("--backend", choices=("cuda", "sim"), default="cuda", help="memscale backend (default cuda)")
    p.add_argument("--no-cuda-baseline", action="store_true", help="do not time cuMemAlloc/cuMemFree (and do not need a GPU with --backend sim)")
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="comma-separated byte sizes")
    p.add_argument("--min-ms", type=float, default=2.0, help="minimum ms per sample (default 2)")
    p.add_argument("--max-samples", type=int, default=51, help="samples per row at most (default 51)")
    p.add_argument("--row-seconds", type=float, default=1.5, help="time per row after calibration (default 1.5 s)")
    p.add_argument("--dry-run", action="store_true", help="check the setup and print the plan; touch no GPU")
    a = p.parse_args(argv)
    try:
        a.size_list = [int(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes {a.sizes!r}: expected comma-separated integers (bytes)")
    if not a.size_list or any(s <= 0 for s in a.size_list):
        p.error(f"--sizes {a.sizes!r}: need positive sizes")
    if a.max_samples < 5:
        p.error("--max-samples must be >= 5")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lib_path = str(args.library or _common.library_path())
    plan = [
        f"load {lib_path} with MEMSCALE_BACKEND={args.backend}",
        *(f"time memscale_malloc+memscale_free {size_name(s)}" for s in args.size_list),
        *(
            [f"time cuMemAlloc_v2+cuMemFree_v2 {size_name(s)} (libcuda.so.1, primary context)" for s in args.size_list]
            if not args.no_cuda_baseline
            else []
        ),
        "time two ctypes calls of libc abs() (the Python-side floor)",
    ]
    if args.dry_run:
        print(f"{STEP} --dry-run: plan")
        for line in plan:
            print("  - " + line)
        problems = []
        if not os.path.exists(lib_path):
            problems.append(f"{lib_path} does not exist (run make)")
        try:
            ctypes.CDLL("libcuda.so.1")
            print("  libcuda.so.1: loadable")
        except OSError as exc:
            print(f"  libcuda.so.1: not loadable here ({exc}); the real run will skip")
        for line in problems:
            print("  PROBLEM: " + line)
        return 1 if problems else 0

    need_cuda = args.backend == "cuda" or not args.no_cuda_baseline
    drv: Driver | None = None
    device: dict[str, Any] = {}
    if need_cuda:
        try:
            drv = Driver()
        except OSError as exc:
            return _common.skip(STEP, f"libcuda.so.1 cannot be loaded ({exc}): no NVIDIA driver here", args.out)
        try:
            device = drv.open(0)
        except CudaError as exc:
            return _common.skip(STEP, f"no usable CUDA device: {exc}", args.out)
    if not os.path.exists(lib_path):
        print(f"FAIL {STEP}: {lib_path} does not exist (build it with make)", flush=True)
        _common.write_json(args.out, _common.record(STEP, status="failed", error=f"{lib_path} missing"))
        return 1

    result = _common.record(STEP, status="ok", library=lib_path, backend=args.backend, device=device, rows=[])
    rc = 0
    try:
        ms = load_memscale(lib_path, args.backend)
        result["memscale_version"] = ms.memscale_version().decode()
        ms.memscale_init(1)
        errors0 = ms.memscale_error_count()
        # Open the device in the library with a first allocation, then check its backend.
        p = ms.memscale_malloc(512, 0, None)
        if not p:
            raise RuntimeError(f"first memscale_malloc(512) failed: {ms.memscale_last_error().decode()}")
        ms.memscale_free(p, 512, 0, None)
        cfg = memscale_config(ms)
        devs = cfg.get("devices") or []
        result["memscale_device"] = devs[0] if devs else None
        opened = devs[0].get("backend") if devs else None
        if opened != args.backend:
            raise RuntimeError(f"libmemscale.so opened device 0 with backend {opened!r}, not {args.backend!r}")

        floor = measure(ctypes_floor(), args.min_ms, args.max_samples, args.row_seconds)
        result["ctypes_floor"] = floor
        for size in args.size_list:
            row: dict[str, Any] = {"size": size, "name": size_name(size)}
            row["memscale"] = measure(memscale_pairs(ms, size), args.min_ms, args.max_samples, args.row_seconds)
            if drv is not None and not args.no_cuda_baseline:
                row["cuda"] = measure(cuda_pairs(drv, size), args.min_ms, args.max_samples, args.row_seconds)
                row["speedup"] = round(row["cuda"]["median_ns"] / max(row["memscale"]["median_ns"], 1e-9), 1)
            result["rows"].append(row)
            print(f"  {row['name']:>8}: memscale {row['memscale']['median_ns']:.0f} ns"
                  + (f", cuMemAlloc+cuMemFree {row['cuda']['median_ns']:.0f} ns" if "cuda" in row else ""), flush=True)
        checks = []
        if args.backend == "cuda" and drv is not None:
            for size in args.size_list:
                ptr = ms.memscale_malloc(size, 0, None)
                if not ptr:
                    raise RuntimeError(f"memscale_malloc({size}) failed: {ms.memscale_last_error().decode()}")
                try:
                    checks.append(drv.check_device_pointer(ptr, size))
                finally:
                    ms.memscale_free(ptr, size, 0, None)
            result["device_pointer_checks"] = checks
            if any(c.get("ok") is False for c in checks):
                result["status"] = "failed"
                rc = 1
                print(f"FAIL {STEP}: a memscale pointer failed the device-memory check: {checks}", flush=True)

        if ms.memscale_error_count() != errors0:
            raise RuntimeError(f"errors recorded during the benchmark: {ms.memscale_last_error().decode()}")
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, exit 1
        result["status"] = "failed"
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"FAIL {STEP}: {result['error']}", flush=True)
        rc = 1
    finally:
        if drv is not None:
            drv.close()
    _common.write_json(args.out, result)
    print_table(result)
    return rc


def print_table(result: dict[str, Any]) -> None:
    """Markdown table of the rows."""
    rows = result.get("rows") or []
    if not rows:
        return
    floor = result.get("ctypes_floor", {}).get("median_ns")
    print(f"\nmalloc+free pair through ctypes, ns per pair (backend {result.get('backend')}; ctypes floor {floor} ns per 2 calls)")
    print("| size | memscale median | memscale min | memscale p90 | cuMemAlloc+cuMemFree median | min | p90 | speedup |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r["memscale"]
        c = r.get("cuda") or {}
        print(f"| {r['name']} | {m['median_ns']} | {m['min_ns']} | {m['p90_ns']} | {c.get('median_ns', '-')} | "
              f"{c.get('min_ns', '-')} | {c.get('p90_ns', '-')} | {r.get('speedup', '-')} |")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
