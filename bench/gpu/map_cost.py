"""What mapping device memory costs, by the size of a mapping (issue 29 item 2).

The allocator grows by 2 MiB granules, each its own physical handle
(cuMemCreate + cuMemMap + cuMemSetAccess), so that a granule can move between
streams and be remapped alone under a budget. Item 2 asks whether a large
request should instead be mapped with one handle (fewer, larger mappings) and
for which sizes that pays. This measures it on the driver directly (ctypes on
``libcuda.so.1``, nothing of memscale or torch's allocator in between), for
N = 1, 4, 16, 64, 256 granules of the device's granularity:

* ``granules``: N handles of one granule each, mapped side by side into one
  reserved range, each with its own cuMemSetAccess (what the allocator does);
* ``granules_one_access``: the same N handles and maps, one cuMemSetAccess over
  the whole range;
* ``one_handle``: one handle of N granules, one map, one cuMemSetAccess;

and the teardown of each (cuMemUnmap + cuMemRelease). Medians of ``--reps``
repetitions, microseconds per mapping and per granule. Writes ``--out`` (JSON).
Without a CUDA device it prints a skip message and exits 0; ``--dry-run``
checks the arguments and the driver's symbols only where a driver is present.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from typing import Any

import _common

SIZES = (1, 4, 16, 64, 256)


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _Prop(ctypes.Structure):
    """CUmemAllocationProp (cuda.h): pinned device memory on one device."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _Access(ctypes.Structure):
    """CUmemAccessDesc: read-write access for one device."""

    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_MEM_ALLOCATION_TYPE_PINNED = 1
_MEM_LOCATION_TYPE_DEVICE = 1
_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
_MEM_ALLOC_GRANULARITY_MINIMUM = 0


class Driver:
    """The few driver calls this needs, each checked (an error names the call)."""

    NAMES = ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemGetAllocationGranularity",
             "cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
             "cuMemSetAccess")

    def __init__(self, device: int) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        for name in self.NAMES:
            getattr(self.lib, name)  # a missing symbol fails here, by name
        self.lib.cuMemAddressReserve.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_size_t,
                                                 ctypes.c_uint64, ctypes.c_ulonglong]
        self.lib.cuMemAddressFree.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
        self.lib.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.POINTER(_Prop),
                                         ctypes.c_ulonglong]
        self.lib.cuMemRelease.argtypes = [ctypes.c_uint64]
        self.lib.cuMemMap.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64,
                                      ctypes.c_ulonglong]
        self.lib.cuMemUnmap.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
        self.lib.cuMemSetAccess.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER(_Access), ctypes.c_size_t]
        self._check("cuInit", self.lib.cuInit(0))
        dev = ctypes.c_int()
        self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), device))
        ctx = ctypes.c_void_p()
        self._check("cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self._check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctx))
        self.prop = _Prop(type=_MEM_ALLOCATION_TYPE_PINNED, location=_Location(_MEM_LOCATION_TYPE_DEVICE, device))
        self.access = _Access(location=_Location(_MEM_LOCATION_TYPE_DEVICE, device),
                              flags=_MEM_ACCESS_FLAGS_PROT_READWRITE)
        gran = ctypes.c_size_t()
        self._check("cuMemGetAllocationGranularity", self.lib.cuMemGetAllocationGranularity(
            ctypes.byref(gran), ctypes.byref(self.prop), _MEM_ALLOC_GRANULARITY_MINIMUM))
        self.granularity = int(gran.value)

    @staticmethod
    def _check(name: str, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"{name} returned CUresult {rc}")

    def reserve(self, size: int) -> int:
        ptr = ctypes.c_uint64()
        self._check("cuMemAddressReserve", self.lib.cuMemAddressReserve(ctypes.byref(ptr), size, 0, 0, 0))
        return int(ptr.value)

    def free(self, ptr: int, size: int) -> None:
        self._check("cuMemAddressFree", self.lib.cuMemAddressFree(ptr, size))

    def create(self, size: int) -> int:
        handle = ctypes.c_uint64()
        self._check("cuMemCreate", self.lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(self.prop), 0))
        return int(handle.value)

    def map(self, ptr: int, size: int, handle: int) -> None:
        self._check("cuMemMap", self.lib.cuMemMap(ptr, size, 0, handle, 0))

    def set_access(self, ptr: int, size: int) -> None:
        self._check("cuMemSetAccess", self.lib.cuMemSetAccess(ptr, size, ctypes.byref(self.access), 1))

    def unmap_release(self, ptr: int, size: int, handle: int) -> None:
        self._check("cuMemUnmap", self.lib.cuMemUnmap(ptr, size))
        self._check("cuMemRelease", self.lib.cuMemRelease(handle))


def _one(drv: Driver, n: int, way: str) -> tuple[float, float]:
    """Map n granules one ``way`` into a fresh range; (map, teardown) seconds."""
    g = drv.granularity
    base = drv.reserve(n * g)
    try:
        t0 = time.perf_counter()
        if way == "one_handle":
            handles = [(base, n * g, drv.create(n * g))]
            drv.map(base, n * g, handles[0][2])
            drv.set_access(base, n * g)
        else:
            handles = []
            for i in range(n):
                h = drv.create(g)
                drv.map(base + i * g, g, h)
                handles.append((base + i * g, g, h))
                if way == "granules":
                    drv.set_access(base + i * g, g)
            if way == "granules_one_access":
                drv.set_access(base, n * g)
        t1 = time.perf_counter()
        for ptr, size, h in handles:
            drv.unmap_release(ptr, size, h)
        t2 = time.perf_counter()
    finally:
        drv.free(base, n * g)
    return t1 - t0, t2 - t1


def measure(device: int, reps: int) -> dict[str, Any]:
    drv = Driver(device)
    rows = []
    for n in SIZES:
        for way in ("granules", "granules_one_access", "one_handle"):
            maps, tears = [], []
            for _ in range(reps):
                m, t = _one(drv, n, way)
                maps.append(m)
                tears.append(t)
            mu = _common.median(maps) or 0.0
            tu = _common.median(tears) or 0.0
            rows.append({"granules": n, "way": way, "map_us": round(mu * 1e6, 1), "teardown_us": round(tu * 1e6, 1),
                         "map_us_per_granule": round(mu * 1e6 / n, 2), "teardown_us_per_granule": round(tu * 1e6 / n, 2)})
            print(f"{n:4d} x {drv.granularity >> 20} MiB  {way:20s}  map {mu * 1e6:9.1f} us "
                  f"({mu * 1e6 / n:7.2f} per granule)  teardown {tu * 1e6:9.1f} us", flush=True)
    return _common.record("map_cost", status="ok", granularity=drv.granularity, reps=reps, rows=rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dry-run", action="store_true", help="check the arguments and exit")
    a = p.parse_args()
    if a.reps < 1:
        p.error("--reps must be at least 1")
    if a.dry_run:
        print(f"map_cost: would map {', '.join(map(str, SIZES))} granules three ways, {a.reps} reps each", flush=True)
        return 0
    skipped = _common.skip_without_cuda("map_cost", "cuda", a.out)
    if skipped is not None:
        return skipped
    _common.write_json(a.out, measure(a.device, a.reps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
