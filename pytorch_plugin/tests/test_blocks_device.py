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


def test_the_tail_is_the_watermark_from_the_last_block_to_the_first_unpack(memory: Watermark) -> None:
    share = DeviceShare(lambda: memory.now)
    memory.set(10 * MiB)
    share.forward_started(0)
    memory.set(40 * MiB)  # activations
    share.forward_started(0)  # a nested forward: the open segment stays
    share.tail_started(0, at_last_block=True)
    assert share.in_tail
    memory.set(90 * MiB)  # the head, logits, loss, their backward
    share.tail_started(0, at_last_block=False)  # the model's forward returns: the tail goes on
    memory.set(55 * MiB)
    share.unpacked()  # the blocks' backward starts
    assert not share.in_tail and share.tail == 50 * MiB
    share.unpacked()  # later unpacks: nothing
    assert share.tail == 50 * MiB
    memory.set(60 * MiB)
    share.backward_done()
    memory.set(200 * MiB)  # the optimizer's step: not the blocks' to make room for
    assert share.step_ended(100 * MiB) == 90 * MiB
    assert share.headroom == 0  # the forward and backward stayed within the budget


def _step(share: DeviceShare, memory: Watermark, peak: int, tail: int = 0, at_last_block: bool = True) -> int:
    """One step whose forward peaks at ``peak`` and whose tail adds ``tail``."""
    memory.set(0)
    share.forward_started(0)
    memory.set(peak)
    share.tail_started(0, at_last_block)
    memory.set(peak + tail)
    memory.set(0)  # the head's memory is freed; the backward stays low
    share.unpacked()
    share.backward_done()
    return share.step_ended(100)


def test_the_headroom_rises_by_the_overshoot_and_falls_by_half_the_slack(memory: Watermark) -> None:
    share = DeviceShare(lambda: memory.now)
    assert _step(share, memory, 130) == 130 and share.headroom == 30
    assert _step(share, memory, 110) == 110 and share.headroom == 40
    assert _step(share, memory, 80) == 80 and share.headroom == 30
    assert _step(share, memory, 0) == 0 and share.headroom == 30  # not measured: unchanged
    assert _step(share, memory, 20) == 20 and share.headroom == 0  # never below 0
    # what the tail went over is the tail's to make room for, not the headroom's
    assert _step(share, memory, 90, tail=60) == 150 and share.headroom == 0 and share.tail == 60


def test_a_forward_whose_tail_started_at_its_end_does_not_count_for_the_headroom(memory: Watermark) -> None:
    # The first step: which block call is the last is not known yet, so the
    # forward's watermark holds the head's forward too.
    share = DeviceShare(lambda: memory.now)
    assert _step(share, memory, 170, at_last_block=False) == 170 and share.headroom == 0
    assert _step(share, memory, 170, at_last_block=True) == 170 and share.headroom == 70


def test_a_new_forward_closes_a_tail_that_never_reached_backward(memory: Watermark) -> None:
    share = DeviceShare(lambda: memory.now)
    share.forward_started(0)
    share.tail_started(0, at_last_block=True)
    memory.set(30)
    share.forward_started(0)  # the first forward's output was never backpropagated
    assert not share.in_tail and share.tail == 30


def test_without_the_memscale_allocator_nothing_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoProbe:
        def __init__(self, index: int) -> None:
            pass

        def close(self) -> Any:
            return None

    monkeypatch.setattr(device, "PeakProbe", NoProbe)
    share = DeviceShare(lambda: 5)
    share.forward_started(0)
    share.tail_started(0, at_last_block=True)
    share.unpacked()
    share.backward_done()
    assert share.step_ended(1) == 0
    assert (share.tail, share.headroom) == (0, 0)


def test_a_tail_started_at_the_forwards_end_counts_the_head_from_the_last_block(memory: Watermark) -> None:
    # The first step: the head (logits: 50) ran before the model's forward
    # returned; the tail counts it from the last block's return.
    share = DeviceShare(lambda: memory.now)
    share.forward_started(0)
    memory.set(40)
    share.block_returned()
    memory.set(90)  # the head's forward
    share.tail_started(0, at_last_block=False)
    memory.set(80)  # the head's backward (less)
    share.unpacked()
    assert share.tail == 50
    # Once the last block is known, the tail is measured from it.
    share.backward_done()
    share.step_ended(1000)
    memory.set(0)
    share.forward_started(0)
    memory.set(40)
    share.tail_started(0, at_last_block=True)
    memory.set(70)
    share.unpacked()
    assert share.tail == 30
