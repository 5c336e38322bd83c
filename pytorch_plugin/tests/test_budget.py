"""The eviction threshold is the default budget (memscale._allocator.budget), and an
explicit budget, Config.threshold or Config.mode wins; summaries say which."""

from __future__ import annotations

from typing import Any

import pytest
from _helpers import require_engine

torch = pytest.importorskip("torch")

import memscale  # noqa: E402
from memscale import Config, ConfigError, dtr  # noqa: E402
from memscale._allocator.budget import THRESHOLD_ENV, Budget, default_budget, threshold_budget  # noqa: E402

require_engine()

MB = 1 << 20


@pytest.fixture(autouse=True)
def _no_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THRESHOLD_ENV, raising=False)


def test_no_threshold_means_no_budget_on_the_cpu() -> None:
    assert threshold_budget() is None
    assert default_budget() == Budget(0, f"no {THRESHOLD_ENV} set")
    region = dtr()
    assert region.budget == 0 and region.summary()["budget_source"] == f"no {THRESHOLD_ENV} set"


@pytest.mark.parametrize(("raw", "nbytes"), [("4MiB", 4 * MB), ("4194304", 4 * MB), (" 2 GiB ", 2 << 30)])
def test_the_environment_threshold_is_the_default_budget(
    raw: str, nbytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(THRESHOLD_ENV, raw)
    region = dtr()
    assert region.budget == nbytes
    assert region.budget_source == f"{THRESHOLD_ENV}={raw.strip()}"
    assert region.summary()["budget_source"] == region.budget_source


def test_an_explicit_budget_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THRESHOLD_ENV, "4MiB")
    assert dtr(8 * MB).budget == 8 * MB and dtr(8 * MB).budget_source == f"dtr(budget={8 * MB})"
    unbudgeted = dtr(None)
    assert unbudgeted.budget == 0 and unbudgeted.budget_source == "dtr(budget=None)"
    region = dtr()
    region.budget = "2MiB"
    assert region.budget == 2 * MB and region.budget_source == "DTRRegion.budget = '2MiB'"


@pytest.mark.parametrize(
    ("raw", "match"),
    [("50%", "percentage is of the GPU.s memory"), ("lots", THRESHOLD_ENV), ("0", "must be positive"), ("-1MiB", "must be positive"), ("200%", "over 100 %")],
)
def test_a_bad_threshold_is_a_clear_error(raw: str, match: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THRESHOLD_ENV, raw)
    with pytest.raises(ConfigError, match=match):
        dtr()
    if raw.endswith("%") and float(raw[:-1]) <= 100:
        return  # the drop-in API takes it of the first step's measured peak on the CPU (test_run.py)
    model = torch.nn.Linear(4, 4)
    memscale.wrap(model)
    try:
        with pytest.raises(ConfigError, match=match):
            model(torch.randn(2, 4))  # resolved at the first step
    finally:
        memscale.detach(model)


def _step(model: Any) -> None:
    model(torch.randn(8, 64)).sum().backward()
    memscale.end_step(model)


@pytest.mark.parametrize(
    ("config", "source"),
    [
        (Config(), f"{THRESHOLD_ENV}=3MiB"),
        (Config(threshold="2MiB"), "Config.threshold='2MiB'"),
        (Config(mode="aggressive", device_memory="8MiB"), "Config.mode='aggressive': 50% of device memory (8.00 MiB)"),
    ],
)
def test_wrap_takes_the_threshold_unless_the_config_names_a_budget(
    config: Config, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(THRESHOLD_ENV, "3MiB")
    model = memscale.wrap(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()), config)
    try:
        _step(model)
        summary = memscale.summary(model)
        assert summary.budget_source == source
        assert source in str(summary)
    finally:
        memscale.detach(model)


def test_wrap_without_any_budget_measures_a_baseline_step_on_the_cpu() -> None:
    model = memscale.wrap(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()))
    try:
        out = model(torch.randn(8, 64))  # the first step is open: the baseline
        assert memscale.summary(model).budget_source == "unbudgeted baseline step (no device memory size on the CPU)"
        out.sum().backward()  # ends it
        summary = memscale.summary(model)  # the later steps' region
        assert summary.baseline_peak and summary.budget == int(summary.baseline_peak * 0.75)
        assert summary.budget_source.startswith("Config.mode='balanced' (default): 75% of the baseline step's peak")
    finally:
        memscale.detach(model)
