"""The engine's count of a budgeted region never passes the budget, on either path.

Runs on the region's path the environment chooses: the Python region under
``make test-python``, the native one under ``make test-native``
(``MEMSCALE_NATIVE=1``). Op costs are fixed (``steady_clock``), so each
budget's victims, and the peak, depend on the program alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import memscale
from _helpers import native_region, require_engine, steady_clock

require_engine()

CHANNELS = 1 << 14  # running statistics of 64 KiB each
ROWS = 8


@pytest.fixture(autouse=True)
def _steady(monkeypatch: pytest.MonkeyPatch) -> None:
    steady_clock(monkeypatch)


def _chain(x: torch.Tensor, links: int) -> list[torch.Tensor]:
    """Activations up to near the budget, all kept by the caller until its
    program returns."""
    kept = [x]
    for _ in range(links):
        kept.append(kept[-1] * 1.0001)
    return kept


def _overs(prepare: Callable[[], Callable[[], list[Any]]], budgets: range) -> list[str]:
    """Run the program ``prepare()`` returns (prepared outside any region:
    its module's parameters and buffers are the program's tensors) plainly,
    then in a region at each budget on the path the environment chooses:
    bitwise the plain results every time; returns the budgets the engine's
    peak count passed."""
    plain = prepare()()
    over = []
    for budget in budgets:
        program = prepare()
        region = memscale.dtr(budget)
        with region:
            got = program()
        assert region.native == native_region(), f"the entry ran on the {'native' if region.native else 'Python'} path"
        assert all(torch.equal(a, b) for a, b in zip(plain, got)), f"results differ at a budget of {budget} bytes"
        peak = int(region.summary()["peak_usage"])
        if peak > budget:
            over.append(f"budget {budget}: peak {peak} (+{peak - budget})")
    return over


def _batch_norm(x: torch.Tensor) -> Callable[[], list[Any]]:
    """Kept activations, then batch norm in training mode with running
    statistics made before the region (pinned, so their old data is copied
    before they are overwritten: the copies on write) and fresh results."""
    bn = torch.nn.BatchNorm1d(CHANNELS)

    def program() -> list[Any]:
        kept = _chain(x, 6)
        y = bn(kept[-1])
        return [y.sum(), bn.running_mean.clone(), bn.running_var.clone()]

    return program


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
    over = _overs(lambda: _batch_norm(x), range(5 * x.nbytes, 5 * x.nbytes + (1 << 20) + 1, 64 << 10))
    assert not over, "the engine's count passed the budget:\n" + "\n".join(over)


def _gradients(masks: list[list[bool]], x: torch.Tensor, w: torch.Tensor) -> list[Any]:
    """Kept activations, then ``convolution_backward`` on the same tensors
    with each output mask in turn: what it allocates depends on the mask
    (which gradients it computes) alone."""
    kept = _chain(x, 4)
    last = kept[-1]
    grad_out = torch.nn.functional.conv2d(last, w, padding=1)
    results: list[Any] = []
    for mask in masks:
        got = torch.ops.aten.convolution_backward(grad_out, last, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)
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
    over = _overs(lambda: lambda: _gradients(masks, x, w), range(6 * x.nbytes, 6 * x.nbytes + (512 << 10) + 1, 32 << 10))
    assert not over, "the engine's count passed the budget:\n" + "\n".join(over)
