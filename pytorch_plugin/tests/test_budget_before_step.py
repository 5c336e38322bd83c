"""A budget below what a step needs fails before the step runs (issue 30, item
4): a step measured the floor of its shapes (the baseline step a percentage on
the CPU runs first), and a later step of those shapes under a lower budget
raises :class:`BudgetBelowFloorError` at its first forward - no op of it ran -
in one line naming the least threshold, which trains."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import memscale
from memscale._dropin.floors import MEASURED_STEPS
from memscale._native.engine import NoRoomError
from memscale.errors import BudgetBelowFloorError

from _helpers import require_engine, steady_clock

require_engine()

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _steady_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every op costs the same (the engine's choices depend on the program alone)."""
    steady_clock(monkeypatch)


def _LAYERS() -> list[nn.Module]:
    return [nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
            nn.Linear(256, 1)]


def _model() -> nn.Module:
    """Three hidden layers: a ReLU's backward (gradient, output and input
    gradient, 512 KiB each) with what is pinned is more than half of the
    step's peak and less than all of it."""
    torch.manual_seed(0)
    return nn.Sequential(*_LAYERS())


def _train(model: nn.Module, steps: int = 3, shape: tuple[int, ...] = (512, 64)) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = []
    for step in range(steps):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        out.append(loss.detach().clone())
        out.extend(p.detach().clone() for p in model.parameters())
    return out


def test_a_step_below_its_measured_floor_fails_before_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSCALE_EVICTION_THRESHOLD", "50%")  # of the first step's measured peak (no GPU)
    model = _model()
    calls = []
    model[0].register_forward_pre_hook(lambda m, a: calls.append(1))
    enabled = memscale.enable(memscale.Config(heuristic="lru", log_summary=False))
    try:
        with pytest.raises(BudgetBelowFloorError) as err:
            _train(model)
        assert len(calls) == MEASURED_STEPS, "the third step's first forward raised before any module of it ran"
        assert not enabled._steps.is_open
        summary = enabled.summary()
    finally:
        enabled.disable()
    message = str(err.value)
    assert "\n" not in message
    assert summary.steps == MEASURED_STEPS and summary.budget is not None and summary.budget < err.value.floor
    assert summary.peak_usage == 0, "no budgeted step ran: nothing went over the budget"
    assert err.value.floor == summary.min_budget, "the floor is the one the summary reports"
    least = err.value.least
    assert err.value.floor <= least < summary.baseline_peak
    assert f"The least threshold that works: MEMSCALE_EVICTION_THRESHOLD={least}" in message, message
    assert re.search(r"step [12], with the same argument shapes, ran whole", message), message
    assert "this one was not started" in message and "threshold_backward" in message, message
    assert re.search(r"a replay of step [12]'s recorded program finished", message), message
    assert "the headroom for later steps" in message, message


def _refused_then_trained(
    monkeypatch: pytest.MonkeyPatch, threshold: str, train: Callable[[nn.Module], list[torch.Tensor]]
) -> tuple[int, list[torch.Tensor], list[torch.Tensor], Any]:
    """``train`` under ``threshold`` is refused before a step; returns the least
    threshold the error named, a plain run's results, the results of a run at
    that threshold and its summary."""
    monkeypatch.setenv("MEMSCALE_EVICTION_THRESHOLD", threshold)
    enabled = memscale.enable(memscale.Config(heuristic="lru", log_summary=False))
    try:
        with pytest.raises(BudgetBelowFloorError) as err:
            train(_model())
    finally:
        enabled.disable()
    named = err.value.least
    ref = train(_model())
    monkeypatch.setenv("MEMSCALE_EVICTION_THRESHOLD", str(named))
    enabled = memscale.enable(memscale.Config(heuristic="lru", untracked_steps=False, log_summary=False))
    try:
        got = train(_model())
        summary = enabled.summary()
    finally:
        enabled.disable()
    return named, ref, got, summary


def test_the_least_threshold_the_error_names_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    floor, ref, got, summary = _refused_then_trained(monkeypatch, "50%", _train)
    assert summary.steps == 3 and summary.budget == floor and summary.peak_usage <= floor, summary
    assert summary.evictions > 0, summary
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


def test_a_step_of_other_shapes_is_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor is per step shape: a smaller batch is not refused by a larger one's floor."""
    monkeypatch.setenv("MEMSCALE_EVICTION_THRESHOLD", "50%")
    model = _model()
    enabled = memscale.enable(memscale.Config(heuristic="lru", log_summary=False))
    try:
        model(torch.randn(512, 64)).square().mean().backward()  # the baseline: budget half its peak
        model(torch.randn(512, 64)).square().mean().backward()  # the shape's second step: measured too
        for _ in range(MEASURED_STEPS + 1):
            model(torch.randn(16, 64)).square().mean().backward()  # 32x smaller: measured twice, then fits
        with pytest.raises(BudgetBelowFloorError):
            model(torch.randn(512, 64)).square().mean().backward()
        assert enabled.summary().steps == 2 + MEASURED_STEPS + 1
    finally:
        enabled.disable()


def _encoder() -> nn.Module:
    """Two Transformer encoder layers: at its measured floor a rebuild plan
    holds its inputs (which the floor does not count) and the step stops."""
    torch.manual_seed(0)
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0), 2, enable_nested_tensor=False)


def _enabled_at(monkeypatch: pytest.MonkeyPatch, threshold: str) -> Any:
    monkeypatch.setenv("MEMSCALE_EVICTION_THRESHOLD", threshold)
    return memscale.enable(memscale.Config(log_summary=False, untracked_steps=False))


def test_the_threshold_named_trains_where_the_floor_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor (the engine's lower bound) is not always a budget that works:
    the threshold the error names is one a replay of the measured step's
    program finished at, searched upward from the floor - and it trains."""
    enabled = _enabled_at(monkeypatch, "1%")
    try:
        with pytest.raises(BudgetBelowFloorError) as err:
            _train(_encoder(), shape=(16, 8, 32))
    finally:
        enabled.disable()
    floor, least = err.value.floor, err.value.least
    assert floor < least < 1.5 * floor, (floor, least)
    assert f"The least threshold that works: MEMSCALE_EVICTION_THRESHOLD={least} " in str(err.value)
    assert "and a replay of its recorded program ran out of room at" in str(err.value)
    ref = _train(_encoder(), shape=(16, 8, 32))
    # at the floor the step stops partway (why the floor alone is not named) ...
    enabled = _enabled_at(monkeypatch, str(floor))
    try:
        with pytest.raises(NoRoomError):
            _train(_encoder(), shape=(16, 8, 32))
    finally:
        enabled.disable()
    # ... at the threshold named it trains, bitwise, within it
    enabled = _enabled_at(monkeypatch, str(least))
    try:
        got = _train(_encoder(), shape=(16, 8, 32))
        summary = enabled.summary()
    finally:
        enabled.disable()
    assert summary.steps == 3 and summary.peak_usage <= least and summary.evictions > 0, summary
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


def test_the_error_names_the_least_a_replay_finished_at_and_where_one_failed() -> None:
    """Below the floor the error names the least threshold the search found
    and the largest budget a replay failed at; between the floor and that
    budget the step runs (a replay that ran out of room does not prove the
    region would: the region parks, the replay does not)."""
    from memscale._dropin.floors import Floors, Least

    floors, model = Floors(), nn.Linear(4, 4)
    shape = Floors.shape(model, ((torch.randn(8, 4),), {}), None)
    assert not floors.known(shape, model)
    floors.measured(shape.key, model, 1000, 1, True, {}, least=Least(1100, 1080, True, 4))
    assert not floors.known(shape, model) and floors.measuring(shape, model), "the second step is measured too"
    floors.measured(shape.key, model, 1000, 2, True, {}, least=Least(1050, 1040, True, 3))
    assert floors.known(shape, model) and not floors.measuring(shape, model)
    # the highest least found over the steps searched (step 1's), with where it was found
    named = r"ran out of room at 1\.05 KiB; this one was not started. The least threshold that works: a budget of 1100 "
    with pytest.raises(BudgetBelowFloorError, match=named + r"bytes \(1\.07 KiB, 1\.100x that floor: a replay of step 1's") as err:
        floors.check(shape, model, 999, "test")
    assert (err.value.floor, err.value.least) == (1000, 1100)
    floors.check(shape, model, 1000, "test")  # at the floor: runs
    floors.check(shape, model, 1050, "test")
    # a later step of the shape with a lower floor keeps the least found
    floors.measured(shape.key, model, 900, 2, True, {})
    with pytest.raises(BudgetBelowFloorError, match="at least 900 B: step 2") as err:
        floors.check(shape, model, 899, "test")
    assert err.value.least == 1100


def test_a_step_of_shapes_no_step_measured_is_measured_before_the_budget_applies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the CPU a percentage is of the first step's measured peak; a later
    step of other shapes (a GAN's generator step after the discriminator's)
    ran under that budget unmeasured and stopped partway, with no threshold
    that works to name. Now the first step of new shapes is measured the same
    way (unbudgeted), and the next step of its shapes is refused before it
    starts, naming the least threshold for every shape measured."""
    monkeypatch.setenv("MEMSCALE_EVICTION_THRESHOLD", "50%")
    torch.manual_seed(0)
    small, big = nn.Linear(64, 1), _model()
    calls: list[int] = []
    big[0].register_forward_pre_hook(lambda m, a: calls.append(1))
    x = torch.randn(512, 64)
    enabled = memscale.enable(memscale.Config(heuristic="lru", log_summary=False))
    try:
        small(torch.randn(8, 64)).sum().backward()  # the first step: its peak sets the budget
        for _ in range(MEASURED_STEPS):
            big(x).square().mean().backward()  # new shapes: measured, whole
        assert len(calls) == MEASURED_STEPS
        with pytest.raises(BudgetBelowFloorError) as err:
            big(x).square().mean().backward()
        assert len(calls) == MEASURED_STEPS, "refused at its first forward, before any module of it ran"
        summary = enabled.summary()
    finally:
        enabled.disable()
    message = str(err.value)
    assert "\n" not in message and "this one was not started" in message, message
    assert re.search(r"step [23], with the same argument shapes, ran whole", message), message
    assert summary.steps == 1 + MEASURED_STEPS and summary.peak_usage == 0, "no step ran under the budget"
    assert summary.budget is not None and summary.budget < err.value.floor <= err.value.least


def test_an_optimizer_closures_steps_are_checked_before_they_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """LBFGS calls its closure (a forward and backward: a step) several times
    per update; under ``enable()`` no module opens those steps, so no floor was
    kept for them and the second ran under the budget until it stopped. Their
    floors are kept under the optimizer now."""
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(0))
    calls: list[int] = []
    model[0].register_forward_pre_hook(lambda m, a: calls.append(1))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    enabled = _enabled_at(monkeypatch, "1%")
    try:
        with pytest.raises(BudgetBelowFloorError) as err:
            opt.step(closure)  # type: ignore[no-untyped-call]
        summary = enabled.summary()
    finally:
        enabled.disable()
    assert len(calls) == MEASURED_STEPS and summary.steps == MEASURED_STEPS and summary.peak_usage == 0, summary
    assert "this training step of LBFGS needs" in str(err.value), str(err.value)
    assert "The least threshold that works: MEMSCALE_EVICTION_THRESHOLD=" in str(err.value)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_step_that_stops_partway_leaves_the_model_as_it_found_it(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A threshold in bytes gives the first step no floor to be checked
    against: it stops where it does not fit. Its forward had updated batch
    norm's running statistics and its backward some gradients; they are put
    back, so a program that retries with a larger budget trains as plainly."""

    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 256),
                             nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 1))

    def step(model: nn.Module) -> list[torch.Tensor]:
        x = torch.randn(512, 64, generator=torch.Generator().manual_seed(0))
        model(x).square().mean().backward()
        return [t.detach().clone() for t in [*model.parameters(), *model.buffers()]] + [
            p.grad.clone() for p in model.parameters() if p.grad is not None]

    ref = step(make())
    model = make()
    model[0].weight.grad = torch.ones_like(model[0].weight)  # accumulated before: put back as it was
    before = [t.detach().clone() for t in model.buffers()]
    # forward: the parameters and input fit, the activations do not; backward: the forward fits
    enabled = _enabled_at(monkeypatch, "700KiB" if where == "forward" else "1800KiB")
    try:
        with pytest.raises(NoRoomError) as err:
            step(model)
    finally:
        enabled.disable()
    stopped_in = "backward" if "backward" in str(err.value) else "forward"
    assert stopped_in == where, str(err.value)
    assert "were undone: running it again does not count them twice" in str(err.value)
    assert all(torch.equal(a, b) for a, b in zip(before, model.buffers(), strict=True)), "running statistics as before"
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    assert all(p.grad is None for name, p in model.named_parameters() if name != "0.weight")
    model[0].weight.grad = None
    enabled = _enabled_at(monkeypatch, "1TiB")
    try:
        got = step(model)
    finally:
        enabled.disable()
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


_SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(step))
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    print(step, loss.item(), flush=True)
"""


def _run(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object] | None]:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    summary = tmp_path / "summary.json"
    summary.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSCALE_") or k == "MEMSCALE_LIBRARY"}
    env.update(PYTHONPATH=str(ROOT / "pytorch_plugin"), MEMSCALE_HEURISTIC="lru", MEMSCALE_NATIVE="0")
    cmd = [sys.executable, "-m", "memscale", "run", *flags, "--summary-json", str(summary), str(script)]
    if not flags:
        cmd = [sys.executable, str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    return proc, json.loads(summary.read_text()) if summary.exists() else None


def test_memscale_run_below_the_floor_is_one_line_before_the_step_and_its_threshold_trains(tmp_path: Path) -> None:
    plain, _ = _run(tmp_path)
    assert plain.returncode == 0, plain.stderr
    half, summary = _run(tmp_path, "--threshold", "50%")
    assert half.returncode == 2, half.stderr
    errors = [line for line in half.stderr.splitlines() if line.startswith("memscale: error:")]
    assert len(errors) == 1 and "Traceback" not in half.stderr, half.stderr
    assert half.stdout == "".join(plain.stdout.splitlines(keepends=True)[:MEASURED_STEPS]), "only the measured steps ran"
    m = re.search(r"The least threshold that works: --threshold (\d+) ", errors[0])
    assert m, errors[0]
    floor = int(m.group(1))
    assert summary is not None and summary["min_budget"] <= floor and summary["peak_usage"] == 0, summary
    ok, summary = _run(tmp_path, "--threshold", str(floor))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == plain.stdout
    assert summary is not None and summary["peak_usage"] <= floor and summary["evictions"] > 0, summary


def test_a_floor_measured_without_keyword_arguments_bounds_only_steps_without_keyword_tensors() -> None:
    """The first step's keyword arguments are not seen: its floor is no bound
    for a step whose keyword tensors may have other shapes (``model(**batch)``
    with dynamic padding)."""
    from memscale._dropin.floors import Floors

    floors, model = Floors(), nn.Linear(4, 4)
    x = torch.randn(8, 4)
    first = Floors.shape(model, None, (x,))  # the global hook: positional arguments only
    floors.measured(first.key, model, 1000, 1, True, {})
    floors.check(Floors.shape(model, ((torch.randn(2, 4),), {}), None), model, 10, "test")  # other shapes: no bound
    floors.check(Floors.shape(model, ((x,), {"mask": torch.ones(8)}), None), model, 10, "test")  # keyword tensors
    with pytest.raises(BudgetBelowFloorError, match="at least 1000 B"):
        floors.check(Floors.shape(model, ((x,), {"scale": 2}), None), model, 10, "test")
    floors.check(Floors.shape(model, ((x,), {}), None), model, 1000, "test")  # at the floor: runs
    # a later step's floor (its keyword arguments seen) bounds its own shape, the lowest kept
    kw = Floors.shape(model, ((), {"x": x}), None)
    floors.measured(kw.key, model, 3000, 2, True, {})
    floors.measured(kw.key, model, 2000, 3, True, {})
    with pytest.raises(BudgetBelowFloorError, match=r"at least 1\.95 KiB: step 3"):
        floors.check(kw, model, 1999, "test")


def test_an_op_whose_results_view_its_input_is_predicted_to_allocate_nothing() -> None:
    """``unsafe_split`` (LSTMCell's gates) returns views its schema does not
    declare: predicted from their meta storages, each chunk counted the whole
    input, the LBFGS LSTM of the corpus asked 4x its input's bytes of room at
    its measured floor and failed there. An ``out=`` tensor resized still counts."""
    from memscale._region.arguments import OutputSizes
    from memscale._region.schema import OpInfo

    sizes = OutputSizes()

    def predict(func: object, args: list[object], kwargs: dict[str, object] | None = None) -> int:
        return sizes.predict(func, OpInfo(func, False), args, kwargs or {})[1]

    x = torch.randn(48, 180, dtype=torch.float64)
    assert predict(torch.ops.aten.unsafe_split.Tensor, [x, 45, 1]) == 0
    assert predict(torch.ops.aten.mm.default, [torch.randn(3, 4), torch.randn(4, 5)]) == 3 * 5 * 4
    assert predict(torch.ops.aten.arange.start_out, [0, 100], {"out": torch.empty(0)}) == 100 * 4
    assert predict(torch.ops.aten.cat.out, [[torch.randn(10), torch.randn(10)]], {"out": torch.empty(20)}) == 0


def _accumulate(model: nn.Module, updates: int = 2, micro: int = 2) -> list[torch.Tensor]:
    """Gradient accumulation: each update's second micro-batch's backward
    adds to the gradients the first one made (read from outside its step)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = []
    for update in range(updates):
        opt.zero_grad()
        for k in range(micro):
            x = torch.randn(512, 64, generator=torch.Generator().manual_seed(10 * update + k))
            loss = model(x).square().mean() / micro
            loss.backward()
            out.append(loss.detach().clone())
        opt.step()
        out.extend(p.detach().clone() for p in model.parameters())
    return out


def test_the_threshold_named_covers_later_steps_that_carry_in_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step of a shape carries in less than its later steps can: the
    second micro-batch of an accumulation reads the gradients the first made
    (externals, pinned while read; the native region does not pin the
    gradients a step makes, so its first step's program holds less). The
    threshold named was the least of the first step's program, and on the
    native region the second step stopped partway under it (NoRoomError). The
    first MEASURED_STEPS steps of each shape are measured now, and the
    threshold named (the highest least found) trains every step."""
    named, ref, got, summary = _refused_then_trained(monkeypatch, "1%", _accumulate)
    assert summary.steps == 4 and summary.peak_usage <= named, summary
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
