"""``unit="auto"`` decides per training step (issue 30, item 3): a model with
blocks and the loss module called after it are one unit of work - the loss
opens no region of its own, so nothing pins what the blocks evict - and the
summary says which unit ``auto`` chose for the steps."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import memscale

from _helpers import require_engine, steady_clock

require_engine()

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _steady_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block call costs the same (the engine's choices depend on the program alone)."""
    steady_clock(monkeypatch)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(x)))


class Classifier(nn.Module):
    """Repeated blocks and a head: logits, the loss is the program's."""

    def __init__(self, classes: int, depth: int = 4, width: int = 64) -> None:
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


#: loss name -> (classes, the loss module, targets of a batch, logits -> the loss's input)
LOSSES: dict[str, tuple[int, Callable[[], nn.Module], Callable[[torch.Generator], torch.Tensor], Callable[[Any], Any]]] = {
    "CrossEntropyLoss": (10, nn.CrossEntropyLoss, lambda g: torch.randint(0, 10, (256,), generator=g), lambda h: h),
    "NLLLoss": (10, nn.NLLLoss, lambda g: torch.randint(0, 10, (256,), generator=g), lambda h: h.log_softmax(-1)),
    "BCELoss": (1, nn.BCELoss, lambda g: torch.rand(256, 1, generator=g), torch.sigmoid),
}


def _train(name: str, model: nn.Module, steps: int = 4, closure: bool = False) -> list[torch.Tensor]:
    """Forward, the loss module, backward and an update per step; what each step produced."""
    _, make_loss, targets, head = LOSSES[name]
    criterion = make_loss()
    opt: torch.optim.Optimizer = (
        torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2) if closure else torch.optim.SGD(model.parameters(), lr=0.05)
    )
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(256, 8, generator=g), targets(g)

        def loss_of() -> torch.Tensor:
            opt.zero_grad()
            loss = criterion(head(model(x)), y)
            loss.backward()
            return loss

        if closure:
            out.append(opt.step(loss_of).detach().clone())  # type: ignore[arg-type, union-attr]
        else:
            out.append(loss_of().detach().clone())
            opt.step()
        out.extend(p.detach().clone() for p in model.parameters())
    return out


def _assert_bitwise(ref: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    assert len(ref) == len(got)
    for i, (a, b) in enumerate(zip(ref, got)):
        assert type(b) is torch.Tensor and torch.equal(a, b), f"value {i}"


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_auto_runs_a_model_with_blocks_and_its_loss_module_as_one_blocks_step(loss: str) -> None:
    torch.manual_seed(0)
    base = Classifier(LOSSES[loss][0])
    ref = _train(loss, copy.deepcopy(base))
    model = copy.deepcopy(base)
    enabled = memscale.enable(memscale.Config(unit="auto", threshold="50%", log_summary=False))
    try:
        got = _train(loss, model)
        regions = enabled._steps.summary()
        blocks = enabled._blocks.summary()
        total = enabled.summary()
    finally:
        enabled.disable()
    _assert_bitwise(ref, got)
    # The loss module opened no region: no region registered (and pinned) the
    # blocks' saved activations when backward reached them.
    assert regions.steps == 0 and regions.peak_usage == 0 and regions.min_budget == 0, regions
    # The blocks held their budget, evicting and recomputing.
    assert blocks.evictions > 0 and blocks.rematerializations > 0, blocks
    assert blocks.bytes_evicted > 0, blocks
    assert blocks.budget is not None and blocks.peak_usage <= blocks.budget, blocks
    # The summary names the choice, one step per training step.
    assert total.unit_steps == {"block": 4, "op": 0} and total.steps == 4, total
    assert "(unit auto: 4 by block-level DTR, 0 by a region per step)" in str(total), str(total)


def test_auto_chooses_per_step_blocks_for_one_model_a_region_for_another() -> None:
    """A model without blocks (trained with the same loss module) gets a region
    per step; the summary counts the steps of each unit."""
    torch.manual_seed(0)
    base, flat_base = Classifier(10), nn.Sequential(nn.Linear(8, 256), nn.Tanh(), nn.Linear(256, 10))
    ref = _train("CrossEntropyLoss", copy.deepcopy(base), steps=3)
    flat_ref = _train("CrossEntropyLoss", copy.deepcopy(flat_base), steps=2)
    model, flat = copy.deepcopy(base), copy.deepcopy(flat_base)
    enabled = memscale.enable(memscale.Config(unit="auto", threshold="1TiB", log_summary=False))
    try:
        got = _train("CrossEntropyLoss", model, steps=3)
        flat_got = _train("CrossEntropyLoss", flat, steps=2)
        total = enabled.summary()
    finally:
        enabled.disable()
    _assert_bitwise(ref, got)
    _assert_bitwise(flat_ref, flat_got)
    assert total.unit_steps == {"block": 3, "op": 2} and total.steps == 5, total


def test_auto_runs_an_optimizer_closure_of_a_model_with_blocks_as_a_blocks_step() -> None:
    """LBFGS's closure (forward, loss module, backward): the closure's first
    forward chooses the unit, as any step's."""
    torch.manual_seed(0)
    base = Classifier(10, depth=3, width=32)
    ref = _train("CrossEntropyLoss", copy.deepcopy(base), steps=2, closure=True)
    model = copy.deepcopy(base)
    enabled = memscale.enable(memscale.Config(unit="auto", threshold="50%", log_summary=False))
    try:
        got = _train("CrossEntropyLoss", model, steps=2, closure=True)
        total = enabled.summary()
        regions = enabled._steps.summary()
    finally:
        enabled.disable()
    _assert_bitwise(ref, got)
    assert regions.steps == 0, regions
    assert total.unit_steps is not None and total.unit_steps["op"] == 0 and total.unit_steps["block"] >= 2, total


_SCRIPT = """
import sys
import torch
from torch import nn
sys.path.insert(0, {tests!r})
from test_auto_steps import Classifier
torch.manual_seed(0)
model, criterion = Classifier(10), nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(3):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(256, 8, generator=g), torch.randint(0, 10, (256,), generator=g)
    opt.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    opt.step()
    print(step, loss.item())
"""


def test_memscale_run_unit_auto_prints_the_unit_it_chose(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(tests=str(Path(__file__).parent)))
    summary = tmp_path / "summary.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch_plugin")}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert plain.returncode == 0, plain.stderr
    run = subprocess.run(
        [sys.executable, "-m", "memscale", "run", "--unit", "auto", "--threshold", "50%", "--summary-json",
         str(summary), str(script)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == plain.stdout
    got = json.loads(summary.read_text())
    assert got["unit_steps"] == {"block": 3, "op": 0} and got["steps"] == 3, got
    assert got["evictions"] > 0, got
    assert "(unit auto: 3 by block-level DTR, 0 by a region per step)" in run.stderr, run.stderr
