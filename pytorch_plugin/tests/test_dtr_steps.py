"""One region around many training steps, the optimizer inside it.

Every ``torch.optim`` optimizer step ends a step of the region (a fresh engine;
what the step leaves behind is resident and plain) and runs its update outside
DTR, so the engine's state is bounded by one step and parameters and optimizer
state stay plain tensors. Checked bitwise against the same loop without
memscale, for SGD with momentum, Adam and AdamW (foreach off and on), LBFGS
(a closure), and a manual update with ``DTRRegion.end_step``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from _helpers import require_engine

torch = pytest.importorskip("torch")

from memscale import MemscaleError, dtr, unwrap  # noqa: E402

require_engine()

STEPS = 6
Optim = Callable[[Any], Any]

OPTIMIZERS: dict[str, Optim] = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, foreach=False),
    "sgd-momentum-foreach": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3, foreach=False),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=1e-3, foreach=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=False),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
}


def _model() -> Any:
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(6):
        layers += [torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Dropout(0.1)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(128, 1))


def _batch(i: int) -> Any:
    return torch.randn(512, 128, generator=torch.Generator().manual_seed(i))


def _train(make_optimizer: Optim, region: Any = None, steps: int = STEPS) -> dict[str, Any]:
    model = _model()
    optimizer = make_optimizer(model.parameters())
    losses, grads, ops = [], [], []
    torch.manual_seed(1)
    with region if region is not None else contextlib.nullcontext():
        for i in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = model(_batch(i)).pow(2).mean()
            loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            optimizer.step()
            losses.append(unwrap(loss).detach().clone())  # read after the update
            if region is not None:
                ops.append(region.last_summary()["engine"]["ops"])
    return {"losses": losses, "grads": grads, "params": [p.detach().clone() for p in model.parameters()], "ops": ops}



_PEAK: dict[str, int] = {}


def _peak(name: str) -> int:
    if name not in _PEAK:
        region = dtr(None)
        _train(OPTIMIZERS[name], region, steps=2)
        _PEAK[name] = int(region.summary()["peak_usage"])
    return _PEAK[name]


def _assert_same(ref: dict[str, Any], got: dict[str, Any], what: str) -> None:
    for key in ("losses", "params"):
        for i, (a, b) in enumerate(zip(ref[key], got[key], strict=True)):
            assert torch.equal(a, b), f"{what}: {key}[{i}] differs"
    for step, (a, b) in enumerate(zip(ref["grads"], got["grads"], strict=True)):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), f"{what}: gradients of step {step} differ"


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_inside_one_region_is_bitwise_and_bounded(name: str) -> None:
    ref = _train(OPTIMIZERS[name])
    budget = _peak(name) // 2
    region = dtr(budget)
    got = _train(OPTIMIZERS[name], region)
    _assert_same(ref, got, f"{name} at 50 %")
    s = region.summary()
    assert s["evictions"] > 0 and s["rematerializations"] > 0, s
    assert 0 < s["peak_usage"] <= budget, s
    assert s["entries"] == STEPS + 1  # one engine per step, and the one after the last update
    later = got["ops"][1:]
    assert max(later) == min(later), f"the engine's graph changes from step to step: {got['ops']}"


def test_unbudgeted_region_stays_flat() -> None:
    region = dtr(None)
    got = _train(OPTIMIZERS["adamw"], region, steps=8)
    assert len(set(got["ops"][1:])) == 1, got["ops"]
    assert region.last_summary()["engine"]["tensors"] < 100


def test_a_closure_runs_its_forward_and_backward_under_dtr() -> None:
    def train(region: Any) -> list[Any]:
        model = _model()
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
        losses = []
        torch.manual_seed(1)
        with region if region is not None else contextlib.nullcontext():
            for i in range(3):
                x = _batch(i)

                def closure() -> Any:
                    optimizer.zero_grad()
                    loss = model(x).pow(2).mean()
                    loss.backward()
                    return loss

                losses.append(unwrap(optimizer.step(closure)).detach().clone())
        return losses + [p.detach().clone() for p in model.parameters()]

    ref = train(None)
    region = dtr(_peak("adamw") // 2)
    got = train(region)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
    assert region.summary()["evictions"] > 0


def test_a_manual_update_ends_its_step_by_hand() -> None:
    def train(region: Any) -> list[Any]:
        model = _model()
        torch.manual_seed(1)
        out = []
        with region if region is not None else contextlib.nullcontext():
            for i in range(4):
                model.zero_grad(set_to_none=True)
                loss = model(_batch(i)).pow(2).mean()
                loss.backward()
                if region is not None:
                    region.end_step()
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
                out.append(unwrap(loss).detach().clone())
        return out + [p.detach().clone() for p in model.parameters()]

    ref = train(None)
    region = dtr(_peak("adamw") // 2)
    got = train(region)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
    assert region.summary()["entries"] == 5
    with pytest.raises(MemscaleError, match="not entered"):
        region.end_step()


def test_regions_do_not_nest() -> None:
    """A region entered inside another is refused with a message that says so
    (its tensors would be the outer region's): issue 32's nested region."""
    import memscale

    with memscale.dtr(None):
        with pytest.raises(memscale.MemscaleError, match="regions do not nest"):
            with memscale.dtr(None):
                pass
        x = torch.ones(4, requires_grad=True)
        (x * 2).sum().backward()  # the outer region is intact
    assert torch.equal(x.grad, torch.full((4,), 2.0))


def test_a_scripts_own_region_is_the_step_under_enable() -> None:
    """Under memscale.enable() (memscale run), a loop that opens its own
    ``memscale.dtr()`` around forward and backward trains in that region, and
    the step opens none of its own: bitwise the plain loop."""
    import memscale

    def train(use_memscale: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for i in range(3):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
            if use_memscale:
                with memscale.dtr(None):
                    loss = model(x).pow(2).mean()
                    loss.backward()
            else:
                loss = model(x).pow(2).mean()
                loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(memscale.unwrap(loss).detach().clone())
        return losses

    plain = train(False)
    enabled = memscale.enable(memscale.Config(threshold="1GiB"))
    try:
        got = train(True)
    finally:
        enabled.disable()
    assert all(torch.equal(a, b) for a, b in zip(plain, got, strict=True))
    assert enabled.summary().steps == 0  # the script's regions were the steps
