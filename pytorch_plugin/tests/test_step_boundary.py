"""Step boundaries (issue 29): memscale tells the memscale allocator where each
training step ends (``memscale_step_boundary``) - once per region exit (or
``end_step`` inside an entry) and once per block-level step - so that under a
budget it places the next step by a plan. Runs on the simulated device 0: the
installed allocator is stood in for (as in test_granules.py), and the test
reads the allocator's ``num_steps``; without the allocator installed nothing is
told."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import require_engine

torch = pytest.importorskip("torch")
require_engine()

import memscale  # noqa: E402
from memscale._allocator import boundary  # noqa: E402
from memscale._native import lib as _lib  # noqa: E402

MiB = 1 << 20


def _steps() -> int:
    return int(memscale.memory_stats(0)["num_steps"])


@pytest.fixture
def sim_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Regions count usage through device 0's allocator (the simulated one)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    yield
    # Leave device 0 without a plan for the next tests: a boundary after a
    # stretch without a budget retires the plans.
    _lib.lib().memscale_step_boundary(0)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memscale allocator stands as PyTorch's CUDA allocator."""
    monkeypatch.setattr(boundary, "installed", lambda: object())


def _backward() -> None:
    (torch.ones(8, requires_grad=True) * 2).sum().backward()


def test_step_boundary_tells_the_installed_allocator_only(installed: None) -> None:
    before = _steps()
    assert boundary.step_boundary(0)
    assert _steps() == before + 1
    assert not boundary.step_boundary(None)  # no device: a model on the CPU
    boundary.enabled = False
    try:
        assert not boundary.step_boundary(0)
    finally:
        boundary.enabled = True
    assert _steps() == before + 1


def test_step_boundary_without_the_allocator_does_nothing() -> None:
    before = _steps()
    assert not boundary.step_boundary(0)
    assert _steps() == before


def test_a_failed_boundary_is_logged_once_not_raised(
    installed: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(boundary, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="memscale"):
        assert not boundary.step_boundary(-5)
        assert not boundary.step_boundary(-5)
    _lib.lib().memscale_clear_error()
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "memscale_step_boundary" in caplog.records[0].getMessage()


def test_each_region_exit_is_one_step(sim_device: None, installed: None) -> None:
    region = memscale.dtr(None, usage="allocator")
    before = _steps()
    for _ in range(3):
        with region:
            _backward()
    assert _steps() == before + 3


def test_end_step_inside_an_entry_is_the_steps_boundary(sim_device: None, installed: None) -> None:
    """An entry that ends two steps (``end_step``, as an optimizer step does)
    tells the allocator twice, not again at its exit."""
    region = memscale.dtr(None, usage="allocator")
    before = _steps()
    with region:
        _backward()
        region.end_step()
        _backward()
        region.end_step()
    assert _steps() == before + 2
    with region:  # the next entry without end_step: its exit ends the step
        _backward()
    assert _steps() == before + 3


def test_a_region_without_the_allocator_tells_nothing(sim_device: None) -> None:
    before = _steps()
    for usage in ("allocator", "engine"):
        with memscale.dtr(None, usage=usage):
            _backward()
    assert _steps() == before


def test_a_budgeted_region_places_its_steps_by_plan(sim_device: None, installed: None) -> None:
    """Steps that repeat their large requests under a budget: from the third
    entry on the allocator places them by its plan, and the region's summary
    reports it."""
    library = _lib.lib()
    region = memscale.dtr("1GiB", usage="allocator")
    sizes = (64, 32, 96, 48, 80)
    for _ in range(4):
        with region:
            live: list[tuple[int, int]] = []
            for i, mib in enumerate(sizes):
                ptr = library.memscale_malloc(mib * MiB, 0, None)
                assert ptr, _lib.last_error()
                live.append((ptr, mib * MiB))
                if i % 2:
                    freed, nbytes = live.pop(0)
                    library.memscale_free(freed, nbytes, 0, None)
            for ptr, nbytes in live:
                library.memscale_free(ptr, nbytes, 0, None)
            _backward()
    s = region.summary()
    assert s["step_plan_placed"] >= len(sizes), s
    assert s["step_plan_missed"] == 0, s
    stats = memscale.memory_stats(0)
    assert stats["num_step_plans"] >= 1 and stats["step_plan_active"] == 1


def _block_steps(model: Any, n: int) -> Any:
    """``n`` training steps of block-level DTR (1 GiB); the tracker's summary
    (which ends the last step: its units' backward is over)."""
    from _blocks_models import batch

    tracker = memscale.blocks(model, budget="1GiB")
    try:
        for i in range(n):
            model(batch(i)).sum().backward()
        return tracker.summary()
    finally:
        tracker.detach()


def test_block_steps_tell_the_allocator(monkeypatch: pytest.MonkeyPatch, installed: None) -> None:
    """Block-level DTR on a model on "device 0" with the memscale allocator
    (stood in for on the CPU): one boundary per step it ends."""
    from _blocks_models import Net

    monkeypatch.setattr("memscale._blocks.tracker.installed", lambda: object())
    monkeypatch.setattr("memscale._blocks.tracker.module_device_index", lambda model: 0)
    before = _steps()
    s = _block_steps(Net(), 4)
    assert s["steps"] == 4
    assert _steps() == before + 4
    assert "step_plan_placed" in s and "step_plan_missed" in s


def test_block_steps_on_the_cpu_tell_nothing(installed: None) -> None:
    from _blocks_models import Net

    before = _steps()
    _block_steps(Net(), 3)
    assert _steps() == before


def test_the_summary_line_shows_the_step_plans() -> None:
    s = memscale.Summary(steps=4, granules_mapped=120, step_plan_placed=30, step_plan_missed=2)
    assert "step plans placed 30 of 32 large requests" in str(s)
    assert "step plans" not in str(memscale.Summary(steps=4, granules_mapped=120))
    merged = s.merged(memscale.Summary(steps=1, step_plan_placed=5, step_plan_missed=1))
    assert (merged.step_plan_placed, merged.step_plan_missed) == (35, 3)


def test_the_prototype_is_declared() -> None:
    fn = _lib.lib().memscale_step_boundary
    assert fn.restype is ctypes.c_int and fn.argtypes == [ctypes.c_int]
