"""The engine's count of a budgeted region never passes the budget, on either path.

Runs on the region's path the environment chooses: the Python region under
``make test-python``, the native one under ``make test-native``
(``MEMSCALE_NATIVE=1``). Op costs are fixed (``steady_clock``), so each
budget's victims, and the peak, depend on the program alone.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import memscale
from _helpers import require_engine, steady_clock

require_engine()

CHANNELS = 1 << 14  # running statistics of 64 KiB each
ROWS = 8


@pytest.fixture(autouse=True)
def _steady(monkeypatch: pytest.MonkeyPatch) -> None:
    steady_clock(monkeypatch)


def _program(bn: torch.nn.BatchNorm1d, x: torch.Tensor, links: int) -> list[Any]:
    """A chain of kept activations up to near the budget, then batch norm in
    training mode: it overwrites its running statistics (pinned, so their old
    data is copied first: the copies on write) and allocates fresh results."""
    kept = [x]
    for _ in range(links):
        kept.append(kept[-1] * 1.0001)
    y = bn(kept[-1])
    return [y.sum(), bn.running_mean.clone(), bn.running_var.clone()]


def test_copies_on_write_and_the_ops_results_share_one_room() -> None:
    """Batch norm's copies of its running statistics (two, 64 KiB each) and
    its results (512 KiB and its saved statistics) need room together: each
    room made for one of them must count the others already allocated. Before
    that each copy's room was taken again by the next (and by the results), and
    registering the copies after the op put the engine's count up to 128 KiB
    over the budget. Swept over budgets so that some leave less slack than the
    copies need when batch norm starts."""
    torch.manual_seed(0)
    x = torch.randn(ROWS, CHANNELS)
    activation = x.nbytes
    native = os.environ.get("MEMSCALE_NATIVE") == "1"
    bn = torch.nn.BatchNorm1d(CHANNELS)
    plain = _program(bn, x, 6)
    over = []
    for slack_kib in range(0, 1024 + 1, 64):
        bn = torch.nn.BatchNorm1d(CHANNELS)
        budget = 5 * activation + slack_kib * 1024
        region = memscale.dtr(budget)
        with region:
            got = _program(bn, x, 6)
        assert region.native == native, f"the entry ran on the {'native' if region.native else 'Python'} path"
        assert all(torch.equal(a, b) for a, b in zip(plain, got)), f"results differ at a budget of {budget} bytes"
        peak = int(region.summary()["peak_usage"])
        if peak > budget:
            over.append(f"budget {budget}: peak {peak} (+{peak - budget})")
    assert not over, "the engine's count passed the budget:\n" + "\n".join(over)


def _gradients(masks: list[list[bool]], x: torch.Tensor, w: torch.Tensor, links: int) -> list[Any]:
    """Kept activations up to near the budget, then ``convolution_backward``
    on the same tensors with each output mask in turn: what it allocates
    depends on the mask (which gradients it computes) alone."""
    kept = [x]
    for _ in range(links):
        kept.append(kept[-1] * 1.0001)
    grad_out = torch.nn.functional.conv2d(kept[-1], w, padding=1)
    results: list[Any] = []
    for mask in masks:
        got = torch.ops.aten.convolution_backward(
            grad_out, kept[-1], w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask
        )
        results += [t.sum() for t in got if t is not None]
    return results


def test_a_bool_list_argument_is_part_of_what_an_op_allocates() -> None:
    """The bytes an op allocates are learned per argument signature; a bool
    list (the output mask: which gradients to compute) is part of it. When its
    values were left out, the mask computing only the weight's gradient taught
    the one computing the input's too to expect as little, and its results went
    to the engine without room (12 KB over in the zoo's GAN)."""
    torch.manual_seed(0)
    x = torch.randn(4, 16, 32, 32)
    w = torch.randn(16, 16, 3, 3)
    masks = [[False, True, False], [True, True, False]]
    plain = _gradients(masks, x, w, 4)
    native = os.environ.get("MEMSCALE_NATIVE") == "1"
    over = []
    for slack_kib in range(0, 512 + 1, 32):
        budget = 6 * x.nbytes + slack_kib * 1024
        region = memscale.dtr(budget)
        with region:
            got = _gradients(masks, x, w, 4)
        assert region.native == native
        assert all(torch.equal(a, b) for a, b in zip(plain, got)), f"results differ at a budget of {budget} bytes"
        peak = int(region.summary()["peak_usage"])
        if peak > budget:
            over.append(f"budget {budget}: peak {peak} (+{peak - budget})")
    assert not over, "the engine's count passed the budget:\n" + "\n".join(over)
