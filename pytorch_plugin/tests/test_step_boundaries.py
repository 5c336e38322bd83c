"""Where a drop-in training step ends, in the loops people write (issue 30).

A step runs from its first forward with gradients to the end of its backward
pass (``memscale._dropin.backward``), whatever updates the parameters next:
a hand-written SGD update, several optimizers in one iteration (a GAN), an
LBFGS closure, the micro-batches of gradient accumulation. Evaluation under
``no_grad`` / ``inference_mode`` between the backward and the update runs
outside any step, and a sampling forward with gradients joins the next step
instead of lasting to the next optimizer step. Every loop is compared bitwise
with the same loop run plainly, under ``memscale.enable()`` (what ``memscale
run`` does) and, where a single model trains, ``memscale.wrap``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from _helpers import region_kind, require_engine

torch = pytest.importorskip("torch")

require_engine()

import memscale  # noqa: E402
from memscale import Config  # noqa: E402

nn = torch.nn
F = torch.nn.functional
ROOMY = "1GiB"


def _mlp(depth: int = 1) -> Any:
    torch.manual_seed(0)
    hidden: list[Any] = []
    for i in range(depth):
        hidden += [nn.Linear(256, 256), nn.ReLU() if i % 2 == 0 else nn.Tanh()]
    return nn.Sequential(nn.Linear(32, 256), nn.Tanh(), *hidden, nn.Linear(256, 10))


def _batches(n: int, rows: int = 256) -> list[tuple[Any, Any]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, 32, generator=g), torch.randint(0, 10, (rows,), generator=g)) for _ in range(n)]


@contextmanager
def _under(api: str | None, threshold: str = ROOMY) -> Iterator[Callable[[Any], Any]]:
    """Yield ``hook(model) -> model``; the summary is read with :func:`_summary`."""
    config = Config(threshold=threshold, log_summary=False)
    if api is None:
        yield lambda model: model
    elif api == "enable":
        enabled = memscale.enable(config)
        try:
            yield lambda model: model
        finally:
            enabled.disable()
    else:
        wrapped: list[Any] = []

        def hook(model: Any) -> Any:
            wrapped.append(memscale.wrap(model, config))
            return model

        try:
            yield hook
        finally:
            for model in wrapped:
                memscale.detach(model)


def _summary(api: str, model: Any = None) -> Any:
    return memscale.summary() if api == "enable" else memscale.summary(model)


def _params(model: Any) -> list[Any]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# Hand-written SGD ----------------------------------------------------------


def _sgd_by_hand(model: Any, batches: list[Any], style: str, seen: list[str]) -> list[float]:
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        model.zero_grad()
        loss.backward()
        seen.extend(region_kind(p.grad) for p in model.parameters())
        if style == "data":  # the word-language-model example's update
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("style", ["data", "no_grad"])
@pytest.mark.parametrize("api", ["enable", "wrap"])
def test_a_hand_written_sgd_loop_is_a_step_per_batch(api: str, style: str) -> None:
    batches = _batches(5)
    plain = _mlp()
    plain_losses = _sgd_by_hand(plain, batches, style, [])
    seen: list[str] = []
    with _under(api) as hook:
        model = hook(_mlp())
        losses = _sgd_by_hand(model, batches, style, seen)
        summary = _summary(api, model)
    assert losses == plain_losses and _same(_params(plain), _params(model))
    assert summary.steps == len(batches), summary  # before: one step for the whole run
    assert set(seen) == {"plain"}, seen  # the update reads plain gradients


def test_a_hand_written_loop_under_half_its_peak_evicts_within_the_budget() -> None:
    """Before, the loop was one step: every batch's memory stayed pinned in it."""
    batches = _batches(4, rows=2048)
    plain = _mlp(8)
    plain_losses = _sgd_by_hand(plain, batches, "data", [])
    with _under("enable") as hook:
        _sgd_by_hand(hook(_mlp(8)), batches[:2], "data", [])
        peak = _summary("enable").peak_usage
    assert peak > 0
    budget = peak // 2
    with _under("enable", threshold=str(budget)) as hook:
        model = hook(_mlp(8))
        losses = _sgd_by_hand(model, batches, "data", [])
        s = _summary("enable")
    assert losses == plain_losses and _same(_params(plain), _params(model))
    assert s.steps == len(batches) and s.evictions > 0 and 0 < s.peak_usage <= budget, s


# Gradient accumulation -----------------------------------------------------


def _accumulating(model: Any, batches: list[Any], micro: int, kinds: list[str]) -> list[float]:
    losses = []
    for x, y in batches:
        model.zero_grad()
        for cx, cy in zip(x.chunk(micro), y.chunk(micro), strict=True):
            out = model(cx)
            kinds.append(region_kind(out))
            loss = F.cross_entropy(out, cy) / micro
            loss.backward()
            losses.append(loss.item())
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)
    return losses


@pytest.mark.parametrize("api", ["enable", "wrap"])
def test_gradient_accumulation_is_a_step_per_micro_batch(api: str) -> None:
    batches = _batches(3)
    plain = _mlp()
    plain_losses = _accumulating(plain, batches, 4, [])
    kinds: list[str] = []
    with _under(api) as hook:
        model = hook(_mlp())
        losses = _accumulating(model, batches, 4, kinds)
        summary = _summary(api, model)
    assert losses == plain_losses and _same(_params(plain), _params(model))
    assert summary.steps == 12, summary
    assert "region" in kinds, kinds  # the micro-batches ran in regions


# Several optimizers in one iteration: a GAN --------------------------------


class _G(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 16), nn.Tanh())

    def forward(self, z: Any) -> Any:
        return self.net(z)


class _D(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))

    def forward(self, x: Any) -> Any:
        return self.net(x).flatten()


def _gan(iterations: int, grads: list[str], sample_every: int = 0) -> tuple[list[float], list[Any]]:
    torch.manual_seed(0)
    g, d = _G(), _D()
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=1e-3, betas=(0.5, 0.999))
    fixed = torch.randn(4, 8)
    data = torch.Generator().manual_seed(3)
    losses = []
    for i in range(iterations):
        real = torch.randn(32, 16, generator=data).tanh()
        d.zero_grad()
        out = d(real)
        err_real = F.binary_cross_entropy_with_logits(out, torch.ones_like(out))
        err_real.backward()
        fake = g(torch.randn(32, 8))
        out = d(fake.detach())
        err_fake = F.binary_cross_entropy_with_logits(out, torch.zeros_like(out))
        err_fake.backward()
        opt_d.step()
        g.zero_grad()
        out = d(fake)
        err_g = F.binary_cross_entropy_with_logits(out, torch.ones_like(out))
        err_g.backward()
        grads.extend(region_kind(p.grad) for p in g.parameters())
        opt_g.step()
        losses += [err_real.item(), err_fake.item(), err_g.item()]
        if sample_every and i % sample_every == 0:
            sample = g(fixed)  # with gradients enabled, as the DCGAN example does
            losses.append(float(sample.detach().sum()))
    return losses, _params(g) + _params(d)


def test_a_gan_with_two_optimizers_is_a_step_per_backward() -> None:
    plain = _gan(3, [])
    grads: list[str] = []
    with _under("enable"):
        got = _gan(3, grads)
        summary = _summary("enable")
    assert got[0] == plain[0] and _same(got[1], plain[1])
    assert summary.steps == 9, summary
    # The generator's gradients come from a backward through the graph an
    # earlier step built: plain tensors too, before its optimizer reads them.
    assert set(grads) == {"plain"}, grads


def test_a_sampling_forward_with_gradients_joins_the_next_step() -> None:
    plain = _gan(4, [], sample_every=2)
    with _under("enable"):
        got = _gan(4, [], sample_every=2)
        summary = _summary("enable")
    assert got[0] == plain[0] and _same(got[1], plain[1])
    assert summary.steps == 12, summary  # the samples made no step of their own


# LBFGS ---------------------------------------------------------------------


def _lbfgs(model: Any, x: Any, y: Any, steps: int) -> list[float]:
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    calls = []

    def closure() -> Any:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        calls.append(loss.item())
        return loss

    for _ in range(steps):
        opt.step(closure)
    return calls


def test_lbfgs_closures_are_a_step_each() -> None:
    x, y = _batches(1)[0]
    plain = _mlp()
    plain_calls = _lbfgs(plain, x, y, 2)
    with _under("enable"):
        model = _mlp()
        calls = _lbfgs(model, x, y, 2)
        summary = _summary("enable")
    assert calls == plain_calls and _same(_params(plain), _params(model))
    assert summary.steps == len(calls), summary


# Evaluation between the backward and the update ----------------------------


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("api", ["enable", "wrap"])
def test_evaluation_after_the_backward_runs_outside_the_step(api: str, mode: str) -> None:
    batches = _batches(3)
    guard = torch.no_grad if mode == "no_grad" else torch.inference_mode

    def train(model: Any, kinds: list[str]) -> list[float]:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for x, y in batches:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            with guard():
                logits = model(x)
                kinds.append(region_kind(logits))
                out.append(float((logits.argmax(1) == y).float().mean()))
            opt.step()
        return out

    plain = _mlp()
    plain_acc = train(plain, [])
    kinds: list[str] = []
    with _under(api) as hook:
        model = hook(_mlp())
        acc = train(model, kinds)
        summary = _summary(api, model)
    assert acc == plain_acc and _same(_params(plain), _params(model))
    assert set(kinds) == {"plain"}, kinds  # before: the open step's region tensors
    # Under wrap a forward of the model without gradients is a step of its own
    # that closes when it returns; under enable() it opens none.
    assert summary.steps == len(batches) * (2 if api == "wrap" else 1), summary


# What does not end a step ---------------------------------------------------


def test_a_gradient_penalty_made_with_create_graph_stays_in_its_step() -> None:
    """``torch.autograd.grad(..., create_graph=True)`` builds a graph for the
    step's own backward: the step ends at that backward, not before."""

    def train(model: Any, kinds: list[str]) -> list[float]:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        losses = []
        for x, y in _batches(3):
            x = x.requires_grad_()
            opt.zero_grad()
            out = model(x)
            (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)
            kinds.append(region_kind(grad))
            loss = F.cross_entropy(out, y) + grad.pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    plain = _mlp()
    plain_losses = train(plain, [])
    kinds: list[str] = []
    with _under("enable"):
        model = _mlp()
        losses = train(model, kinds)
        summary = _summary("enable")
    assert losses == plain_losses and _same(_params(plain), _params(model))
    assert summary.steps == 3 and "region" in kinds, (summary, kinds)


def test_the_backward_wrapper_goes_with_the_last_step_owner() -> None:
    original = torch.autograd.backward, torch.autograd.grad
    with _under("enable"):
        assert torch.autograd.backward is not original[0]
        model = memscale.wrap(_mlp(), Config(threshold=ROOMY, log_summary=False))
        memscale.detach(model)
        assert torch.autograd.backward is not original[0]  # enable() still listens
        leaf = torch.ones(3, requires_grad=True)
        (leaf * 2).sum().backward()  # no step open: nothing to end
    assert (torch.autograd.backward, torch.autograd.grad) == original
    assert region_kind(leaf.grad) == "plain"
