"""Device budgets of memscale.blocks: DeviceShare (the watermark segments,
the tail, the headroom) on a simulated watermark, and the tracker under a
simulated allocated count (the blocks' share, room for the tail, the
allocator's reclaimer)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import memscale
from memscale._blocks import device
from memscale._blocks.device import DeviceShare
from memscale.errors import ConfigError, MemscaleError

from _blocks_models import Net, assert_bitwise, batch, largest_block, train
from _helpers import require_engine, steady_clock

require_engine()


@pytest.fixture(autouse=True)
def _steady_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block call costs the same (the engine's choices depend on the
    program alone, never on the machine's load)."""
    steady_clock(monkeypatch)

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


def test_a_device_budget_leaves_the_blocks_what_the_rest_does_not_use() -> None:
    """``allocated=`` (on a GPU: the device's allocated bytes, the eviction
    threshold's meaning): the blocks get the budget less what is allocated
    outside them, measured at every decision; when that shrinks below a
    block, the error says how much is outside and what would work."""
    torch.manual_seed(0)
    base = Net(p=0.3)
    block = largest_block(base, batch(0))
    ref = train(copy.deepcopy(base))
    outside = [10 * block]
    model = copy.deepcopy(base)

    def allocated() -> int:
        engine = tracker._engine
        return outside[0] + (int(engine.status.usage) if engine is not None else 0)

    tracker = memscale.blocks(model, outside[0] + block + block // 2, allocated=allocated)
    assert_bitwise(ref, train(model))
    s = tracker.summary()
    assert s["rematerializations"] == 3 * 3 and s["last_step_peak"] <= block + block // 2
    outside[0] += block  # the rest of the program grew: half a block is left
    with pytest.raises(MemscaleError, match=r"threshold .* less .* allocated outside the blocks leaves .*raise it to at least"):
        train(model, steps=1)
    with pytest.raises(ConfigError, match="percentage is of the blocks' activations"):
        memscale.blocks(copy.deepcopy(base), "50%", allocated=allocated)


@pytest.mark.parametrize("tail_blocks", [0, 2, 5])
def test_a_device_budget_makes_room_for_what_follows_the_forward(
    monkeypatch: pytest.MonkeyPatch, tail_blocks: int
) -> None:
    """A device budget covers what the program allocates after the forward's
    last block (the model's head, the loss, their backward) before the
    blocks' backward: the step after one that measured that tail (the
    allocator's watermark up to the first unpack) starts its head with only
    the blocks that fit beside the tail resident, the way checkpointing holds
    none through the head; a tail larger than the budget leaves none."""
    torch.manual_seed(0)
    base = Net(depth=6, p=0.3)
    block = largest_block(base, batch(0))
    ref = train(copy.deepcopy(base))
    outside = 10 * block
    model = copy.deepcopy(base)
    tail = tail_blocks * block
    head = {"active": False}  # between the forward's end and the blocks' backward

    class Probe:  # the allocator's watermark; the head peaks `tail` above the forward's end
        def __init__(self, device: int) -> None:
            assert device == 0
            self.start = allocated()

        def close(self) -> int:
            peak = max(self.start, allocated()) + (tail if head["active"] else 0)
            head["active"] = False
            return peak

    def allocated() -> int:
        engine = tracker._engine
        return outside + (int(engine.status.usage) if engine is not None else 0)

    monkeypatch.setattr("memscale._blocks.device.PeakProbe", Probe)
    monkeypatch.setattr("memscale._blocks.tracker.module_device_index", lambda model: 0)
    budget = outside + 4 * block
    tracker = memscale.blocks(model, budget, allocated=allocated)
    resident_at_end: list[int] = []

    def head_starts(*_: Any) -> None:
        resident_at_end.append(int(tracker._engine.status.usage))
        head["active"] = True

    model.out.register_forward_pre_hook(head_starts)
    assert_bitwise(ref, train(model))
    assert tracker.summary()["device_tail"] == tail
    room = max(0, budget - outside - tail)
    assert resident_at_end[0] > room or tail_blocks == 0  # the first step has no measure yet
    assert all(r <= room for r in resident_at_end[1:]), (resident_at_end, room)
    if tail_blocks >= 4:
        assert resident_at_end[1:] == [0, 0]


def test_a_failed_allocation_on_the_device_drops_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memscale allocator's reclaimer (an allocation that failed) asks a
    device-budget tracker to drop units whatever the budget: the units the
    engine names are dropped, the bytes freed returned, and backward
    recomputes them (bitwise). Another thread inside the tracker: 0."""
    import threading
    import weakref

    from memscale._region import reclaim

    torch.manual_seed(0)
    base = Net(depth=4, p=0.3)
    block = largest_block(base, batch(0))
    ref = train(copy.deepcopy(base), steps=1)
    model = copy.deepcopy(base)
    outside = 10 * block

    def allocated() -> int:
        engine = tracker._engine
        return outside + (int(engine.status.usage) if engine is not None else 0)

    tracker = memscale.blocks(model, 1 << 40, allocated=allocated)  # the budget never evicts
    monkeypatch.setitem(reclaim._sessions, 0, [weakref.ref(tracker)])
    freed: list[int] = []
    busy: list[int] = []

    def on_last_block(*_: Any) -> None:
        if tracker._engine is None or tracker._engine.status.usage < 3 * block:
            return  # the first blocks
        holder = threading.Thread(target=lambda: (tracker._lock.acquire(), started.set(), stop.wait(), tracker._lock.release()))
        started, stop = threading.Event(), threading.Event()
        holder.start()
        started.wait()
        busy.append(tracker.reclaim(block))  # another thread is inside: could not help
        stop.set()
        holder.join()
        freed.append(reclaim._reclaim(0, 2 * block, None))  # what the allocator calls

    model.layers[3].register_forward_pre_hook(on_last_block)
    assert_bitwise(ref, train(model, steps=1))
    assert busy == [0]
    assert freed and freed[0] >= 2 * block, (freed, block)
    s = tracker.summary()
    assert s["evictions"] >= 2 and s["rematerializations"] >= 2, s
    tracker.detach()
    assert tracker.closed and reclaim._reclaim(0, block, None) == 0
