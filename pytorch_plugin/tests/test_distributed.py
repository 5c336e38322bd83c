"""memscale under torch.distributed: 2 processes on the CPU with gloo.

DDP and FSDP2 (``fully_shard``) train 3 steps plainly and under
``memscale.wrap`` with a budget below the step's peak - op-level regions, and
block-level DTR (``Config(unit="block")``) - : losses, gradients and final
parameters bitwise equal, evictions on every rank. Collectives inside a
region are never re-run by one rank alone. ``torchrun -m memscale run`` runs an
unmodified DDP script. Each rank's device comes from its launcher's local rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import memscale
from _helpers import require_engine
from memscale import ConfigError
from memscale._native import lib as _lib
from memscale._allocator.device import LOCAL_RANK_ENVS, local_device

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

SCRIPT = Path(__file__).parent / "scripts" / "dist_steps.py"
#: Below the step's peak (about 9.5 MiB under DDP) so that both runs evict.
BUDGET = 8_000_000


def torchrun(tmp_path: Path, *args: str, memscale_run: bool = False, **env: str) -> list[dict[str, Any]]:
    """Run ``dist_steps.py ARGS`` on 2 gloo ranks; return each rank's records."""
    require_engine()
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path / "rank"
    child_env = {
        **os.environ,
        _lib.LIBRARY_ENV: str(_lib.find_library()),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(memscale.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
        ),
        "OMP_NUM_THREADS": "1",
        **env,
    }
    if "MEMSCALE_EVICTION_THRESHOLD" not in env:
        child_env.pop("MEMSCALE_EVICTION_THRESHOLD", None)
    target = ["-m", "memscale", "run", str(SCRIPT)] if memscale_run else [str(SCRIPT)]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            *target,
            args[0],
            str(out),
            *args[1:],
        ],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    records = [torch.load(f"{out}.{rank}", weights_only=False) for rank in (0, 1)]
    for record in records:
        record["stderr"] = proc.stderr
    return records


def assert_bitwise(plain: list[dict[str, Any]], got: list[dict[str, Any]], what: str) -> None:
    for step, (a, b) in enumerate(zip(plain, got, strict=True)):
        assert torch.equal(a["loss"], b["loss"]), f"{what} step {step}: loss {b['loss']} != {a['loss']}"
        for kind in ("grads", "params"):
            for name, value in a.get(kind, {}).items():
                assert torch.equal(value, b[kind][name]), f"{what} step {step}: {kind} {name} differs"


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return torchrun(tmp_path_factory.mktemp("ddp"), "ddp", str(BUDGET))


@pytest.mark.slow  # two gloo processes
def test_ddp_is_bitwise_and_evicts(ddp_run: list[dict[str, Any]]) -> None:
    for rank, record in enumerate(ddp_run):
        assert_bitwise(record["plain"], record["memscale"], f"DDP rank {rank}")
        assert record["summary"]["evictions"] > 0, record["summary"]
        assert record["summary"]["peak_usage"] <= BUDGET


@pytest.mark.slow  # two gloo processes
def test_fsdp2_is_bitwise_and_evicts(tmp_path: Path) -> None:
    for rank, record in enumerate(torchrun(tmp_path, "fsdp", str(BUDGET))):
        assert_bitwise(record["plain"], record["memscale"], f"FSDP2 rank {rank}")
        assert record["summary"]["evictions"] > 0, record["summary"]
        assert record["summary"]["peak_usage"] <= BUDGET


#: Bytes of block activations: about one of the four blocks' (512 x 256 float32
#: tensors, five saved per block), so that the other three are recomputed.
BLOCKS_BUDGET = 3_000_000


@pytest.mark.slow  # two gloo processes
@pytest.mark.parametrize("kind", ["ddp-blocks", "fsdp-blocks"])
def test_block_level_dtr_under_ddp_and_fsdp2_is_bitwise(tmp_path: Path, kind: str) -> None:
    for rank, record in enumerate(torchrun(tmp_path, kind, str(BLOCKS_BUDGET))):
        assert_bitwise(record["plain"], record["memscale"], f"{kind} rank {rank}")
        summary = record["summary"]
        assert summary["evictions"] > 0 and summary["rematerializations"] > 0, summary


@pytest.mark.slow  # two gloo processes
def test_collectives_are_never_rerun_by_one_rank(tmp_path: Path) -> None:
    # Rank 0 evicts everything it may after every op, rank 1 nothing: a
    # collective rank 0 re-ran would time out or pair with another of rank 1's.
    stressed, unbudgeted = torchrun(tmp_path, "collectives")
    for rank, record in enumerate((stressed, unbudgeted)):
        assert_bitwise(record["plain"], record["memscale"], f"collectives rank {rank}")
    assert stressed["summary"]["rematerializations"] > 0, stressed["summary"]
    assert unbudgeted["summary"]["evictions"] == 0


@pytest.mark.slow  # two gloo processes
def test_torchrun_memscale_run_an_unmodified_ddp_script(tmp_path: Path, ddp_run: list[dict[str, Any]]) -> None:
    records = torchrun(tmp_path, "plain", "ddp", memscale_run=True, MEMSCALE_EVICTION_THRESHOLD=str(BUDGET))
    for rank, record in enumerate(records):
        assert_bitwise(ddp_run[rank]["plain"], record["memscale"], f"memscale run rank {rank}")
    # One summary per rank; split on the marker, not on lines, so the test
    # does not depend on how the ranks' writes to the shared pipe interleave.
    summaries = [(part + "\n").splitlines()[0] for part in records[0]["stderr"].split("memscale: 3 steps")[1:]]
    assert len(summaries) == 2, records[0]["stderr"][-3000:]
    assert all(" 0 evictions" not in line for line in summaries), summaries


@pytest.mark.parametrize(
    ("env", "count", "expected"),
    [
        ({"LOCAL_RANK": "2"}, 4, 2),
        ({"SLURM_LOCALID": "3"}, 4, 3),
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 4, 1),
        ({"LOCAL_RANK": "1", "SLURM_LOCALID": "3"}, 4, 1),  # torchrun's first
        ({"LOCAL_RANK": "5"}, 1, 0),  # one visible device per process
        ({"LOCAL_RANK": "1"}, 0, 0),  # no GPU: the simulated device
        ({}, 4, 0),  # no launcher, CUDA not initialized: the current device
    ],
)
def test_local_device(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], count: int, expected: int) -> None:
    for name in LOCAL_RANK_ENVS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert local_device() == expected


@pytest.mark.parametrize(
    ("value", "count", "fragment"),
    [("x", 4, "LOCAL_RANK='x'"), ("-1", 4, "integer >= 0"), ("3", 2, "sees 2 CUDA devices")],
)
def test_bad_local_rank_is_named(monkeypatch: pytest.MonkeyPatch, value: str, count: int, fragment: str) -> None:
    for name in LOCAL_RANK_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(ConfigError, match=fragment):
        local_device()


@pytest.mark.skipif(not hasattr(torch._C, "_cuda_customAllocator"), reason="torch has no CUDA support")
def test_install_opens_only_the_local_device() -> None:
    from _helpers import run_child

    # torch claims 4 GPUs; the simulated library has one, so opening any other
    # device would fail: install() must open this rank's only.
    proc = run_child(
        """
        import torch, memscale
        torch.cuda.device_count = lambda: 4
        inst = memscale.install(threshold="50%", backend="sim")
        devices = [d["ordinal"] for d in memscale.library_config()["devices"]]
        total = memscale.device_total_memory()
        assert inst.thresholds == {0: total // 2}, (inst.thresholds, total)
        assert devices == [0], devices
        print("ok")
        """,
        LOCAL_RANK="0",
        MEMSCALE_BACKEND=None,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
