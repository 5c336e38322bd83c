"""``memscale.check`` and the stress setting: a model that is safe under DTR
is reported safe (bitwise, every rebuild verified); an op whose re-run
differs is named, with the module it ran in; the model is left as it was."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _helpers import require_engine

torch = pytest.importorskip("torch")
require_engine()

import memscale  # noqa: E402
from memscale import ConfigError  # noqa: E402
from memscale import check  # noqa: E402

_counter = itertools.count(1)


@torch.library.custom_op("memscale_test::impure_scale", mutates_args=())
def _impure_scale(x: torch.Tensor) -> torch.Tensor:
    """Scales by a number that changes on every call: never the same twice."""
    return x * float(next(_counter))


@_impure_scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


_impure_scale.register_autograd(lambda ctx, grad: grad)


class _Block(torch.nn.Module):
    def __init__(self, impure: bool) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(4)
        self.impure = impure

    def forward(self, x: Any) -> Any:
        h = self.norm(self.conv(x)).relu()
        if self.impure:
            h = _impure_scale(h)
        return torch.nn.functional.dropout(h, 0.1) + x


def _model(impure: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(_Block(False), _Block(impure), torch.nn.Flatten(), torch.nn.Linear(4 * 16 * 16, 3))


def test_a_safe_model_is_reported_safe_and_left_as_it_was() -> None:
    model = _model()
    x = torch.randn(8, 4, 16, 16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = check(model, x)
    assert report.safe, str(report)
    assert report.evictions > 0 and report.rematerializations > 0
    assert "safe under DTR" in str(report)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # running stats put back
    assert all(p.grad is None for p in model.parameters())


def test_a_step_function_is_checked_too() -> None:
    model = _model()
    x = torch.randn(8, 4, 16, 16)
    report = check(lambda inp: model(inp).square().mean(), x, params=dict(model.named_parameters()))
    assert report.safe, str(report)


def test_an_op_whose_rerun_differs_is_named_with_its_module() -> None:
    report = check(_model(impure=True), torch.randn(8, 4, 16, 16))
    assert not report.safe
    assert report.error is not None and "impure_scale" in report.error
    assert report.where.endswith("1"), report.where  # the second block: Sequential.1
    assert "NOT safe" in str(report) and "impure_scale" in str(report)


def test_the_stress_setting_evicts_everything_and_stays_bitwise() -> None:
    model = _model()
    x = torch.randn(8, 4, 16, 16)
    torch.manual_seed(1)
    ref = model(x).square().mean()
    ref.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    region = memscale.dtr(stress=True)
    torch.manual_seed(1)
    with region:
        loss = model(x).square().mean()
        loss.backward()
    assert torch.equal(memscale.unwrap(loss), ref)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), ref_grads))
    s = region.summary()
    assert s["evictions"] > 0 and s["budget"] == 0 and s["budget_source"] == "dtr(stress=True)"
    assert 0 < s["min_budget"] <= s["peak_usage"]


def test_stress_takes_no_budget() -> None:
    with pytest.raises(ConfigError, match="stress"):
        memscale.dtr(1 << 20, stress=True)
    with pytest.raises(ConfigError, match="stress"):
        memscale.dtr(stress="yes")  # type: ignore[arg-type]


_SCRIPT = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(16, 32)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("finished", flush=True)
"""


def test_the_cli_checks_a_scripts_first_steps(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(Path(memscale.__file__).parent.parent))
    done = subprocess.run(
        [sys.executable, "-m", "memscale", "check", "--steps", "2", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "safe under DTR" in done.stderr
    assert "finished" not in done.stdout  # stopped after the checked steps
