"""Budgets below what a step can run at (issue 30, item 4): a run never goes over
its budget before raising, the error names the step's minimum budget and the
summaries report that same minimum; and a region makes plain the gradients a
backward through an earlier graph accumulates (a GAN's generator)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import is_plain_tensor, is_region_tensor, region_kind, require_engine

torch = pytest.importorskip("torch")

import memscale  # noqa: E402
from memscale._native.engine import NoRoomError  # noqa: E402

require_engine()

MB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _named_minimum(message: str) -> float:
    """The step's minimum budget an error names (bytes, to its 0.1 precision)."""
    m = re.search(r"the step's minimum budget (?:\(a lower bound\) )?so far is ([0-9.]+) (B|KiB|MiB|GiB)", message)
    assert m, message
    return float(m.group(1)) * _UNITS[m.group(2)]


# --- what leaves a step -------------------------------------------------------


def test_what_leaves_a_step_must_fit_its_budget_the_exit_raises_before_going_over() -> None:
    x = torch.randn(MB // 4)  # 1 MiB, pinned at registration
    region = memscale.dtr(budget=3 * MB, heuristic="lru")
    kept = []
    with pytest.raises(NoRoomError, match="is below what leaves this step") as err:
        with region:
            for k in range(4):  # 4 MiB of results: each is evicted to make room for the next
                kept.append(x * float(k + 2))
    stats = err.value.stats  # type: ignore[attr-defined]
    assert stats["peak_usage"] <= 3 * MB, "never over the budget before raising"
    named = _named_minimum(str(err.value))
    assert named >= 5 * MB - 0.06 * MB  # x + the four results
    assert abs(stats["min_budget"] - named) < 0.06 * MB, "the summaries report the minimum the error names"
    assert "\n" not in str(err.value)


def test_what_leaves_a_step_within_its_budget_is_handed_back() -> None:
    x = torch.randn(MB // 4)
    region = memscale.dtr(budget=3 * MB, heuristic="lru")
    with region:
        kept = [x * float(k + 2) for k in range(4)]
        del kept[:2]  # two results leave: x + 2 MiB fit
    assert all(is_plain_tensor(t) for t in kept)
    assert torch.equal(kept[1], x * 5.0)
    assert region.summary()["peak_usage"] <= 3 * MB


# --- the minimum a failed step reports ----------------------------------------


def test_a_failed_step_reports_the_minimum_its_error_names() -> None:
    x = torch.randn(MB // 4)  # 1 MiB pinned
    region = memscale.dtr(budget=MB + MB // 2)
    with pytest.raises(NoRoomError) as err:
        with region:
            y = x * 2.0  # 1 MiB more than fits: 2 MiB at this point
            del y
    named = _named_minimum(str(err.value))
    assert named == pytest.approx(2 * MB, rel=0.03)
    assert abs(region.summary()["min_budget"] - named) < 0.06 * MB


def test_memscale_run_reports_the_minimum_its_error_names(tmp_path: Path) -> None:
    script = tmp_path / "keep.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(256, 256)\n"
        "kept = []\n"
        "for step in range(3):\n"
        "    x = torch.randn(512, 256)\n"
        "    h = [model(x) for _ in range(4)]  # four 512 KiB results, all kept\n"
        "    sum(t.sum() for t in h).backward()\n"
        "    kept.append(h)\n"
    )
    summary = tmp_path / "summary.json"
    env = {"PYTHONPATH": str(ROOT / "pytorch_plugin"), "MEMSCALE_NATIVE": "0"}
    import os

    run = subprocess.run(
        [sys.executable, "-m", "memscale", "run", "--threshold", str(2 * MB), "--summary-json", str(summary),
         str(script)],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=300,
    )
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("memscale: error:")]
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    import json

    got = json.loads(summary.read_text())
    assert got["peak_usage"] <= 2 * MB, "never over the budget before raising"
    named = _named_minimum(lines[0])
    assert "what leaves this step" in lines[0], lines[0]
    assert abs(got["min_budget"] - named) < 0.06 * MB, (got["min_budget"], lines[0])


# --- gradients of a graph an earlier entry built -------------------------------


@pytest.mark.parametrize("where", ["an earlier entry", "outside any region"])
def test_a_region_makes_plain_the_gradients_of_a_graph_built_before_it(where: str) -> None:
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    disc = torch.nn.Linear(4, 1)
    z = torch.randn(3, 4)
    region = memscale.dtr(None)
    if where == "an earlier entry":
        with region:
            fake = gen(z)
    else:
        fake = gen(z)
    with region:
        disc(fake).sum().backward()  # nothing of this entry reads the generator's biases or first weight
    kinds = {name: (type(p.grad), region_kind(p.grad)) for name, p in gen.named_parameters()}
    assert all(kind == (torch.Tensor, "plain") for kind in kinds.values()), kinds
    assert not any(is_region_tensor(p.grad) for p in disc.parameters())
    # the same gradients as plainly
    torch.manual_seed(0)
    gen2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    disc2 = torch.nn.Linear(4, 1)
    disc2(gen2(torch.randn(3, 4))).sum().backward()
    for p, q in zip(gen.parameters(), gen2.parameters()):
        assert torch.equal(p.grad, q.grad)
