"""Fork safety: DataLoader workers forked while the Go runtime is busy.

A child forked while another thread is inside the Go runtime can hang when it
calls into Go (golang/go#15538); the library's C fork guard must keep forked
children out of Go. The scenario runs in a fresh interpreter under a timeout so a
hang fails the test instead of blocking the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import memscale
from memscale._native import lib as _lib

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    _lib.unavailable_reason() is not None,
    reason=f"libmemscale.so not built: {_lib.unavailable_reason()}",
)

TIMEOUT_S = 180

SCRIPT = """
import ctypes, sys, threading, time
import torch
from torch.utils.data import DataLoader, Dataset
import memscale
from memscale._native import lib as _lib

lib = _lib.lib()
inherited = lib.memscale_malloc(1 << 20, 0, None)   # a "CUDA tensor" the workers inherit
assert inherited, _lib.last_error()

stop = threading.Event()
calls = [0]
freed_in_this_process = [False]

def hammer():
    # Keep the Go runtime busy (allocating, freeing, reading stats) all the time.
    while not stop.is_set():
        p = lib.memscale_malloc(64 << 10, 0, None)
        if p:
            lib.memscale_free(p, 64 << 10, 0, None)
        if calls[0] % 64 == 0:
            _lib.take_string(lib.memscale_stats_json(0))
        calls[0] += 1

class Data(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        if i % 8 == 0:
            # What a worker does with inherited CUDA state: query and free it.
            # The fork guard must answer at once without entering Go; the
            # results themselves are the library's business.
            lib.memscale_allocated(0)
            if not freed_in_this_process[0]:
                freed_in_this_process[0] = True
                lib.memscale_free(inherited, 1 << 20, 0, None)
            p = lib.memscale_malloc(4096, 0, None)
            if p:
                lib.memscale_free(p, 4096, 0, None)
        return torch.full((8,), float(i))

threads = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
for t in threads:
    t.start()
time.sleep(0.05)
total = 0.0
for epoch in range(4):   # fresh workers each epoch: 8 forks under load
    loader = DataLoader(Data(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    total += sum(float(b.sum()) for b in loader)
stop.set()
for t in threads:
    t.join(timeout=30)
assert total == 4 * 8 * sum(range(32)), total
assert calls[0] > 0
# The parent's library still works after the forks.
lib.memscale_free(inherited, 1 << 20, 0, None)
assert memscale.memory_stats()["allocated_bytes.all.current"] >= 0
print("ok", calls[0])
"""


def test_forked_dataloader_workers_do_not_hang() -> None:
    env = {**os.environ, _lib.LIBRARY_ENV: str(_lib.find_library())}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(memscale.__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(SCRIPT)],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"forked DataLoader workers hung for {TIMEOUT_S}s while the Go runtime was busy "
            f"(fork guard missing or broken?); output so far: {exc.stdout!r} {exc.stderr!r}"
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.startswith("ok"), proc.stdout
