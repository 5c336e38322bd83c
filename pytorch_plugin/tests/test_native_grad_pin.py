"""Gradients pinned once accumulated, on both regions.

A parameter's ``.grad`` outlives the step and the optimizer reads it: evicting
it would mean re-running the backward pass that produced it, so each region
pins it in the engine as soon as autograd accumulates it (the Python region
through ``_region/externals.py``'s hooks, the native one through a hook per
leaf that calls ``Session::pin_gradient``, ``_native/csrc/grad_pin.cpp``).
The engine counts those pins in the step's minimum budget
(``min_budget_parts["pinned_later"]``), so both regions report the same
minimum; a gradient evicted after its accumulation would be rebuilt at the
exit, which these tests see as rematerializations the exit added. The
program's own post-accumulate-grad hooks keep running beside the region's,
and training stays bitwise equal to plain PyTorch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import memscale
from _helpers import is_plain_tensor, is_region_tensor, native_region, require_engine, steady_clock

require_engine()


@pytest.fixture(autouse=True)
def _steady_costs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every op costs the same: the engine's victims depend on the program alone."""
    steady_clock(monkeypatch)
    yield


def _quickstart(width: int = 512, depth: int = 8) -> nn.Sequential:
    """samples/quickstart.py's MLP (``depth`` Linear+GELU blocks and a head)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def _grad_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _unbudgeted_step(model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """One quickstart step in ``dtr(None)``: the entry's summary."""
    region = memscale.dtr(budget=None)
    with region:
        model(x).pow(2).mean().backward()
    model.zero_grad(set_to_none=True)
    return region.summary()


# --- the minimum budget ------------------------------------------------------


@pytest.mark.skipif(not native_region(), reason="compares the native region with the Python one (MEMSCALE_NATIVE=1)")
def test_the_native_minimum_budget_counts_the_gradients_as_the_python_regions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the native region pinned gradients its quickstart minimum left
    them out: 16.0 MiB against the Python region's 21.0 (x drawn inside the
    entry, a pinned external on the native path only); with the input made
    outside both, the two regions' minimums are the same byte for byte."""
    model = _quickstart()
    x = torch.randn(1024, 512, generator=torch.Generator().manual_seed(1))
    native = _unbudgeted_step(model, x)
    monkeypatch.setenv("MEMSCALE_NATIVE", "0")
    python = _unbudgeted_step(model, x)
    assert native["min_budget_parts"]["pinned_later"] > 0, native["min_budget_parts"]
    assert native["min_budget_parts"] == python["min_budget_parts"]
    assert native["min_budget"] == python["min_budget"]


@pytest.mark.skipif(not native_region(), reason="compares the native region with the Python one (MEMSCALE_NATIVE=1)")
def test_the_two_minimum_budgets_agree_with_the_input_drawn_inside_the_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch drawn inside the entry is a region tensor on both paths (the
    native one took it as a pinned external, 2 MiB more, before factory ops
    reached it)."""

    def step() -> dict[str, Any]:
        model = _quickstart()
        region = memscale.dtr(budget=None)
        with region:
            x = torch.randn(1024, 512, generator=torch.Generator().manual_seed(1))
            model(x).pow(2).mean().backward()
        return region.summary()

    native = step()
    monkeypatch.setenv("MEMSCALE_NATIVE", "0")
    python = step()
    assert native["min_budget_parts"] == python["min_budget_parts"]
    assert native["min_budget"] == python["min_budget"]


def test_the_minimum_budget_counts_the_gradients_accumulated_before_the_largest_op() -> None:
    """The largest op of the quickstart step is the first layer's GELU
    backward: every gradient but the first layer's is pinned by then."""
    model = _quickstart()
    x = torch.randn(1024, 512, generator=torch.Generator().manual_seed(1))
    parts = _unbudgeted_step(model, x)["min_budget_parts"]
    first = model[0]
    assert parts["op"] == "gelu_backward", parts
    assert parts["pinned_later"] == _grad_bytes(model) - _grad_bytes(first), parts


# --- never evicted after accumulation ------------------------------------------


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))


def test_an_accumulated_gradient_stays_resident_under_a_tight_budget() -> None:
    """Under a budget the least recently used storage is the victim: after
    the backward that is a gradient unless gradients are pinned. The results
    made after the backward go instead, and the exit rebuilds nothing."""
    model = _model()
    x = torch.randn(512, 256, generator=torch.Generator().manual_seed(1))
    budget = 7 * x.nbytes  # the step's floor (2.5 MiB with the gradients) and room to spare
    region = memscale.dtr(budget=budget, heuristic="lru")
    with region:
        model(x).square().mean().backward()
        after_backward = region.summary()
        kept = [x * float(k + 2) for k in range(8)]  # 4 MiB: more than the budget holds
        before_exit = region.summary()
        del kept
    summary = region.summary()
    assert before_exit["evictions"] > after_backward["evictions"], "the results kept after the backward made room"
    assert before_exit["rematerializations"] == after_backward["rematerializations"]
    assert summary["rematerializations"] == before_exit["rematerializations"], "the exit rebuilt a gradient"
    assert summary["peak_usage"] <= budget


def _pinned_gradients(region: memscale.DTRRegion) -> int:
    """How many gradients the open entry of ``region`` pinned so far."""
    session: Any = region._session
    if region.native:
        return int(session.counters()["gradients_pinned"])
    return len(session.pinned_grads)


def test_the_gradients_of_a_graph_built_outside_the_entry_are_pinned() -> None:
    """A GAN's generator: its output was made outside the entry, whose ops
    never read the generator's parameters, yet the backward accumulates their
    gradients there - pinned like the others, once per version."""
    torch.manual_seed(0)
    gen, disc = nn.Linear(32, 64), nn.Linear(64, 1)
    z = torch.randn(16, 32)
    fake = gen(z)  # outside any entry
    region = memscale.dtr(budget=None)
    with region:
        disc(fake).square().mean().backward(retain_graph=True)
        assert _pinned_gradients(region) == 4  # both layers' weights and biases
        disc(fake).square().mean().backward()
        # Accumulated again, in place: each gradient's new version is pinned (on its pinned storage).
        assert _pinned_gradients(region) == 8
    assert all(is_plain_tensor(p.grad) for p in [*gen.parameters(), *disc.parameters()])


# --- the program's own hooks ---------------------------------------------------


def test_the_programs_post_accumulate_grad_hooks_still_run() -> None:
    """Hooks registered before and after the region's first entry run once
    per accumulation, see the gradient, and may change it in place; the
    region's own hook keeps pinning (its minimum counts the gradients), and is
    not registered again per entry."""
    model = _model()
    params = list(model.parameters())
    early: list[int] = []
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda q, i=i: early.append(i))

    def scale(q: torch.Tensor) -> None:
        assert q.grad is not None and (is_region_tensor(q.grad) or is_plain_tensor(q.grad))
        q.grad.mul_(0.5)  # a gradient clipping of sorts, in place

    def train(region: memscale.DTRRegion | None, steps: int) -> list[torch.Tensor]:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for step in range(steps):
            x = torch.randn(64, 256, generator=torch.Generator().manual_seed(step))
            if region is None:
                loss = model(x).square().mean()
                loss.backward()
            else:
                with region:
                    loss = model(x).square().mean()
                    loss.backward()
                assert region.last_summary()["engine"]["min_budget_parts"]["pinned_later"] > 0
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(loss.detach().clone())
        return out + [p.detach().clone() for p in model.parameters()]

    region = memscale.dtr(budget=None)
    train(region, 1)
    assert sorted(early) == list(range(len(params)))
    hooks_after_one = [len(p._post_accumulate_grad_hooks or {}) for p in params]
    late = [p.register_post_accumulate_grad_hook(scale) for p in params]
    torch.manual_seed(5)
    start = [p.detach().clone() for p in params]
    got = train(region, 3)
    assert len(early) == 4 * len(params), "the early hooks ran once per accumulation"
    assert [len(p._post_accumulate_grad_hooks or {}) for p in params] == [n + 1 for n in hooks_after_one]

    with torch.no_grad():
        for p, s in zip(params, start, strict=True):
            p.copy_(s)
    ref = train(None, 3)
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a, b), "the region's training differs from plain PyTorch's with the hooks"
    for h in late:
        h.remove()


def test_training_stays_bitwise_equal_to_plain_under_a_tight_budget() -> None:
    """The quickstart loop (smaller) under a budget near its floor and under
    the stress setting: the losses and parameters of every step are plain
    PyTorch's, bit for bit."""

    def train(region: memscale.DTRRegion | None) -> list[torch.Tensor]:
        model = _quickstart(width=128, depth=4)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        out = []
        for step in range(3):
            x = torch.randn(256, 128, generator=torch.Generator().manual_seed(step))
            if region is None:
                loss = model(x).pow(2).mean()
                loss.backward()
            else:
                with region:
                    loss = model(x).pow(2).mean()
                    loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.detach().clone())
            out.extend(p.detach().clone() for p in model.parameters())
        return out

    ref = train(None)
    probe = memscale.dtr(budget=None)
    train(probe)
    floor = probe.summary()["min_budget"]
    for region in (memscale.dtr(budget=int(floor * 1.05), heuristic="lru"), memscale.dtr(stress=True)):
        got = train(region)
        assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
        assert region.summary()["evictions"] > 0
