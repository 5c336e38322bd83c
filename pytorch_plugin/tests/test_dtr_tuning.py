"""The region's tuning: the engine chooses the configuration of later steps.

A budgeted region with no heuristic given creates its engines with
``"heuristic": "auto"``; the first entry records the step, the engine replays it
with every candidate configuration at exit (``memscale_dtr_tune``) and later
entries run its choice. Python only carries the choice forward; these tests
check that it does, that training stays bitwise the same as without memscale,
and what happens with an explicit heuristic, no budget, a new budget, a forced
choice and a failed tuning.

Runs against the real ``libmemscale.so``; skipped when it lacks the engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _helpers import assert_same_steps, deadline, steady_clock

import memscale
from memscale import Config, MemscaleError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
nn = torch.nn

try:
    from memscale._native import engine as _engine
    from memscale import dtr
    from memscale._region import DEFAULT_HEURISTIC

    _engine.dtr_lib()
except (ImportError, MemscaleError) as exc:  # pragma: no cover - without the engine
    pytest.skip(f"the DTR engine is unavailable: {exc}", allow_module_level=True)

STEPS = 3
Make = Callable[[], tuple[nn.Module, Callable[[nn.Module], Any]]]


@pytest.fixture(autouse=True)
def _no_heuristic_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMSCALE_HEURISTIC", raising=False)


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    with deadline(600):
        yield


@pytest.fixture
def tune_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every report the engines' ``tune`` returned (the real call, counted)."""
    calls: list[dict[str, Any]] = []
    real = _engine.Engine.tune

    def counted(self: _engine.Engine) -> dict[str, Any]:
        report = real(self)
        calls.append(report)
        return report

    monkeypatch.setattr(_engine.Engine, "tune", counted)
    return calls


# --------------------------------------------------------------------- models


def _mlp() -> tuple[nn.Module, Callable[[nn.Module], Any]]:
    """Activations (batch 512 x width 128, 12 layers) dominate the parameters;
    dropout covers replayed RNG ops."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(32, 128), nn.ReLU()]
    for i in range(11):
        layers += [nn.Linear(128, 128), nn.Tanh() if i % 2 else nn.ReLU(), nn.Dropout(0.1)]
    layers.append(nn.Linear(128, 10))
    model = nn.Sequential(*layers)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(512, 32, generator=g), torch.randint(0, 10, (512,), generator=g)
    return model, lambda m: nn.functional.cross_entropy(m(x), y)


def _gpt2() -> tuple[nn.Module, Callable[[nn.Module], Any]]:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(
        n_layer=4, n_embd=64, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    data = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(1))
    return model, lambda m: m(input_ids=data, labels=data).loss


MODELS: dict[str, Make] = {"mlp": _mlp, "gpt2": _gpt2}


def _train(make: Make, region: Any = None, steps: int = STEPS) -> list[dict[str, Any]]:
    """``steps`` seeded steps, SGD after each: loss, gradients and, in a region,
    its summary and last entry's summary after the step."""
    model, loss_fn = make()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(100 + step)
        rec: dict[str, Any] = {}
        if region is None:
            loss = loss_fn(model)
            loss.backward()
        else:
            with region:
                loss = loss_fn(model)
                loss.backward()
            loss = region.unwrap(loss)
            rec["summary"] = region.summary()
            rec["last"] = region.last_summary()
        rec["loss"] = loss.detach().clone()
        rec["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        out.append(rec)
    return out



_PEAKS: dict[str, int] = {}


def _peak(name: str) -> int:
    """The unbudgeted peak of one step of model ``name`` (measured once)."""
    if name not in _PEAKS:
        free = dtr(None)
        _train(MODELS[name], free, steps=1)
        _PEAKS[name] = free.summary()["peak_usage"]
    return _PEAKS[name]


# ---------------------------------------------------------------------- tests


def test_default_region_tunes_after_the_first_step(tune_calls: list[dict[str, Any]]) -> None:
    ref = _train(_mlp)
    budget = int(_peak("mlp") * 0.5)
    region = dtr(budget)
    got = _train(_mlp, region)
    assert_same_steps(ref, got, "mlp at 50% (tuned)")

    first, second, third = got
    assert first["last"]["config"]["heuristic"] == DEFAULT_HEURISTIC
    tuning = first["summary"]["tuning"]
    assert isinstance(tuning, dict) and isinstance(tuning["choice"], str) and tuning["choice"]
    assert set(tuning) == {"choice", "feasible", "overhead", "default_overhead", "wall_ns", "instructions", "config"}
    assert len(tune_calls) == 1, "tuned more than once"
    assert tuning["config"] == tune_calls[0]["config"] and tuning["choice"] == tune_calls[0]["choice"]
    chosen = tuning["config"]
    assert chosen.get("heuristic") not in (None, DEFAULT_HEURISTIC)
    for rec in (second, third):
        config = rec["last"]["config"]
        assert {k: config.get(k) for k in chosen} == chosen, f"later entry ran {config}, not {chosen}"
        assert rec["last"]["engine"]["heuristic"] == chosen["heuristic"]
        assert rec["summary"]["tuning"] == tuning
    s = region.summary()
    assert s["evictions"] > 0 and s["rematerializations"] > 0, s
    assert 0 < s["peak_usage"] <= budget


def test_explicit_heuristic_does_not_tune(tune_calls: list[dict[str, Any]]) -> None:
    region = dtr(int(_peak("mlp") * 0.5), heuristic="dtr")
    got = _train(_mlp, region)
    assert tune_calls == []
    assert region.summary()["tuning"] is None
    assert all(rec["last"]["config"]["heuristic"] == "dtr" for rec in got)
    assert region.summary()["evictions"] > 0


def test_environment_heuristic_does_not_tune(
    tune_calls: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMSCALE_HEURISTIC", "dtr")
    region = dtr(int(_peak("mlp") * 0.5))
    got = _train(_mlp, region, steps=2)
    assert tune_calls == []
    assert region.summary()["tuning"] is None
    assert all(rec["last"]["config"]["heuristic"] == "dtr" for rec in got)  # the engine reads the variable


def test_environment_auto_tunes(tune_calls: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSCALE_HEURISTIC", "Auto")
    region = dtr(int(_peak("mlp") * 0.5))
    got = _train(_mlp, region, steps=2)
    assert len(tune_calls) == 1
    assert region.summary()["tuning"]["choice"]
    assert got[0]["last"]["config"]["heuristic"] == "auto"


def test_unbudgeted_region_does_not_tune(tune_calls: list[dict[str, Any]]) -> None:
    region = dtr(None)
    got = _train(_mlp, region, steps=2)
    assert tune_calls == []
    assert region.summary()["tuning"] is None
    assert all(rec["last"]["config"]["heuristic"] != DEFAULT_HEURISTIC for rec in got)


_FORCED: dict[str, Any] = {
    "heuristic": "dtr",
    "simulator_compat": True,
    "recomp_time_factor": 1,
    "recomp_memory_factor": 1,
}


@pytest.fixture(name="steady_clock")
def _steady_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every op measured at exactly 1 us (see ``_helpers.steady_clock``)."""
    steady_clock(monkeypatch)


#: Under the DTR authors' simulator semantics the released parents of evicted
#: tensors are dropped at once, so late in backward a rebuild of the MLP runs
#: nested plans whose held inputs plus the pinned parameters and gradients
#: leave little room at 30 % of the peak. Whether it fits depends on the op
#: costs the engine sees: with measured costs it ran out of room ("nothing
#: evictable") in some runs and not in others, which made a strict xfail here
#: flaky. With the steady clock below every run makes the same decisions, and
#: 30 % trains.
@pytest.mark.parametrize(
    ("model", "frac"),
    [
        ("gpt2", 0.5),
        ("gpt2", 0.3),
        ("mlp", 0.5),
        ("mlp", 0.4),
        ("mlp", 0.3),
    ],
)
def test_forced_simulator_compat_choice_trains_bitwise(
    model: str, frac: float, monkeypatch: pytest.MonkeyPatch, steady_clock: None
) -> None:
    """The tuner may choose the DTR authors' reference algorithm
    (``simulator_compat``); the region must still train bitwise under it."""
    calls: list[int] = []

    def forced(self: _engine.Engine) -> dict[str, Any]:
        calls.append(self.handle)
        return {"config": dict(_FORCED), "choice": "forced", "feasible": True, "overhead": 1.0,
                "default_overhead": 1.0, "budget": 0, "instructions": 0, "wall_ns": 0, "trials": []}

    monkeypatch.setattr(_engine.Engine, "tune", forced)
    ref = _train(MODELS[model])
    budget = int(_peak(model) * frac)
    region = dtr(budget)
    got = _train(MODELS[model], region)
    assert_same_steps(ref, got, f"{model} at {frac:.0%} with the forced choice")
    assert len(calls) == 1
    for rec in got[1:]:
        config = rec["last"]["config"]
        assert {k: config.get(k) for k in _FORCED} == _FORCED
        assert rec["last"]["evictions"] > 0, f"{model} at {frac:.0%}: step without evictions ({rec['last']})"
        assert rec["last"]["peak_usage"] <= budget


def test_budget_setter_forgets_the_choice(tune_calls: list[dict[str, Any]]) -> None:
    peak = _peak("mlp")
    region = dtr(int(peak * 0.5))
    _train(_mlp, region, steps=1)
    assert region.summary()["tuning"] is not None and len(tune_calls) == 1

    region.budget = int(peak * 0.5)  # the same budget: the choice stays
    assert region.summary()["tuning"] is not None

    region.budget = int(peak * 0.4)
    assert region.summary()["tuning"] is None
    got = _train(_mlp, region, steps=2)
    assert got[0]["last"]["config"]["heuristic"] == DEFAULT_HEURISTIC  # recorded again
    assert len(tune_calls) == 2
    assert tune_calls[1]["budget"] == int(peak * 0.4)
    assert got[1]["last"]["config"]["heuristic"] == tune_calls[1]["config"]["heuristic"]
    assert region.summary()["tuning"]["choice"] == tune_calls[1]["choice"]


def test_tune_failure_warns_and_training_continues(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def broken(self: _engine.Engine) -> dict[str, Any]:
        calls.append(self.handle)
        raise MemscaleError("memscale_dtr_tune: replay went wrong")

    monkeypatch.setattr(_engine.Engine, "tune", broken)
    ref = _train(_mlp)
    region = dtr(int(_peak("mlp") * 0.5))
    with caplog.at_level(logging.WARNING, logger="memscale"):
        got = _train(_mlp, region)
    assert_same_steps(ref, got, "mlp after a failed tuning")
    assert len(calls) == 1, "tuning retried"
    assert region.summary()["tuning"] == {"error": "memscale_dtr_tune: replay went wrong"}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "tuning failed" in r.getMessage()]
    assert len(warnings) == 1 and "replay went wrong" in warnings[0].getMessage()
    assert [rec["last"]["config"]["heuristic"] for rec in got] == [DEFAULT_HEURISTIC, "default", "default"]
    assert region.summary()["evictions"] > 0


def test_step_that_raises_is_not_tuned(tune_calls: list[dict[str, Any]]) -> None:
    model, loss_fn = _mlp()
    region = dtr(int(_peak("mlp") * 0.5))
    with pytest.raises(RuntimeError, match="abandoned"):
        with region:
            loss_fn(model).backward()
            raise RuntimeError("abandoned")
    assert tune_calls == [] and region.summary()["tuning"] is None


def test_engine_tune_errors_name_the_call() -> None:
    with _engine.Engine({"budget": 1 << 20, "heuristic": "lru"}) as eng:
        with pytest.raises(MemscaleError, match="memscale_dtr_tune.*record"):
            eng.tune()
    with _engine.Engine({"heuristic": "auto"}) as eng:
        with pytest.raises(MemscaleError, match="memscale_dtr_tune.*budget"):
            eng.tune()


def test_optimize_summary_reports_the_tuning() -> None:
    model, loss_fn = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # CPU: step 1 is the unbudgeted baseline, step 2 records and tunes, step 3 runs the choice.
    with memscale.optimize(model, opt, Config(mode="aggressive", log_summary=False)) as run:
        for step in range(STEPS):
            opt.zero_grad()
            torch.manual_seed(100 + step)
            loss_fn(model).backward()
            opt.step()
            if step == 0:
                assert run.summary().tuning is None
    summary = run.summary()
    assert summary.tuning is not None and summary.tuning["choice"], summary
    assert summary.as_dict()["tuning"] == summary.tuning
    assert "tuned: " in str(summary)
