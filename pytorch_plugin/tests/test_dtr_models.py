"""End to end: real models train under a DTR region on the CPU, bitwise as without it.

For each model (Hugging Face GPT-2 and BERT with small configs and random
weights, and a CNN with BatchNorm, in-place ReLU and dropout):

1. three training steps without memscale (the reference: loss, every parameter's
   gradient, BatchNorm's running statistics after each step);
2. the same three steps through ``memscale.dtr(None)``: the peak usage;
3. the same three steps under 50 % and 30 % of that peak.

Every run must give bitwise the same losses and gradients (``torch.equal``),
every budgeted run must have evicted and rematerialized, and the engine's peak
usage must never exceed the budget. The optimizer step runs after each region,
on the plain ``.grad`` tensors the region leaves behind. Dropout is active, so
replayed RNG ops are covered.

Runs against the real ``libmemscale.so`` (``MEMSCALE_LIBRARY`` or the repository
build); skipped when it lacks the engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _helpers import assert_same_steps, deadline

from memscale import MemscaleError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
nn = torch.nn

try:
    from memscale._native import engine as _engine
    from memscale import dtr

    _engine.dtr_lib()
except (ImportError, MemscaleError) as exc:  # pragma: no cover - without the engine
    pytest.skip(f"the DTR engine is unavailable: {exc}", allow_module_level=True)

STEPS = 3
FRACTIONS = (0.5, 0.3)


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    """No test may hang."""
    with deadline(600):
        yield


# --------------------------------------------------------------------- models


def _gpt2() -> tuple[nn.Module, Callable[[nn.Module, int], Any]]:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(
        n_layer=4, n_embd=64, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    data = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(1))

    def loss_fn(m: nn.Module, step: int) -> Any:
        return m(input_ids=data, labels=data).loss

    return model, loss_fn


def _bert() -> tuple[nn.Module, Callable[[nn.Module, int], Any]]:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.BertConfig(
        num_hidden_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=256,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(cfg)
    g = torch.Generator().manual_seed(2)
    data = torch.randint(0, 128, (8, 64), generator=g)
    labels = torch.where(torch.rand(8, 64, generator=g) < 0.3, data, torch.full_like(data, -100))

    def loss_fn(m: nn.Module, step: int) -> Any:
        return m(input_ids=data, labels=labels).loss

    return model, loss_fn


class _CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.Dropout(0.1),
            )

        # Deep enough that one block's working set is well under 30 % of the
        # step's peak (activations, not the largest op, dominate).
        self.body = nn.Sequential(
            block(3, 16),
            block(16, 16),
            block(16, 16),
            block(16, 16),
            block(16, 16),
            nn.MaxPool2d(2),
            block(16, 32),
            block(32, 32),
            block(32, 32),
        )
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: Any) -> Any:
        return self.head(self.body(x).flatten(1))


def _cnn() -> tuple[nn.Module, Callable[[nn.Module, int], Any]]:
    torch.manual_seed(0)
    model = _CNN()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 3, 16, 16, generator=g)
    y = torch.randint(0, 10, (16,), generator=g)

    def loss_fn(m: nn.Module, step: int) -> Any:
        return nn.functional.cross_entropy(m(x), y)

    return model, loss_fn


MODELS = {"gpt2": _gpt2, "bert": _bert, "cnn": _cnn}


# ---------------------------------------------------------------------- runs


def _train(
    make: Callable[[], tuple[nn.Module, Callable[[nn.Module, int], Any]]], region: Any = None
) -> list[dict[str, Any]]:
    """Three steps (seeded), SGD after each; what each step produced."""
    model, loss_fn = make()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(100 + step)
        if region is None:
            loss = loss_fn(model, step)
            loss.backward()
        else:
            with region:
                loss = loss_fn(model, step)
                loss.backward()
            out_stats = region.last_summary()
        grads = {}
        for name, p in model.named_parameters():
            assert type(p.grad) is torch.Tensor, f"{name}.grad is {type(p.grad).__name__} after the region"
            grads[name] = p.grad.clone()
        opt.step()  # after the region, on plain tensors
        record = {
            "loss": loss.detach().clone() if region is None else region.unwrap(loss).clone(),
            "grads": grads,
            "buffers": {n: b.clone() for n, b in model.named_buffers()},
            "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        }
        if region is not None:
            record["stats"] = out_stats
        out.append(record)
    return out



@pytest.mark.parametrize("model", sorted(MODELS))
def test_dtr_model_bitwise_under_budgets(model: str) -> None:
    make = MODELS[model]
    ref = _train(make)

    free = dtr(None)
    unbudgeted = _train(make, free)
    assert_same_steps(ref, unbudgeted, f"{model} unbudgeted")
    peak = free.summary()["peak_usage"]
    print(f"{model}: unbudgeted peak {peak} bytes")
    assert peak > 0
    assert free.summary()["evictions"] == 0

    for frac in FRACTIONS:
        budget = int(peak * frac)
        region = dtr(budget)
        got = _train(make, region)
        assert_same_steps(ref, got, f"{model} at {frac:.0%} of peak")
        s = region.summary()
        assert s["entries"] == STEPS
        assert s["evictions"] > 0, f"{model} at {frac:.0%}: nothing evicted ({s})"
        assert s["rematerializations"] > 0, f"{model} at {frac:.0%}: nothing rematerialized ({s})"
        assert 0 < s["peak_usage"] <= budget, f"{model} at {frac:.0%}: peak {s['peak_usage']} > budget {budget}"
        for step, rec in enumerate(got):
            st = rec["stats"]
            assert st["peak_usage"] <= budget, f"{model} step {step}: peak {st['peak_usage']} > {budget}"
        assert s["overhead"] >= 1.0
