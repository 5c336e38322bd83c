"""The native region's unboxed entries (csrc/unboxed.h, csrc/borrowed.h).

The most called operators reach the region through an unboxed entry that
boxes the program's tensors borrowed - no reference taken, so no GIL taken
to reference their Python objects. A borrowed tensor must leave the stack
without a decrement on every path: these tests check the program's tensors'
reference counts around each listed operator, on the paths that raise, and
the results bitwise against a plain run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import memscale
from _helpers import force_native, require_engine
from memscale._native import region_ext

require_engine()


_native = pytest.fixture(autouse=True)(force_native)


def _region(setting: str) -> memscale.DTRRegion:
    if setting == "stress":
        return memscale.dtr(None, stress=True)
    if setting == "budget":
        return memscale.dtr(1 << 40)
    return memscale.dtr(None)


def _inputs() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "x": torch.randn(8, 16),
        "w": torch.randn(16, 16),
        "b": torch.randn(16),
        "gamma": torch.randn(16),
        "beta": torch.randn(16),
        "ids": torch.randint(0, 16, (8,)),
        "mask": torch.rand(8, 16) > 0.5,
        "idx": torch.randint(0, 16, (8, 16)),
    }


# Each step: one listed operator (or a few) on the program's tensors, the
# region's results fed back in as later steps' inputs.
_STEPS: list[tuple[str, Callable[[dict[str, torch.Tensor]], torch.Tensor]]] = [
    ("add", lambda t: t["x"] + 1.0),
    ("add.Tensor", lambda t: t["y"] + t["x"]),
    ("sub", lambda t: t["y"] - t["x"]),
    ("mul twice the same", lambda t: t["y"] * t["y"]),
    ("mul.Scalar", lambda t: torch.mul(t["y"], 3)),
    ("div", lambda t: t["y"] / (t["x"].abs() + 1)),
    ("pow", lambda t: t["y"].pow(2)),
    ("addmm", lambda t: F.linear(t["y"], t["w"], t["b"])),
    ("mm", lambda t: t["y"] @ t["w"]),
    ("bmm", lambda t: torch.bmm(t["y"].view(2, 4, 16), t["y"].view(2, 4, 16).transpose(1, 2)).view(2, 16)),
    ("gelu", lambda t: F.gelu(t["y"])),
    ("relu", lambda t: F.relu(t["y"])),
    ("silu", lambda t: F.silu(t["y"])),
    ("tanh sigmoid exp neg rsqrt", lambda t: -torch.exp(torch.tanh(t["y"])) * torch.sigmoid(t["y"]) + (t["y"].abs() + 1).rsqrt()),
    ("softmax", lambda t: torch.softmax(t["y"], dim=-1)),
    ("layer_norm", lambda t: F.layer_norm(t["y"], (16,), t["gamma"], t["beta"])),
    ("dropout", lambda t: F.dropout(t["y"], 0.3, training=True)),
    ("embedding", lambda t: F.embedding(t["ids"], t["w"])),
    ("sum mean", lambda t: t["y"].sum(dim=0, keepdim=True) + t["y"].mean(dim=1, keepdim=True)),
    ("where masked_fill", lambda t: torch.where(t["mask"], t["y"], t["x"]).masked_fill(t["mask"], 0.5)),
    ("views", lambda t: t["y"].t().transpose(0, 1).permute(1, 0).t().view(16, 8).unsqueeze(0).squeeze(0).t()),
    ("select slice split expand", lambda t: t["y"][1:5].split(2)[1].select(0, 1).expand(8, 16) + t["y"]),
    ("clone to detach", lambda t: t["y"].clone().double().float().detach()),
    ("conv2d", lambda t: F.conv2d(t["y"].reshape(1, 2, 8, 8), t["w"].reshape(-1)[:36].reshape(2, 2, 3, 3), padding=1).reshape(8, 16)),
    ("max_pool2d", lambda t: F.max_pool2d(t["y"].reshape(1, 2, 8, 8), 3, stride=1, padding=1).reshape(8, 16)),
    ("avg_pool2d", lambda t: F.avg_pool2d(t["y"].reshape(1, 2, 8, 8), 3, stride=1, padding=1).reshape(8, 16)),
    ("cross_entropy", lambda t: t["y"] + F.cross_entropy(t["y"], t["ids"], reduction="none")[:, None]),
    ("baddbmm", lambda t: torch.baddbmm(t["y"].reshape(2, 4, 16), t["y"].reshape(2, 4, 16)[..., :8], t["w"][:8].expand(2, 8, 16)).reshape(8, 16)),
    ("tril pad", lambda t: F.pad(t["y"].tril(), (1, 1))[:, 1:-1]),
    ("attention", lambda t: F.scaled_dot_product_attention(*(t["y"].reshape(1, 2, 4, 16),) * 3).reshape(8, 16)),
    ("sqrt log abs sin cos", lambda t: torch.sqrt(t["y"].abs() + 1) + torch.log(t["y"].abs() + 1) * t["y"].sin() * t["y"].cos()),
    ("rsub clamp minimum maximum", lambda t: torch.minimum(1 - t["y"], t["x"]).clamp(-2, 2) + torch.maximum(t["y"], t["x"])),
    ("sum mean amax cumsum", lambda t: t["y"].cumsum(1) + t["y"].amax(dim=1, keepdim=True) + t["y"].sum() + t["y"].mean()),
    ("index_select gather", lambda t: t["y"].index_select(0, t["ids"] % 8) + t["y"].gather(1, t["idx"])),
    ("unbind split_with_sizes reshape", lambda t: torch.stack(t["y"].unbind(0)) + torch.cat(t["y"].split_with_sizes([6, 10], dim=1), dim=1) + t["y"].t().reshape(8, 16)),
    ("activations", lambda t: F.leaky_relu(t["y"], 0.1) + F.hardtanh(t["y"]) + F.softplus(t["y"]) + F.elu(t["y"]) + F.hardswish(t["y"]) + F.logsigmoid(t["y"])),
    ("mse_loss", lambda t: t["y"] + F.mse_loss(t["y"], t["x"], reduction="none")),
    ("group_norm rms_norm", lambda t: F.group_norm(t["y"].reshape(2, 4, 16), 2, t["gamma"][:4], t["beta"][:4]).reshape(8, 16) + F.rms_norm(t["y"], (16,), t["gamma"])),
    ("upsample_nearest2d", lambda t: F.interpolate(t["y"].reshape(1, 2, 4, 16), scale_factor=2.0, mode="nearest")[..., ::2, ::2].reshape(8, 16)),
    ("batch_norm in eval", lambda t: F.batch_norm(t["y"], t["beta"], t["gamma"].abs() + 1, t["gamma"], t["beta"], training=False)),
]


def _program(steps: list[tuple[str, Callable[[dict[str, torch.Tensor]], torch.Tensor]]]) -> Callable[[], Any]:
    def run() -> Any:
        t = _inputs()
        t["y"] = t["x"]
        outs = []
        for _, step in steps:
            t["y"] = step(t)
            outs.append(t["y"])
        return outs

    return run


def test_the_listed_operators_have_unboxed_entries() -> None:
    ext = region_ext.extension()
    assert ext is not None
    with memscale.dtr(None):  # the kernels are registered at the first entry
        torch.ones(2) + 1
    assert ext.unboxed_kernels() >= 60, "the listed operators should reach the region unboxed"
    assert ext.unboxed_kernels() < ext.registered_kernels()


def _reference_changes(region: memscale.DTRRegion | None) -> list[dict[str, int]]:
    """Per step, how the reference count of each of the program's tensors
    changed across it (a view's result keeps its base: +1 there)."""
    t = _inputs()
    changes = []
    with region if region is not None else contextlib.nullcontext():
        t["y"] = t["x"]
        for _, step in _STEPS:
            before = {k: v._use_count() for k, v in t.items()}
            torch.manual_seed(3)
            out = step(t)
            changes.append({k: v._use_count() - before[k] for k, v in t.items()})
            t["y"] = out
    return changes


@pytest.mark.parametrize("setting", ["unbudgeted", "stress", "budget"])
def test_borrowed_arguments_keep_the_programs_references(setting: str) -> None:
    """Around every listed operator the program's tensors - plain ones
    (externals) and region ones - keep the references they keep plainly."""
    plain = _reference_changes(None)
    r = _region(setting)
    got = _reference_changes(r)
    assert r.native
    for (name, _), a, b in zip(_STEPS, plain, got):
        assert a == b, f"{name}: reference count changes {a} plainly, {b} in the region"


@pytest.mark.parametrize("setting", ["unbudgeted", "stress", "budget"])
def test_listed_operators_are_bitwise(setting: str) -> None:
    def seeded() -> Any:
        torch.manual_seed(3)
        return _program(_STEPS)()

    torch.manual_seed(7)
    plain = seeded()
    r = _region(setting)
    with r:
        got = seeded()
        got = [g.clone() for g in got]
    assert r.native
    for (name, _), a, b in zip(_STEPS, plain, got):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def _bitwise_under_stress_and_budget(step: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]) -> None:
    """``step() -> (loss, gradients)`` plainly, then under the stress setting
    and under a budget on the native path: bitwise the same."""
    plain_loss, plain_grads = step()
    for r in (memscale.dtr(None, stress=True), memscale.dtr(1 << 40)):
        with r:
            loss, grads = step()
        assert r.native
        assert torch.equal(loss, plain_loss)
        assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))


def test_a_training_step_through_the_entries_is_bitwise() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4)
    )
    x = torch.randn(8, 16)

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        loss = torch.softmax(model(x), dim=-1).pow(2).mean()
        loss.backward()
        return loss.detach().clone(), [p.grad.clone() for p in model.parameters()]

    _bitwise_under_stress_and_budget(step)


def test_a_convolutional_step_with_attention_through_the_entries_is_bitwise() -> None:
    torch.manual_seed(0)
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3),
        torch.nn.Sigmoid(), torch.nn.AvgPool2d(2),
    )
    head = torch.nn.Linear(8, 5)
    x = torch.randn(4, 3, 12, 12)
    labels = torch.tensor([0, 3, 1, 4])
    params = [*conv.parameters(), *head.parameters()]

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        for p in params:
            p.grad = None
        h = conv(x).flatten(2).transpose(1, 2)  # (4, 4, 8): four positions of eight channels
        h = F.scaled_dot_product_attention(h, h, h, attn_mask=torch.ones(4, 4, dtype=torch.bool).tril())
        loss = F.cross_entropy(head(h.mean(dim=1)), labels)
        loss.backward()
        return loss.detach().clone(), [p.grad.clone() for p in params]

    _bitwise_under_stress_and_budget(step)


def test_a_step_through_more_families_entries_is_bitwise() -> None:
    """The backward kernels of the further entries: activations, losses,
    group normalization, nearest upsampling, batch normalization."""
    torch.manual_seed(0)
    body = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.GroupNorm(2, 4), torch.nn.LeakyReLU(0.1),
        torch.nn.Upsample(scale_factor=2.0, mode="nearest"), torch.nn.Conv2d(4, 4, 3, stride=2, padding=1),
        torch.nn.BatchNorm2d(4), torch.nn.ELU(), torch.nn.Hardswish(), torch.nn.Softplus(), torch.nn.Hardtanh(),
    )
    x = torch.randn(2, 2, 6, 6)
    target = torch.randn(2, 4, 6, 6)

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        body.zero_grad(set_to_none=True)
        body.train()
        h = body(x)
        loss = F.mse_loss(F.logsigmoid(h), target) + h.sqrt().nan_to_num().mean()
        loss.backward()
        return loss.detach().clone(), [p.grad.clone() for p in body.parameters()]

    _bitwise_under_stress_and_budget(step)


def test_an_error_leaves_borrowed_arguments_intact() -> None:
    """Errors raised while the program's tensors are borrowed - by the
    kernel (wrong shapes), or by the region before the kernel (no room to
    rebuild an evicted input) - leave them with their references and data."""
    from memscale._native.engine import NoRoomError

    w = torch.randn(256, 256)
    x = torch.randn(512, 256)
    w_copy, x_copy = w.clone(), x.clone()
    r = memscale.dtr(1 << 40)
    with r:
        h = torch.tanh(x @ w)
        h_copy = h.clone()
        counts = (w._use_count(), x._use_count(), h._use_count())
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            torch.mm(h, w[:3])
        assert (w._use_count(), x._use_count(), h._use_count()) == counts
        r.budget = 1 << 20  # below the inputs and one op's output
        with pytest.raises(NoRoomError):
            torch.tanh(h @ w)
        assert (w._use_count(), x._use_count(), h._use_count()) == counts
        r.budget = 1 << 40
        assert torch.equal(h, h_copy)
    assert torch.equal(w, w_copy) and torch.equal(x, x_copy)
