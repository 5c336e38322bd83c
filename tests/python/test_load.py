"""Loads libmemscale.so with ctypes the way PyTorch's CUDAPluggableAllocator
does (ctypes.CDLL with default flags, i.e. immediate binding) and calls the
allocator ABI on the sim backend. Standard library only, besides pytest.

The library is $MEMSCALE_LIBRARY, else build/libmemscale.so in the repository;
the tests skip when it is absent.
"""

import ctypes
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = os.environ.get("MEMSCALE_LIBRARY") or str(REPO / "build" / "libmemscale.so")

pytestmark = pytest.mark.skipif(
    not os.path.exists(LIBRARY),
    reason=f"{LIBRARY} not built (run make, or set MEMSCALE_LIBRARY)",
)

# The library reads its configuration once, at first use, from the process
# environment; the in-process tests run on a small simulated card.
SIM_ENV = {"MEMSCALE_BACKEND": "sim", "MEMSCALE_SIM_CAPACITY": "1GiB", "MEMSCALE_LOG_LEVEL": "error"}


def _bind(lib):
    """Declares the argument and result types of the exports used here."""
    c = ctypes
    lib.memscale_malloc.argtypes = [c.c_ssize_t, c.c_int, c.c_void_p]
    lib.memscale_malloc.restype = c.c_void_p
    lib.memscale_free.argtypes = [c.c_void_p, c.c_ssize_t, c.c_int, c.c_void_p]
    lib.memscale_free.restype = None
    lib.memscale_stats_json.argtypes = [c.c_int]
    lib.memscale_stats_json.restype = c.c_void_p  # freed with memscale_string_free
    lib.memscale_config_json.argtypes = []
    lib.memscale_config_json.restype = c.c_void_p
    lib.memscale_string_free.argtypes = [c.c_void_p]
    lib.memscale_string_free.restype = None
    lib.memscale_last_error.argtypes = []
    lib.memscale_last_error.restype = c.c_char_p
    lib.memscale_error_count.argtypes = []
    lib.memscale_error_count.restype = c.c_int
    lib.memscale_allocated.argtypes = [c.c_int]
    lib.memscale_allocated.restype = c.c_int64
    lib.memscale_version.argtypes = []
    lib.memscale_version.restype = c.c_char_p
    return lib


def _take_string(lib, ptr):
    """Copies and frees a char* returned by the library."""
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        lib.memscale_string_free(ptr)


@pytest.fixture(scope="module")
def lib():
    # Set the variables only while this module runs: later tests (and the
    # subprocesses they start) must see the caller's environment.
    with pytest.MonkeyPatch.context() as mp:
        for k, v in SIM_ENV.items():
            if k not in os.environ:
                mp.setenv(k, v)
        yield _bind(ctypes.CDLL(LIBRARY))


def test_load_and_version(lib):
    assert lib.memscale_version().decode().startswith("memscale ")


def test_pluggable_allocator_symbols_exist(lib):
    for name in ["memscale_malloc", "memscale_free", "memscale_init", "memscale_empty_cache",
                 "memscale_set_memory_fraction", "memscale_record_stream"]:
        assert ctypes.cast(getattr(lib, name), ctypes.c_void_p).value, name


def test_malloc_free_stats(lib):
    before = lib.memscale_error_count()
    size = 3 << 20
    ptr = lib.memscale_malloc(size, 0, None)
    assert ptr, lib.memscale_last_error()
    # Sim device memory is host memory: it can be written and read back.
    ctypes.memset(ptr, 0x5A, size)
    assert ctypes.string_at(ptr + size - 4, 4) == b"\x5a" * 4
    assert lib.memscale_allocated(0) >= size

    stats = json.loads(_take_string(lib, lib.memscale_stats_json(0)))
    assert stats["requested_bytes.all.current"] == size
    assert stats["allocated_bytes.all.current"] >= size
    for key in ["reserved_bytes.all.peak", "active_bytes.all.current", "num_ooms"]:
        assert key in stats

    lib.memscale_free(ptr, size, 0, None)
    assert lib.memscale_allocated(0) == 0
    assert lib.memscale_error_count() == before, lib.memscale_last_error()

    cfg = json.loads(_take_string(lib, lib.memscale_config_json()))
    assert cfg["backend"] == "sim"
    assert cfg["devices"][0]["total_memory"] == 1 << 30


def test_bad_free_is_an_error_not_a_crash(lib):
    before = lib.memscale_error_count()
    lib.memscale_free(0xDEAD0000, 16, 0, None)
    assert lib.memscale_error_count() == before + 1
    assert b"0xdead0000" in lib.memscale_last_error()


_BAD_ENV_SCRIPT = textwrap.dedent(
    """
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    lib.memscale_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.memscale_malloc.restype = ctypes.c_void_p
    lib.memscale_last_error.restype = ctypes.c_char_p
    ptr = lib.memscale_malloc(4096, 0, None)
    print("PTR", ptr)
    print("ERR", lib.memscale_last_error().decode())
    """
)


def test_bad_env_var_fails_malloc_with_named_variable():
    env = dict(os.environ, **SIM_ENV, MEMSCALE_EVICTION_THRESHOLD="banana")
    out = subprocess.run(
        [sys.executable, "-c", _BAD_ENV_SCRIPT, LIBRARY],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert "PTR None" in out
    err = next(line for line in out.splitlines() if line.startswith("ERR "))
    assert "MEMSCALE_EVICTION_THRESHOLD" in err
    assert "banana" in err
    assert "GiB" in err and "%" in err  # says what is accepted
