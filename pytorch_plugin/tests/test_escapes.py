"""What a training step hands back: plain tensors, whatever the API.

A tensor made inside a step and kept after it (an accuracy computed under
``no_grad`` and stored in a meter, a batch's predictions) is an ordinary
``torch.Tensor`` once the step's region exited; formatting, ``.numpy()``,
``.item()``, comparisons and pickling work on it, and on what still requires
grad (the loss), which stays a wrapper that behaves as its plain tensor.
Under :func:`memscale.dtr`, :func:`memscale.wrap` and :func:`memscale.enable`
(``memscale run``).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _helpers import is_region_tensor, region_kind, require_engine

torch = pytest.importorskip("torch")

require_engine()

import memscale  # noqa: E402
from memscale import Config  # noqa: E402

nn = torch.nn


def _model() -> Any:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def _train(model: Any, steps: int = 4) -> dict[str, Any]:
    """A loop that keeps what its steps computed: the loss, an accuracy made
    under no_grad, the predictions; and the type of the output inside the step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept: dict[str, Any] = {"acc": [], "loss": [], "pred": [], "inside": []}
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        with torch.no_grad():  # inside the step: it ends when its backward returns
            acc = (out.argmax(1) == y).float().mean() * 100
            pred = out.argmax(1)
        kept["inside"].append(region_kind(acc))
        loss.backward()
        opt.step()
        opt.zero_grad()
        kept["acc"].append(acc)
        kept["loss"].append(loss)
        kept["pred"].append(pred)
    return kept


@pytest.fixture(params=["wrap", "enable"])
def trained(request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    plain = _train(_model())
    if request.param == "wrap":
        model = memscale.wrap(_model(), Config(threshold="1GiB", log_summary=False))
        got = _train(model)
        memscale.detach(model)
    else:
        enabled = memscale.enable(Config(threshold="1GiB", log_summary=False))
        try:
            got = _train(_model())
        finally:
            enabled.disable()
    assert "region" in got["inside"], got["inside"]  # some steps ran in a region
    yield plain, got


def _each(kept: dict[str, Any], key: str) -> list[Any]:
    return list(kept[key])


def test_escaping_tensors_are_plain_tensors(trained: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, got = trained
    for t in got["acc"] + got["pred"]:
        assert type(t) is torch.Tensor


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda t: "{:6.2f}".format(t), id="format"),
        pytest.param(lambda t: f"{t:.3f}", id="f-string"),
        pytest.param(lambda t: t.numpy().tolist() if not t.requires_grad else t.detach().numpy().tolist(), id="numpy"),
        pytest.param(lambda t: t.item(), id="item"),
        pytest.param(lambda t: (bool(t > 10), bool(t == t), float(t)), id="compare"),
        pytest.param(lambda t: pickle.loads(pickle.dumps(t)).item(), id="pickle"),
        pytest.param(lambda t: _saved(t).item(), id="torch.save"),
    ],
)
def test_what_a_step_kept_reads_as_plainly(
    trained: tuple[dict[str, Any], dict[str, Any]], read: Callable[[Any], Any]
) -> None:
    plain, got = trained
    for key in ("acc", "loss"):
        for a, b in zip(_each(plain, key), _each(got, key), strict=True):
            assert read(b) == read(a), key


def test_predictions_compare_and_pickle_as_plainly(trained: tuple[dict[str, Any], dict[str, Any]]) -> None:
    plain, got = trained
    for a, b in zip(plain["pred"], got["pred"], strict=True):
        assert torch.equal(b, a)
        assert bool((b == a).all())
        assert pickle.loads(pickle.dumps(b)).tolist() == a.tolist()


def _saved(t: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(t, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_region_hands_back_plain_tensors() -> None:
    """``memscale.dtr``: what escapes without grad is a plain tensor (views
    share their base's storage still); what requires grad stays a wrapper
    that formats, reads and pickles as its plain tensor."""
    x = torch.randn(4, 4)
    w = torch.randn(4, requires_grad=True)
    with memscale.dtr(None):
        y = (x * 2).sum()
        z = x * 3
        v = z.view(16)
        g = (w * 2).sum()
    assert all(type(t) is torch.Tensor and not is_region_tensor(t) for t in (y, z, v))
    v.add_(1)
    assert torch.equal(z.view(16), v)
    assert f"{y:.4f}" == f"{(x * 2).sum():.4f}"
    assert is_region_tensor(g) and g.requires_grad
    assert f"{g:.4f}" == f"{(w * 2).sum():.4f}"
    assert pickle.loads(pickle.dumps(g)).item() == g.item()


def test_an_entry_that_failed_hands_back_nothing() -> None:
    """A region that exited with an error leaves its wrappers (their data may
    be gone): reading one raises a clear error or gives its data, never
    another tensor's."""
    x = torch.randn(4, 4)
    kept = []
    with pytest.raises(ValueError), memscale.dtr(None):
        kept.append(x * 2)
        raise ValueError("the step failed")
    assert is_region_tensor(kept[0])
    assert torch.equal(memscale.unwrap(kept[0]), x * 2)
