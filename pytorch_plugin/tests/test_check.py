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


class _DrawsFromNumpyAndRandom(torch.nn.Module):
    """Drops features by masks drawn from NumPy's and Python's global
    generators (as wav2vec2's time masks are): not torch's."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: Any) -> Any:
        import random

        np = pytest.importorskip("numpy")
        keep = torch.from_numpy(np.random.rand(16) > 0.3).to(x.dtype)
        return (self.lin(x) * keep * random.random()).relu()


def test_models_drawing_from_numpy_and_python_random_are_seeded_alike() -> None:
    import random

    np = pytest.importorskip("numpy")
    torch.manual_seed(0)
    model = _DrawsFromNumpyAndRandom()
    np_before, py_before = np.random.get_state()[1].copy(), random.getstate()
    report = check(model, torch.randn(8, 16))
    assert report.safe and not report.unstable, str(report)
    assert (np.random.get_state()[1] == np_before).all() and random.getstate() == py_before, "generators put back"


class _SeedsItselfFromTheOS(torch.nn.Module):
    """Reformer-style: a fresh seed from the operating system's entropy every
    forward (``torch.seed()``), so no two runs agree."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: Any) -> Any:
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        noise = torch.rand(16, generator=g)
        return torch.tanh(self.lin(x) * noise) * 2


def test_a_step_that_differs_from_itself_is_judged_by_its_verified_rebuilds() -> None:
    torch.manual_seed(0)
    report = check(_SeedsItselfFromTheOS(), torch.randn(8, 16))
    assert report.safe, str(report)
    assert "loss" in report.unstable and not report.differences
    assert report.rematerializations > 0
    assert "not deterministic by itself" in str(report) and "as far as rebuilds tell" in str(report)


def test_an_impure_op_in_a_step_that_differs_from_itself_is_still_caught() -> None:
    """Unstable results do not hide a rebuild that differed."""

    class Both(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.noisy = _SeedsItselfFromTheOS()
            self.body = _model(impure=True)

        def forward(self, x: Any) -> Any:
            return self.body(x) + self.noisy(x.flatten(1)[:, :16]).sum()

    report = check(Both(), torch.randn(8, 4, 16, 16))
    assert not report.safe and report.error is not None and "impure_scale" in report.error


def test_the_module_tracker_cannot_break_the_checked_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch's module tracker raises where it cannot hook a module's
    tensors for backward (Reformer's reversible layers); the check runs on."""
    import torch.utils.module_tracker as tracker

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Expected gradient function to be set")

    monkeypatch.setattr(tracker, "register_multi_grad_hook", refuse)
    report = check(_model(), torch.randn(8, 4, 16, 16))
    assert report.safe, str(report)


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
