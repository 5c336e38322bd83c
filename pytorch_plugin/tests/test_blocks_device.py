"""DeviceShare: what a device budget leaves memscale.blocks (tail, headroom)."""

from __future__ import annotations

from typing import Any

import pytest

from memscale._blocks import device
from memscale._blocks.device import DeviceShare

MiB = 1 << 20


class Watermark:
    """A fake allocator: allocated bytes now, and a watermark each probe resets."""

    def __init__(self) -> None:
        self.now = 0
        self.probes: list[FakeProbe] = []

    def set(self, nbytes: int) -> None:
        self.now = nbytes
        for probe in self.probes:
            probe.peak = max(probe.peak, nbytes)


class FakeProbe:
    memory: Watermark

    def __init__(self, index: int) -> None:
        self.index = index
        self.peak = self.memory.now
        self.memory.probes = [self]  # one watermark: a new probe resets it

    def close(self) -> int:
        return self.peak


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Watermark:
    w = Watermark()
    FakeProbe.memory = w
    monkeypatch.setattr(device, "PeakProbe", FakeProbe)
    return w


@pytest.mark.parametrize(
    ("budget", "allocated", "usage", "headroom", "need", "want"),
    [
        # budget less what is outside the blocks (allocated - the engine's usage)
        (100, 70, 20, 0, 10, (50, 50)),
        # the headroom is kept back...
        (100, 70, 20, 30, 10, (20, 50)),
        # ...but never makes a decision fail that fits without it
        (100, 70, 20, 45, 10, (10, 50)),
        (100, 70, 20, 45, 60, (50, 50)),
        # nothing left: 1 byte (the engine's budget is positive), the caller says what would work
        (100, 150, 0, 0, 10, (1, 150)),
        # the engine's usage above what the allocator counts: nothing outside
        (100, 10, 20, 0, 0, (100, 0)),
    ],
)
def test_engine_budget(budget: int, allocated: int, usage: int, headroom: int, need: int, want: tuple[int, int]) -> None:
    share = DeviceShare(lambda: allocated)
    share.headroom = headroom
    assert share.engine_budget(budget, usage, need) == want


def test_the_tail_is_the_watermark_from_the_forwards_end_to_the_first_unpack(memory: Watermark) -> None:
    share = DeviceShare(lambda: memory.now)
    memory.set(10 * MiB)
    share.forward_started(0)
    memory.set(40 * MiB)  # activations
    share.forward_started(0)  # a nested forward: the open segment stays
    share.forward_ended(0)
    assert share.in_tail
    memory.set(90 * MiB)  # logits, loss, their backward
    memory.set(55 * MiB)
    share.unpacked()  # the blocks' backward starts
    assert not share.in_tail and share.tail == 50 * MiB
    share.unpacked()  # later unpacks: nothing
    assert share.tail == 50 * MiB
    memory.set(60 * MiB)
    assert share.step_ended(100 * MiB) == 90 * MiB
    assert share.headroom == 0  # within the budget


def test_the_headroom_rises_by_the_overshoot_and_falls_by_half_the_slack(memory: Watermark) -> None:
    share = DeviceShare(lambda: memory.now)

    def step(peak: int, tail: int = 0) -> int:
        memory.set(0)
        share.forward_started(0)
        memory.set(peak)
        share.forward_ended(0)
        memory.set(peak + tail)
        memory.set(peak)
        share.unpacked()
        return share.step_ended(100)

    assert step(130) == 130 and share.headroom == 30
    assert step(110) == 110 and share.headroom == 40
    assert step(80) == 80 and share.headroom == 30
    assert step(0) == 0 and share.headroom == 30  # not measured: unchanged
    assert step(20) == 20 and share.headroom == 0  # never below 0
    # what the tail went over is the tail's to make room for, not the headroom's
    assert step(90, tail=60) == 150 and share.headroom == 0 and share.tail == 60


def test_without_the_memscale_allocator_nothing_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoProbe:
        def __init__(self, index: int) -> None:
            pass

        def close(self) -> Any:
            return None

    monkeypatch.setattr(device, "PeakProbe", NoProbe)
    share = DeviceShare(lambda: 5)
    share.forward_started(0)
    share.forward_ended(0)
    share.unpacked()
    assert share.step_ended(1) == 0
    assert (share.tail, share.headroom) == (0, 0)
