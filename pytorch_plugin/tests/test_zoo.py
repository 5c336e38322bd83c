"""The model-family zoo (``zoo.py``) trains under DTR budgets, bitwise as without memscale.

For each family: three seeded training steps with SGD between them, from the
same initial weights (``copy.deepcopy`` of one built model):

1. without memscale (the reference: every loss, every parameter's gradient,
   every buffer, e.g. batch norm's running statistics, after each step);
2. in ``memscale.dtr(None)`` (``test_zoo_unbudgeted``): bitwise the reference,
   nothing evicted; its ``peak_usage`` is the step's peak;
3. under 50 % and 30 % of that peak, or ``1.1 * min_budget`` where the engine
   reports a ``min_budget`` (a lower bound of a feasible budget) and that is
   higher (``test_zoo_under_budget``): bitwise the reference, the engine's peak
   usage never over the budget, something evicted.

Runs against the real ``libmemscale.so``; skipped without the engine. One
intra-op thread (restored after the module); op costs are fixed at 1 us
(``_helpers.steady_clock``), so the engine's choices, and whether a budget
works, do not depend on the machine's load.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import deadline, require_engine, steady_clock

require_engine()
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import zoo
from memscale import dtr
from memscale.errors import ConfigError, MemscaleError

FRACTIONS = (0.5, 0.3)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One intra-op thread: steady step times on a shared, loaded machine
    (both runs of a comparison use the same count, so bitwise equality holds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _steady(monkeypatch: pytest.MonkeyPatch) -> None:
    """Op costs fixed at 1 us: whether a tight budget works depends on the
    program, not on the machine's load."""
    steady_clock(monkeypatch)


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    """No test may hang: three steps of these models take seconds (GPT-2
    with checkpointing at 1.1 x ``min_budget``, thrashing at the edge of what
    fits, about 50 s here: 106,000 evictions, 17,000 tensors parked); a
    region that thrashes harder (millions of evictions) fails here instead."""
    with deadline(150):
        yield


@functools.cache
def _model(name: str) -> zoo.ZooModel:
    return zoo.MODELS[name]()


@functools.cache
def _reference(name: str) -> list[dict[str, Any]]:
    return zoo.train(_model(name))


@functools.cache
def _probe(name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The unbudgeted run: its records and summary (not cached when it raises)."""
    region = dtr(None)
    got = zoo.train(_model(name), region)
    return got, region.summary()


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_zoo_unbudgeted(name: str) -> None:
    ref = _reference(name)
    got, s = _probe(name)
    assert not zoo.differences(ref, got), zoo.differences(ref, got)[:5]
    assert s["peak_usage"] > 0
    assert s["evictions"] == 0
    assert s["entries"] == zoo.STEPS


def _rows() -> list[Any]:
    rows = []
    for name in zoo.MODELS:
        for fraction in FRACTIONS:
            # The tightest budget re-runs most: make test-slow (pytest -m slow) runs those rows.
            marks = (pytest.mark.slow,) if fraction == min(FRACTIONS) else ()
            rows.append(pytest.param(name, fraction, id=f"{name}-{fraction:.0%}", marks=marks))
    return rows


@pytest.mark.parametrize(("name", "fraction"), _rows())
def test_zoo_under_budget(name: str, fraction: float) -> None:
    ref = _reference(name)
    _, probe = _probe(name)
    peak = int(probe["peak_usage"])
    budget = zoo.budget_for(peak, fraction, probe.get("min_budget"))
    region = dtr(budget)
    got = zoo.train(_model(name), region)
    s = region.summary()
    what = f"{name} at {budget} bytes ({budget / peak:.0%} of the {peak}-byte peak)"
    problems = [f"{what}: {d}" for d in zoo.differences(ref, got)[:5]]
    if s["peak_usage"] > budget:
        problems.append(f"{what}: peak usage {s['peak_usage']} > budget")
    for step, rec in enumerate(got):
        if rec["stats"]["peak_usage"] > budget:
            problems.append(f"{what}: step {step} peak usage {rec['stats']['peak_usage']} > budget")
    if s["evictions"] <= 0:
        problems.append(f"{what}: nothing evicted ({s})")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_parking_is_what_lets_a_tight_budget_work() -> None:
    """ResNet at 30 % of its peak (1.2 x ``min_budget``): rebuilds nest, and
    the storages the outer levels hold leave the inner ones no room. Without
    parking (or with an offload limit that leaves it no room in host memory)
    the step fails and says why; with it (the default) the same budget trains
    bitwise, within the budget, some of it parked."""
    name = "resnet"
    ref = _reference(name)
    _, probe = _probe(name)
    budget = zoo.budget_for(int(probe["peak_usage"]), 0.3, probe.get("min_budget"))
    for off in (dtr(budget, park=False), dtr(budget, offload_limit=1)):  # off, or nothing may go to the host
        with pytest.raises(MemscaleError, match="nothing evictable"):
            zoo.train(_model(name), off)
    region = dtr(budget)
    got = zoo.train(_model(name), region)
    s = region.summary()
    assert not zoo.differences(ref, got)
    assert s["peak_usage"] <= budget
    assert 0 < s["parked"] <= s["swaps_out"]
    assert s["swaps_in"] > 0
    with pytest.raises(ConfigError, match=r"dtr\(park='no'\): expected True or False"):
        dtr(park="no")  # type: ignore[arg-type]
