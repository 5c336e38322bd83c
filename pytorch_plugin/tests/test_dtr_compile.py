"""``torch.compile`` and DTR regions: compiled code runs eagerly inside a
region (every op recorded, so it can be evicted and rebuilt), compiled as
before outside it."""

from __future__ import annotations

from typing import Any

import pytest
from _helpers import require_engine

torch = pytest.importorskip("torch")
require_engine()

import memscale  # noqa: E402


class _CountingBackend:
    """A Dynamo backend that counts compilations and runs the graph as traced."""

    def __init__(self) -> None:
        self.compiled = 0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        self.compiled += 1
        return gm.forward


def _model() -> Any:
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(8):
        layers += [torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Dropout(0.1)]
    return torch.nn.Sequential(*layers)


def _step(model: Any, x: Any) -> Any:
    torch.manual_seed(1)
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach()


def _grads(model: Any) -> list[Any]:
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


def test_a_compiled_module_runs_eagerly_in_a_region_and_compiled_outside() -> None:
    model = _model()
    x = torch.randn(512, 256)
    ref_loss = _step(model, x)
    ref_grads = _grads(model)
    backend = _CountingBackend()
    compiled = torch.compile(model, backend=backend)
    measure = memscale.dtr(None)
    with measure:
        _step(compiled, x)
    model.zero_grad()
    assert backend.compiled == 0  # nothing traced inside a region
    region = memscale.dtr(int(measure.summary()["peak_usage"] * 0.5), heuristic="lru")
    for _ in range(2):
        with region:
            loss = _step(compiled, x)
        grads = _grads(model)
        assert torch.equal(memscale.unwrap(loss), ref_loss)
        assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))
    s = region.summary()
    assert s["evictions"] > 0 and s["peak_usage"] <= s["budget"]
    assert backend.compiled == 0
    loss = _step(compiled, x)  # outside: compiled as usual
    assert backend.compiled >= 1
    assert torch.equal(loss, ref_loss)
