"""A model under memscale saves, copies and gives its state like a plain one.

``torch.save(model)``, ``copy.deepcopy(model)`` and ``state_dict()`` of a model
under :func:`memscale.wrap`, :func:`memscale.enable` (``memscale run``, both
units) and :func:`memscale.blocks`: memscale's hooks on the model are
:class:`memscale._hooks.ModuleHook` objects, which pickle as a hook that does
nothing and never take memscale's state along. A deep copy is a plain model
(wrap, enable) or tracked by the same blocks (``blocks``), and trains bitwise
as the original's plain twin.
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from _helpers import require_engine

torch = pytest.importorskip("torch")

require_engine()

import memscale  # noqa: E402
from memscale import Config  # noqa: E402
from memscale._hooks import ModuleHook, detached_hook  # noqa: E402

nn = torch.nn


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.BatchNorm1d(16)

    def forward(self, x: Any) -> Any:
        return torch.relu(self.norm(self.lin(x))) + x


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block() for _ in range(4)])
        self.head = nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _net() -> _Net:
    torch.manual_seed(0)
    return _Net()


def _train(model: Any, steps: int = 2) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for i in range(steps):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


API = ["wrap", "enable", "enable-block", "blocks"]


@pytest.fixture(params=API)
def under(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    """A model that trained two steps under one of the APIs (still attached)."""
    api = request.param
    model = _net()
    if api == "wrap":
        memscale.wrap(model, Config(threshold="1GiB", log_summary=False))
        _train(model)
        yield api, model
        memscale.detach(model)
    elif api == "blocks":
        tracker = memscale.blocks(model, "1GiB")
        _train(model)
        yield api, model
        tracker.detach()
    else:
        unit = "block" if api == "enable-block" else "op"
        enabled = memscale.enable(Config(unit=unit, threshold="1GiB", log_summary=False))
        try:
            _train(model)
            yield api, model
        finally:
            enabled.disable()


def _hooks(model: Any) -> list[Any]:
    return [
        h
        for m in model.modules()
        for d in (m._forward_pre_hooks, m._forward_hooks)
        for h in d.values()
    ]


def test_memscale_put_hooks_on_the_model(under: tuple[str, Any]) -> None:
    _, model = under
    assert any(isinstance(h, ModuleHook) for h in _hooks(model))


def test_torch_save_of_the_model(under: tuple[str, Any]) -> None:
    _, model = under
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert all(h is detached_hook for h in _hooks(loaded))
    x = torch.randn(8, 16)
    model.eval()
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    pickle.dumps(model)


def test_state_dict_of_the_model(under: tuple[str, Any]) -> None:
    _, model = under
    state = model.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded.keys() == state.keys()
    for k, v in state.items():
        assert type(v) is torch.Tensor and torch.equal(loaded[k], v)
    plain = _net()
    plain.load_state_dict(state)


def test_deepcopy_of_the_model_trains_as_a_plain_twin(under: tuple[str, Any]) -> None:
    api, model = under
    twin = copy.deepcopy(model)
    plain = _net()
    plain.load_state_dict(model.state_dict())
    if api in ("blocks", "enable-block"):
        # Tracked by the same blocks: nothing of the tracker was copied.
        owners = {h.owner() for h in _hooks(twin) if isinstance(h, ModuleHook)}
        assert owners == {h.owner() for h in _hooks(model) if isinstance(h, ModuleHook)}
    else:
        assert not any(isinstance(h, ModuleHook) for h in _hooks(twin))
    assert _train(twin) == _train(plain)
