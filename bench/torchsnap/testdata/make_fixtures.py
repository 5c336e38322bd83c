"""Write the snapshot pickles bench/torchsnap's tests read.

    PYTHONPATH=pytorch_plugin .venv/bin/python bench/torchsnap/testdata/make_fixtures.py

- cpu-run.pickle: a real recording by the installed torch (a 2-layer MLP, 2 SGD
  steps on the CPU) through memscale.record_snapshot(device="cpu").
- handmade-p{2,4,5}.pickle: the dict shape of torch.cuda.memory._snapshot()
  (its documented Segment/Block/TraceEntry keys, as _dump_snapshot pickles
  it) with a known history, in pickle protocols 2, 4 and 5:
  two devices, two streams, an alloc freed before the window began, a block
  allocated at the end that the window never saw, a record_stream'ed block
  whose free completes later, and segment/oom/snapshot entries that are not
  replayed. handmade.expected lists the workload the reader must produce.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

import memscale

HERE = Path(__file__).resolve().parent
MIB = 1 << 20


def frames(name: str) -> list[dict]:
    return [{"filename": "train.py", "line": 10, "name": name}]


def entry(action: str, addr: int, size: int, stream: int = 0) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": frames(action)}


def handmade() -> dict:
    s1 = 0x55D0_0000_1000  # a second stream handle
    base = 0x7F00_0000_0000
    trace0 = [
        entry("segment_alloc", base, 2 * MIB),
        entry("alloc", base, 1000),                              # A: id 2 (after the two pre-allocations)
        entry("free_requested", base + 0x100000, 3000),          # freed, allocated before the window -> pre id 1
        entry("free_completed", base + 0x100000, 3000),
        entry("alloc", base + 0x400, 5 * MIB, stream=s1),        # B on stream 1: id 3
        entry("alloc", base + 0x800000, 7000),                   # C: id 4, record_stream'ed
        entry("free_requested", base + 0x800000, 7000),
        entry("free_requested", base, 1000),
        entry("free_completed", base, 1000),                     # free A
        {"action": "oom", "size": 1 << 40, "stream": 0, "device_free": 0, "time_us": 0, "frames": []},
        entry("free_completed", base + 0x800000, 7000),          # free C, completed later
        entry("snapshot", 0, 0),
        entry("alloc", base, 512),                               # D: id 5, reuses A's address
    ]
    trace1 = [entry("alloc", 0x1000, 10), entry("free_completed", 0x1000, 10)]
    segments = [
        {"device": 0, "address": base, "total_size": 20 * MIB, "stream": s1, "segment_type": "large",
         "segment_pool_id": (0, 0), "allocated_size": 5 * MIB + 4096, "active_size": 5 * MIB + 4096,
         "requested_size": 5 * MIB + 4000, "blocks": [
             {"address": base + 0x400, "size": 5 * MIB, "requested_size": 5 * MIB, "state": "active_allocated", "frames": frames("B")},
             {"address": base + 0x600000, "size": 4096, "requested_size": 4000, "state": "active_allocated", "frames": frames("E")},
             {"address": base + 0x601000, "size": MIB, "requested_size": 0, "state": "inactive", "frames": []},
         ]},
        {"device": 1, "address": 0x1000, "total_size": 2 * MIB, "stream": 0, "segment_type": "small",
         "segment_pool_id": (0, 0), "allocated_size": 0, "active_size": 0, "requested_size": 0, "blocks": []},
    ]
    return {"segments": segments, "device_traces": [trace0, trace1],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1}}


# The workload the reader must produce from device 0 of handmade: one line
# per op, "alloc ID STREAM SIZE" or "free ID". Streams are numbered in order
# of appearance. Pre-allocations first: the end-state block E (id 0, on the
# segment's stream s1 -> 0), then the window's early free (id 1, stream 0 -> 1).
EXPECTED = """alloc 0 0 4000
alloc 1 1 3000
alloc 2 1 1000
free 1
alloc 3 0 5242880
alloc 4 1 7000
free 2
free 4
alloc 5 1 512
"""


def cpu_run() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with memscale.record_snapshot(HERE / "cpu-run.pickle", device="cpu"):
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


if __name__ == "__main__":
    snap = handmade()
    for proto in (2, 4, 5):
        with open(HERE / f"handmade-p{proto}.pickle", "wb") as f:
            pickle.dump(snap, f, protocol=proto)
    (HERE / "handmade.expected").write_text(EXPECTED)
    cpu_run()
