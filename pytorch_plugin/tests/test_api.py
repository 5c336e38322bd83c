"""memscale.wrap / optimize / detach / summary on a small MLP (CPU).

Every wrapped run is compared with the same run without memscale: DTR may evict
and recompute, but the parameters after each optimizer step must be the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import memscale
from memscale import Config, MemscaleError

torch = pytest.importorskip("torch")
nn = torch.nn

try:
    from memscale._native import engine as _engine
    from memscale import dtr as _dtr  # noqa: F401

    _engine.dtr_lib()
except (ImportError, MemscaleError) as exc:  # pragma: no cover - until the engine lands
    pytest.skip(f"the DTR region or engine is unavailable: {exc}", allow_module_level=True)

STEPS = 3
#: The mode of the plumbing tests: 90 % of the baseline peak, so evictions must
#: happen but every engine heuristic can meet the budget.
MODE = "conservative"


@pytest.fixture(autouse=True)
def _detach_leftovers() -> Iterator[None]:
    """A failed test must not leave a step region open for the next ones."""
    yield
    from memscale._dropin import attached

    for obj, attachment in list(attached.attached.items()):
        if attachment.kind != "optimize":
            try:
                memscale.detach(obj)
            except MemscaleError:
                pass  # the test already failed; detach still removed everything


def _mlp(depth: int = 3) -> nn.Module:
    # Activations (batch 1024 x width 128) outweigh the parameters and their
    # gradients (which stay resident to the end of backward) many times. The
    # backward of one layer needs a few activations at once, so a budget of half
    # the baseline peak needs enough layers (depth 16) for that working set to be
    # a small share of the peak.
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(32, 128), nn.ReLU()]
    for i in range(depth - 1):
        layers += [nn.Linear(128, 128), nn.Tanh() if i % 2 == 0 else nn.ReLU()]
    layers.append(nn.Linear(128, 10))
    return nn.Sequential(*layers)


def _batches(n: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(1024, 32, generator=g), torch.randint(0, 10, (1024,), generator=g)) for _ in range(n)]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list, accumulate: int = 1) -> list[float]:
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        for chunk_x, chunk_y in zip(x.chunk(accumulate), y.chunk(accumulate), strict=True):
            loss = nn.functional.cross_entropy(model(chunk_x), chunk_y) / accumulate
            loss.backward()
            losses.append(loss.item())
        optimizer.step()
    return losses


def _reference(batches: list, accumulate: int = 1, depth: int = 3) -> tuple[nn.Module, list[float]]:
    model = _mlp(depth)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, _train(model, opt, batches, accumulate)


def _assert_same_params(a: nn.Module, b: nn.Module) -> None:
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert type(pb) is nn.Parameter, name
        torch.testing.assert_close(pa, pb, msg=lambda m, name=name: f"{name}: {m}")


def _check_summary(s: memscale.Summary, steps: int, mode: str = MODE) -> None:
    assert s.steps == steps
    assert s.baseline_peak is not None and s.baseline_peak > 0
    assert s.budget == Config(mode=mode).budget_for(s.baseline_peak)  # type: ignore[arg-type]
    assert s.evictions > 0, f"nothing evicted under half the baseline peak: {s}"
    assert s.bytes_evicted > 0
    assert s.overhead >= 1.0
    d = s.as_dict()
    assert d["steps"] == steps and "overhead" in d and "bytes_saved" in d
    assert "evictions" in str(s)


def test_wrap_module_matches_plain_training() -> None:
    batches = _batches()
    reference, ref_losses = _reference(batches, depth=16)
    model = memscale.wrap(_mlp(16), Config(mode="aggressive", log_summary=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = _train(model, opt, batches)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    _assert_same_params(reference, model)
    _check_summary(memscale.summary(model), STEPS, "aggressive")
    memscale.detach(model)


def test_wrap_with_gradient_accumulation_is_one_step_per_backward() -> None:
    """Each micro-batch's forward and backward is a step (its region ends with
    its backward pass); the gradients accumulate in plain tensors between them."""
    batches = _batches()
    reference, _ = _reference(batches, accumulate=2)
    model = memscale.wrap(_mlp(), Config(mode=MODE, log_summary=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, opt, batches, accumulate=2)
    _assert_same_params(reference, model)
    assert memscale.summary(model).steps == 2 * STEPS
    memscale.detach(model)


def test_no_grad_forward_closes_its_region() -> None:
    model = memscale.wrap(_mlp(), Config(log_summary=False))
    x, _ = _batches(1)[0]
    with torch.no_grad():
        out = model(x)
    torch.testing.assert_close(out, _mlp()(x))
    assert memscale.summary(model).steps == 1
    memscale.detach(model)


class _EncoderDecoder(nn.Module):
    """A model trained through its parts (as a VAE's encode/decode or a GAN's
    generator and discriminator): ``forward`` is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = _mlp(8)
        self.decoder = nn.Sequential(nn.Linear(10, 128), nn.Tanh(), nn.Linear(128, 10))


def _train_parts(model: _EncoderDecoder, batches: list) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model.decoder(model.encoder(x)), y)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


def test_a_loop_that_calls_the_models_parts_is_stepped() -> None:
    batches = _batches()
    torch.manual_seed(0)
    reference = _EncoderDecoder()
    ref_losses = _train_parts(reference, batches)
    torch.manual_seed(0)
    model = memscale.wrap(_EncoderDecoder(), Config(mode=MODE, log_summary=False))
    losses = _train_parts(model, batches)
    assert losses == ref_losses
    for a, b in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    _check_summary(memscale.summary(model), STEPS)
    memscale.detach(model)


def test_a_childs_no_grad_forward_inside_a_step_leaves_it_open() -> None:
    model = memscale.wrap(_EncoderDecoder(), Config(threshold="1GiB", log_summary=False))
    x, _ = _batches(1)[0]
    with torch.no_grad():
        model.decoder(model.encoder(x))  # the encoder opens and closes a no-grad step, then the decoder
    assert memscale.summary(model).steps == 2
    out = model.encoder(x)  # a step with gradients: open until the optimizer step
    with torch.no_grad():
        model.decoder(torch.zeros(4, 10))  # a no-grad forward of another part: the step stays open
    from memscale._dropin import attached

    assert attached.attached[model].steps.is_open
    out.sum().backward()
    memscale.end_step(model)
    assert memscale.summary(model).steps == 3
    memscale.detach(model)


class _FailsInBackward(torch.autograd.Function):
    """Identity whose backward raises while ``armed`` (an out-of-memory error
    in backward, say, that the training loop catches)."""

    armed = False

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        if _FailsInBackward.armed:
            raise RuntimeError("out of memory (simulated) in backward")
        return grad


class _Fragile(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FailsInBackward.apply(self.body(x * 2.0))


@pytest.mark.parametrize("mode", ["conservative", None])
def test_a_step_whose_backward_raised_is_over_when_the_loop_goes_on(mode: str | None) -> None:
    """The loop catches the error of a failed backward, makes plain tensors,
    and trains on: nothing after the error runs inside the failed step (plain
    tensors stay plain, whatever the budget), and the next forward starts a
    new step, bitwise the plain loop's."""
    batches = _batches(3)

    def loop(model: nn.Module) -> list[Any]:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        seen = []
        for i, (x, y) in enumerate(batches):
            opt.zero_grad()
            _FailsInBackward.armed = i == 1
            try:
                nn.functional.cross_entropy(model(x), y).backward()
            except RuntimeError as exc:
                assert "simulated" in str(exc)
                made = torch.ones(4096, 64) * 3.0  # after the error: the program's own work
                w = torch.ones(8, requires_grad=True)
                (w * 2.0).sum().backward()  # a backward of its own, too
                seen.append((type(made), made.sum().item(), type(w.grad)))
                continue
            finally:
                _FailsInBackward.armed = False
            opt.step()
        return seen

    torch.manual_seed(0)
    reference = _Fragile()
    ref_seen = loop(reference)
    torch.manual_seed(0)
    config = Config(mode=mode, log_summary=False) if mode else Config(threshold="1TiB", log_summary=False)
    model = memscale.wrap(_Fragile(), config)
    seen = loop(model)
    assert seen == ref_seen == [(torch.Tensor, 4096 * 64 * 3.0, torch.Tensor)]
    _assert_same_params(reference, model)
    assert memscale.summary(model).steps == 3
    memscale.detach(model)


def test_detach_restores_the_model() -> None:
    model = _mlp()
    pre, post = len(model._forward_pre_hooks), len(model._forward_hooks)
    memscale.wrap(model, Config(mode=MODE, log_summary=False))
    assert len(model._forward_pre_hooks) == pre + 1
    assert all(len(child._forward_pre_hooks) == 1 for child in model.children())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, _batches(2))
    assert memscale.detach(model) is model
    assert (len(model._forward_pre_hooks), len(model._forward_hooks)) == (pre, post)
    final = memscale.summary(model)
    assert final.steps == 2
    _train(model, opt, _batches(1))  # plain training again
    assert memscale.summary(model).steps == 2
    with pytest.warns(UserWarning, match="not wrapped"):
        assert memscale.detach(model) is model  # as memscale 0.1: a warning, not an error


def test_wrap_errors() -> None:
    model = memscale.wrap(_mlp(), Config(log_summary=False))
    with pytest.raises(MemscaleError, match="already wrapped"):
        memscale.wrap(model)
    with pytest.raises(MemscaleError, match="already wrapped"):
        with memscale.optimize(model, torch.optim.SGD(model.parameters(), lr=0.1)):
            pass
    memscale.detach(model)
    with pytest.raises(MemscaleError, match="expected a torch.nn.Module, a transformers.Trainer or a Lightning Trainer"):
        memscale.wrap(object())
    with pytest.raises(MemscaleError, match="expected a memscale.Config"):
        memscale.wrap(_mlp(), config={"mode": "balanced"})  # type: ignore[arg-type]
    with pytest.raises(MemscaleError, match="never wrapped"):
        memscale.summary(_mlp())


def test_end_step_for_a_loop_without_an_optimizer() -> None:
    batches = _batches()
    reference = _mlp()
    model = memscale.wrap(_mlp(), Config(mode=MODE, log_summary=False))
    for net, wrapped in ((reference, False), (model, True)):
        for x, y in batches:
            net.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            if wrapped:
                memscale.end_step(net)
            with torch.no_grad():
                for p in net.parameters():
                    p -= 0.1 * p.grad
    _assert_same_params(reference, model)
    assert memscale.summary(model).steps == STEPS
    memscale.detach(model)


def test_optimize_context_matches_plain_training() -> None:
    batches = _batches()
    reference, ref_losses = _reference(batches)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with memscale.optimize(model, opt, Config(mode=MODE, log_summary=False)) as run:
        losses = _train(model, opt, batches)
        assert memscale.summary(model).steps == STEPS
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    _assert_same_params(reference, model)
    _check_summary(run.summary(), STEPS)
    assert memscale.summary(run).steps == STEPS
    assert not model._forward_pre_hooks and not model._forward_hooks
    with pytest.raises(MemscaleError, match="never wrapped"):
        memscale.summary(model)


def test_optimize_with_explicit_device_memory() -> None:
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    config = Config(mode="balanced", device_memory="64MiB", log_summary=False)
    with memscale.optimize(model, opt, config) as run:
        _train(model, opt, _batches())
    s = run.summary()
    assert s.baseline_peak is None and s.bytes_saved is None
    assert s.budget == config.budget_for(64 * 1024**2)
    assert s.steps == STEPS


def test_optimize_cleans_up_after_an_exception() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="boom"):
        with memscale.optimize(model, opt, Config(log_summary=False)):
            model(torch.randn(4, 32))
            raise RuntimeError("boom")
    assert not model._forward_pre_hooks and not model._forward_hooks
    _train(model, opt, _batches(1))  # still trains normally


def test_summary_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level("INFO", logger="memscale"):
        with memscale.optimize(model, opt, Config(mode=MODE)):
            _train(model, opt, _batches(2))
    assert any("memscale optimize" in r.getMessage() and "evictions" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("make_optimizer", [lambda p: torch.optim.SGD(p, lr=0.05), lambda p: torch.optim.AdamW(p)])
def test_wrap_with_other_optimizers(make_optimizer: Callable) -> None:
    batches = _batches()
    reference = _mlp()
    _train(reference, make_optimizer(reference.parameters()), batches)
    model = memscale.wrap(_mlp(), Config(mode=MODE, log_summary=False))
    _train(model, make_optimizer(model.parameters()), batches)
    _assert_same_params(reference, model)
    memscale.detach(model)


def test_other_models_optimizer_does_not_close_the_region() -> None:
    model = memscale.wrap(_mlp(), Config(log_summary=False))
    other = nn.Linear(3, 3)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    x, y = _batches(1)[0]
    loss = nn.functional.cross_entropy(model(x), y)
    other(torch.randn(2, 3)).sum().backward()
    other_opt.step()  # not the wrapped model's optimizer: its step stays open
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert memscale.summary(model).steps == 1
    memscale.detach(model)


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"swaps_out": 3, "swaps_in": 3, "parked": 2}, "3 swaps out / 3 in (2 parked), compute overhead"),
        ({"swaps_out": 3, "swaps_in": 1}, "3 swaps out / 1 in, compute overhead"),
        ({}, "0 swaps out / 0 in, compute overhead"),
    ],
)
def test_summary_line_names_parked_tensors(fields: dict[str, int], text: str) -> None:
    s = memscale.Summary(steps=1, **fields)
    assert text in str(s)
    assert s.as_dict()["parked"] == fields.get("parked", 0)


def test_a_wrapped_module_dropped_without_detach_takes_its_hooks_with_it() -> None:
    """A program that wraps a model and drops it without detach() leaves no
    backward listener behind: torch.autograd.backward is the original again
    (a listener left there kept every later test's originals wrapped)."""
    import gc

    from memscale._dropin import backward

    original = torch.autograd.backward
    model = memscale.wrap(_mlp(), Config(threshold="1GiB", log_summary=False))
    assert torch.autograd.backward is not original and backward._listeners
    model(torch.randn(4, 32)).sum().backward()
    del model
    gc.collect()
    assert not backward._listeners
    assert torch.autograd.backward is original
