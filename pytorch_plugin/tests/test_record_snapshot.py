"""memscale.record_snapshot: a run's allocations as a PyTorch memory snapshot pickle.

Without a GPU the CPU path runs: torch.profiler's allocation events written in the
shape torch.cuda.memory._dump_snapshot writes, which torch's own viewer renders.
"""

from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")

import memscale  # noqa: E402
from memscale import MemscaleError  # noqa: E402


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    loss = model(x).pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def test_cpu_recording_has_the_snapshot_shape(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    keep = None
    path = tmp_path / "snap.pickle"
    with memscale.record_snapshot(path, device="cpu"):
        _step(model, opt, x)
        keep = torch.empty(12345, dtype=torch.uint8)  # still allocated at the end
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert set(snap) >= {"segments", "device_traces"}
    (trace,) = snap["device_traces"]
    actions = {e["action"] for e in trace}
    assert actions == {"alloc", "free_requested", "free_completed"}
    for e in trace:
        assert e["size"] > 0 and e["addr"] > 0 and e["stream"] == 0
        assert e["frames"] and "name" in e["frames"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert any(e["size"] == 16 * 64 * 4 for e in allocs), "the hidden activation (16x64 float32) is recorded"
    live_blocks = [b for s in snap["segments"] for b in s["blocks"]]
    assert any(b["size"] == 12345 and b["state"] == "active_allocated" for b in live_blocks)
    assert keep is not None
    # torch's own viewer renders it.
    from torch.cuda import _memory_viz

    assert "<html" in _memory_viz.trace_plot(snap).lower()


def test_written_when_the_block_raises(tmp_path):
    path = tmp_path / "snap.pickle"
    with pytest.raises(ValueError, match="boom"):
        with memscale.record_snapshot(path, device="cpu"):
            torch.ones(1000)
            raise ValueError("boom")
    assert pickle.loads(path.read_bytes())["device_traces"]


def test_max_entries_keeps_the_newest(tmp_path):
    path = tmp_path / "snap.pickle"
    with memscale.record_snapshot(path, device="cpu", max_entries=5):
        for _ in range(10):
            torch.ones(4096)
    assert len(pickle.loads(path.read_bytes())["device_traces"][0]) == 5


def test_bad_device(tmp_path):
    with pytest.raises(MemscaleError, match="want 'cuda', 'cpu' or None"):
        with memscale.record_snapshot(tmp_path / "x.pickle", device="tpu"):
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_native_history(tmp_path):
    path = tmp_path / "snap.pickle"
    with memscale.record_snapshot(path):
        torch.ones(1 << 20, device="cuda")
    snap = pickle.loads(path.read_bytes())
    assert any(e["action"] == "alloc" for e in snap["device_traces"][0])


def test_python_m_memscale_record(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "m = torch.nn.Linear(16, 16)\n"
        "m(torch.randn(8, 16)).sum().backward()\n"
        "sys.exit(3)\n"
    )
    from memscale._cli import main

    out = tmp_path / "snap.pickle"
    assert main(["record", "--device", "cpu", str(out), str(script)]) == 3
    snap = pickle.loads(out.read_bytes())
    assert any(e["action"] == "alloc" and e["size"] == 8 * 16 * 4 for e in snap["device_traces"][0])
