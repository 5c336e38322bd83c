"""Block-level DTR behind the drop-in API: the eviction threshold as the
budget, ``wrap(model, Config(unit="block"))``, ``enable()``, and
``unit="auto"`` (blocks for a model with repeated blocks, a region for one
without)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import memscale
from memscale.errors import ConfigError, MemscaleError

from _blocks_models import Net, assert_bitwise, batch, train
from _helpers import require_engine, steady_clock

require_engine()


@pytest.fixture(autouse=True)
def _steady_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block call costs the same (the engine's choices depend on the
    program alone, never on the machine's load)."""
    steady_clock(monkeypatch)


def test_the_eviction_threshold_is_the_default_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Net()
    monkeypatch.delenv("MEMSCALE_EVICTION_THRESHOLD", raising=False)
    with pytest.raises(ConfigError, match="no budget given and no MEMSCALE_EVICTION_THRESHOLD"):
        memscale.blocks(model)
    monkeypatch.setenv("MEMSCALE_EVICTION_THRESHOLD", "3MiB")
    tracker = memscale.blocks(model)  # on the CPU: of the blocks' activations
    assert tracker.budget == 3 << 20 and "MEMSCALE_EVICTION_THRESHOLD=3MiB" in tracker.budget_source
    tracker.detach()
    monkeypatch.setenv("MEMSCALE_EVICTION_THRESHOLD", "50%")
    with pytest.raises(ConfigError, match="percentage is of the GPU.s memory"):
        memscale.blocks(model)


def test_the_drop_in_api_wraps_a_model_with_blocks() -> None:
    """``memscale.wrap(model, Config(unit="block"))``: on the CPU the mode's
    fraction is of the first step's block activations; training is bitwise,
    blocks are recomputed, ``summary(model)`` reports it, ``detach`` removes
    the hooks, and what blocks cannot do is refused."""
    torch.manual_seed(0)
    base = Net(p=0.2)
    ref = train(copy.deepcopy(base), steps=4)
    model = memscale.wrap(copy.deepcopy(base), memscale.Config(unit="block", mode="aggressive", log_summary=False))
    got = train(model, steps=4)
    assert_bitwise(ref, got)
    s = memscale.summary(model)
    assert s.rematerializations > 0 and s.baseline_peak and s.budget == s.baseline_peak // 2
    assert "of the first step's block activations" in (s.budget_source or "")
    memscale.detach(model)
    assert memscale.summary(model).rematerializations == s.rematerializations
    calls_before = len(model.layers[0]._forward_pre_hooks)
    assert calls_before == 0  # detached: no hook left
    with pytest.raises(ConfigError, match="unit='block', swap=True"):
        memscale.Config(unit="block", swap=True)
    with pytest.raises(ConfigError, match="Config.unit='ops'"):
        memscale.Config(unit="ops")
    with pytest.raises(MemscaleError, match="blocks need no step boundaries"):
        memscale.optimize(model, config=memscale.Config(unit="block"))


def test_enable_puts_blocks_on_every_model_that_trains(caplog: pytest.LogCaptureFixture) -> None:
    """``memscale.enable(Config(unit="block"))``: the first training forward of
    each model puts blocks on it; a model without blocks is an error that
    names unit 'auto' (the budget is never silently dropped), a module without
    parameters (a loss) is left alone; ``disable()`` removes every hook."""
    from memscale._dropin import enable as _enable

    torch.manual_seed(0)
    base = Net(p=0.2)
    ref = train(copy.deepcopy(base))
    model = copy.deepcopy(base)
    enabled = memscale.enable(memscale.Config(unit="block", mode="aggressive"))
    try:
        assert enabled.active
        with torch.no_grad():
            model(batch(0))  # evaluation attaches nothing
        assert not enabled._blocks.trackers
        got = train(model)
        nn.MSELoss()(torch.ones(2, requires_grad=True), torch.zeros(2)).backward()  # a loss: left alone
        flat = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
        with pytest.raises(ConfigError, match=r"Sequential cannot have block-level DTR.*unit 'auto'"):
            flat(batch(0))
    finally:
        enabled.disable()
    assert_bitwise(ref, got)
    s = enabled.summary()
    assert s.rematerializations > 0 and s.steps >= 2
    assert len(enabled._blocks.trackers) == 1 and _enable.enabled() is None
    assert not model.layers[0]._forward_pre_hooks


class _Flat(nn.Module):
    """A model without repeated blocks (an MLP of differing layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 512)
        self.c = nn.Linear(512, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        h = torch.sin(h) * 1.5 + torch.tanh(h * 2.0)  # activations well above the parameters
        return self.c(torch.tanh(h) * h).square().mean()


def test_auto_wraps_a_model_with_blocks_as_blocks_and_one_without_as_regions() -> None:
    from memscale._dropin import attached

    model, flat = Net(), _Flat()
    memscale.wrap(model, memscale.Config(unit="auto", mode="aggressive", log_summary=False))
    memscale.wrap(flat, memscale.Config(unit="auto", mode="aggressive", log_summary=False))
    try:
        assert attached.attached[model].kind == "blocks"
        assert attached.attached[flat].kind == "module"
    finally:
        memscale.detach(model)
        memscale.detach(flat)


def test_enable_auto_puts_blocks_on_models_with_blocks_and_regions_on_the_others() -> None:
    """``memscale.enable(Config(unit="auto"))`` (``MEMSCALE_UNIT=auto``): a
    model with repeated blocks gets block-level DTR, one without gets a region
    per step; both bitwise, the summary counting both."""
    torch.manual_seed(0)
    base, flat_base = Net(p=0.2), _Flat()
    ref = train(copy.deepcopy(base))
    flat_ref = train(copy.deepcopy(flat_base))
    model, flat = copy.deepcopy(base), copy.deepcopy(flat_base)
    enabled = memscale.enable(memscale.Config(unit="auto", mode="aggressive", log_summary=False))
    try:
        got = train(model)
        flat_got = train(flat)
        blocks = enabled._blocks.summary()
        regions = enabled._steps.summary()
    finally:
        enabled.disable()
    assert_bitwise(ref, got)
    assert_bitwise(flat_ref, flat_got)
    assert [t.blocks[0][1] for t in enabled._blocks.trackers] == [model.layers[0]]  # the flat model: no tracker
    assert blocks.rematerializations > 0 and blocks.steps >= 2
    assert regions.steps == 3 and regions.evictions > 0  # the flat model's steps, and only those
    total = enabled.summary()
    # auto decides per step: the blocks' steps end with their backward, as the regions'
    assert total.unit_steps == {"block": 3, "op": 3} and total.steps == 6, total
    assert total.rematerializations == blocks.rematerializations + regions.rematerializations


@pytest.mark.parametrize("how", ["wrap", "enable"])
def test_block_summaries_count_every_step_the_last_included(how: str) -> None:
    """``unit="block"`` (not auto): a step is counted when its last unit is
    told to the engine, which the next step's first block call did - the
    run's last step, with no next step, was missing from the summary."""
    torch.manual_seed(0)
    config = memscale.Config(unit="block", mode="aggressive", log_summary=False)
    if how == "wrap":
        model = memscale.wrap(Net(), config)
        train(model, steps=3)
        s = memscale.summary(model)
        memscale.detach(model)
    else:
        enabled = memscale.enable(config)
        try:
            train(Net(), steps=3)
            s = enabled.summary()
        finally:
            enabled.disable()
    assert s.steps == 3, s
    assert f"{s.steps} steps" in str(s)
