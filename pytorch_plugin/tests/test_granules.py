"""The allocator's granule counters in the region's and the drop-in API's
summaries (issue 29): maps, unmaps and remaps of 2 MiB granules while a region
counts usage through the memscale allocator. Runs on the simulated device: the
region's engine reads device 0's allocator, and the test allocates through the
library itself as PyTorch would on a GPU."""

from __future__ import annotations

import pytest
from _helpers import require_engine

torch = pytest.importorskip("torch")
require_engine()

import memscale  # noqa: E402
from memscale._native import lib as _lib  # noqa: E402

MiB = 1 << 20


def test_a_region_reports_what_the_allocator_did_to_its_granules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # the simulated device 0
    library = _lib.lib()
    region = memscale.dtr(None, usage="allocator")
    before = memscale.memory_stats(0)
    size = int(before["reserved_bytes.all.current"]) + 64 * MiB  # more than all that is cached: it maps
    with region:
        ptr = library.memscale_malloc(size, 0, None)
        assert ptr, _lib.last_error()
        running = region.summary()  # counted while the entry is open too
        library.memscale_free(ptr, size, 0, None)
        (torch.ones(8, requires_grad=True) * 2).sum().backward()
    after = memscale.memory_stats(0)
    s = region.summary()
    mapped = after["num_map"] - before["num_map"]
    assert mapped >= 32 and s["granules_mapped"] == mapped, (s, before, after)
    assert running["granules_mapped"] == mapped
    assert s["granules_unmapped"] == after["num_unmap"] - before["num_unmap"]
    assert s["granules_remapped"] == after["num_remap"] - before["num_remap"]


def test_an_engine_counted_region_reports_no_granules() -> None:
    with memscale.dtr(None) as region:
        (torch.ones(8, requires_grad=True) * 2).sum().backward()
    s = region.summary()
    assert (s["granules_mapped"], s["granules_unmapped"], s["granules_remapped"]) == (0, 0, 0)


def test_the_summary_line_shows_remaps_per_step() -> None:
    s = memscale.Summary(steps=4, granules_mapped=120, granules_unmapped=40, granules_remapped=40)
    assert "allocator: 120 granules mapped, 40 unmapped, 40 remapped (10.0 per step)" in str(s)
    assert "granules" not in str(memscale.Summary(steps=4))
    merged = s.merged(memscale.Summary(steps=1, granules_remapped=2))
    assert merged.granules_remapped == 42 and merged.granules_mapped == 120


def test_block_level_dtr_reports_the_allocators_granules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Block-level DTR on a model on "device 0" with the memscale allocator
    (both stood in for on the CPU): its summary reports the granules the
    allocator mapped since the model's first training forward."""
    from _blocks_models import Net, batch

    monkeypatch.setattr("memscale._blocks.tracker.installed", lambda: object())
    monkeypatch.setattr("memscale._blocks.tracker.module_device_index", lambda model: 0)
    library = _lib.lib()
    model = Net()
    tracker = memscale.blocks(model, budget="1GiB")
    try:
        model(batch(0)).sum().backward()  # the first training forward: counting starts
        before = memscale.memory_stats(0)
        size = int(before["reserved_bytes.all.current"]) + 64 * MiB  # more than all that is cached: it maps
        ptr = library.memscale_malloc(size, 0, None)
        assert ptr, _lib.last_error()
        library.memscale_free(ptr, size, 0, None)
        after = memscale.memory_stats(0)
        s = tracker.summary()
    finally:
        tracker.detach()
    assert after["num_map"] - before["num_map"] > 0
    assert s["granules_mapped"] >= after["num_map"] - before["num_map"], s
    from memscale._blocks.drop_in import summary_of

    assert summary_of(tracker).granules_mapped == s["granules_mapped"]
