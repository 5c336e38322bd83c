"""Block-level DTR (memscale.blocks): bitwise training under budgets, what it
frees, the state a recompute replays, and the errors."""

from __future__ import annotations

import copy
import gc
import weakref
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import memscale
from memscale._blocks import BlockDTR, find_blocks
from memscale.errors import ConfigError, MemscaleError

from _blocks_models import Block, Net, assert_bitwise, batch, largest_block, train
from _helpers import require_engine, steady_clock

require_engine()


@pytest.fixture(autouse=True)
def _steady_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block call costs the same (the engine's choices depend on the
    program alone, never on the machine's load)."""
    steady_clock(monkeypatch)


@pytest.mark.parametrize(
    ("norm", "budget", "evicts"),
    [
        (False, "100%", False),
        (False, "50%", True),
        (False, "25%", True),
        (True, "50%", True),  # batch norm: running statistics updated once per call
        (True, "25%", True),
    ],
)
def test_training_is_bitwise_under_every_budget(norm: bool, budget: str, evicts: bool) -> None:
    torch.manual_seed(0)
    base = Net(norm=norm)
    ref = train(copy.deepcopy(base), steps=4)
    model = copy.deepcopy(base)
    tracker = memscale.blocks(model, budget)
    got = train(model, steps=4)
    assert_bitwise(ref, got)
    s = tracker.summary()
    assert s["blocks"] == 4 and s["block_calls"] == 16
    assert s["steps"] == 4 or (s["steps"] == 3 and s["block_calls"] == 16)  # the last step ends at the next forward
    assert s["first_step_peak"] > 0 and s["budget"] > 0
    if evicts:
        assert s["evictions"] > 0 and s["rematerializations"] > 0
        assert s["peak_usage"] <= s["budget"] + s["largest_block"]
    else:
        assert s["evictions"] == 0 and s["rematerializations"] == 0
    tracker.detach()


def test_a_byte_budget_binds_from_the_first_step_and_dropout_replays() -> None:
    torch.manual_seed(0)
    base = Net(p=0.5)
    ref = train(copy.deepcopy(base))
    model = copy.deepcopy(base)
    block = largest_block(model, batch(0))
    with memscale.blocks(model, f"{block + block // 2}B") as tracker:
        got = train(model)
    assert_bitwise(ref, got)
    s = tracker.summary()
    assert s["first_step_peak"] == 0  # a byte budget: no measuring step
    assert s["evictions"] >= 3 * 3 and s["rematerializations"] == 3 * 3
    assert s["largest_block"] == block and s["peak_usage"] <= 2 * block + block // 2
    # Later steps make room before each block runs (its size is known): within the budget.
    assert s["last_step_peak"] <= block + block // 2
    # detached: the hooks are gone, training runs plainly
    before = tracker.summary()["block_calls"]
    train(model, steps=1)
    assert tracker.summary()["block_calls"] == before


def test_evicted_activations_are_freed_and_released_after_backward() -> None:
    torch.manual_seed(0)
    model = Net()
    block = largest_block(model, batch(0))
    tracker = BlockDTR(model, block + block // 2)  # room for one block's activations, not two
    loss = model(batch(0))
    units = list(tracker._units.values())
    assert len(units) == 4 and sum(u.resident for u in units) == 1
    assert units[-1].resident  # the engine kept the block backward needs first
    kept = [weakref.ref(t) for u in units[:-1] for t in u.saved if t is not None]
    assert all(r() is None for r in kept)  # the evicted blocks' activations are gone from memory
    freed = [u for u in units if not u.resident]
    assert all(t is None for u in freed for k, t in enumerate(u.saved) if k not in u.shared)
    loss.backward()
    del loss
    tracker._flush()
    assert tracker._engine is None and not tracker._units  # the step is over: every unit released
    s = tracker.summary()
    assert s["steps"] == 1 and s["evictions"] >= 3 and s["rematerializations"] == 3
    # The first step has no sizes to make room for ahead: over by one block at most.
    assert s["peak_usage"] <= tracker.budget + block


def test_budget_below_one_block_names_the_least_that_works() -> None:
    torch.manual_seed(0)
    model = Net()
    memscale.blocks(model, 1024)
    with pytest.raises(MemscaleError, match=r"budget 1\.00 KiB cannot hold the activations of layers\.\d .*raise it to at least"):
        model(batch(0)).backward()


def test_input_changed_in_place_after_the_block_cannot_be_recomputed() -> None:
    class Mutates(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Block(16) for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x * 1.0
            a = self.layers[0](h)
            h.add_(1.0)  # the first block's input, changed after it ran
            return self.layers[1](a + h).sum()

    torch.manual_seed(0)
    model = Mutates()
    x = torch.randn(64, 16)
    memscale.blocks(model, largest_block(model, x) + 1)
    with pytest.raises(MemscaleError, match=r"activations of layers\.0 were evicted.*changed in place"):
        model(x).backward()


class _Varies(nn.Module):
    """Saves ``depth(call)`` tanh layers' tensors on its ``call``-th run, and
    counts how far its forward gets (``finished``)."""

    def __init__(self, depth: Any) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.depth = depth
        self.calls = 0
        self.finished = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        for _ in range(self.depth(self.calls)):  # state of its own
            x = torch.tanh(self.fc(x)) * 2.0
        out = x + 1.0  # saves nothing: past the last saved tensor
        self.finished += 1
        return out


class _TwoVarying(nn.Module):
    def __init__(self, depth: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Varies(depth), _Varies(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[1](self.layers[0](x)).sum()


def test_a_block_that_saves_fewer_tensors_when_recomputed_is_refused() -> None:
    model = _TwoVarying(lambda call: 2 if call == 1 else 1)
    x = torch.randn(64, 16)
    memscale.blocks(model, largest_block(model, x) + 1)  # room for one block's activations
    with pytest.raises(MemscaleError, match="does not repeat"):
        model(x).backward()


def test_a_recompute_stops_after_the_last_saved_tensor() -> None:
    # The first run saved n tensors; the recompute ends its forward at the
    # n-th (PyTorch checkpoint's early stop): the code after it - here the
    # "+ 1.0" and the counter, and the extra layers a stateful block would
    # run - does not run again, and the tensors are the first run's.
    plain = _TwoVarying(lambda call: 1)
    plain.load_state_dict(model_state := _TwoVarying(lambda call: 1).state_dict())
    x = torch.randn(64, 16)
    plain(x).backward()
    model = _TwoVarying(lambda call: call)  # would save more on every later call
    model.load_state_dict(model_state)
    room = largest_block(_TwoVarying(lambda call: 1), x) + 1
    tracker = memscale.blocks(model, room)  # room for one block: the first is recomputed
    model(x).backward()
    assert tracker.summary()["rematerializations"] == 1
    first = model.layers[0]
    assert (first.calls, first.finished) == (2, 1)  # recomputed, stopped before the end
    for p, q in zip(plain.parameters(), model.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_evaluation_and_no_grad_are_not_tracked() -> None:
    model = Net()
    tracker = memscale.blocks(model, "50%")
    with torch.no_grad():
        model(batch(0))
    assert tracker.summary()["block_calls"] == 0


def test_a_forward_that_raises_leaves_nothing_behind() -> None:
    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Block(16) for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.layers[0](x)
            return self.layers[1](x[:, :3])  # wrong width: raises inside the block

    torch.manual_seed(0)
    model = Fails()
    tracker = memscale.blocks(model, "50%")
    with pytest.raises(RuntimeError) as info:
        model(torch.randn(8, 16))
    del info  # its traceback holds the first block's graph
    gc.collect()
    tracker._flush()
    assert tracker._open == 0 and tracker._engine is None
    # The saved-tensor hooks were popped: a plain graph saves plain tensors.
    seen: list[Any] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        nn.Linear(4, 1)(torch.randn(2, 4)).sum().backward()
    assert seen and all(isinstance(t, torch.Tensor) for t in seen)
    assert tracker.summary()["block_calls"] == 1


@pytest.mark.parametrize("budget", [-1, "lots", "0%", 0, "150%"])
def test_malformed_budgets_are_refused(budget: Any) -> None:
    with pytest.raises(ConfigError, match="budget"):
        memscale.blocks(Net(), budget)


def test_find_blocks() -> None:
    names = [n for n, _ in find_blocks(Net(depth=3))]
    assert names == ["layers.0", "layers.1", "layers.2"]
    with pytest.raises(ConfigError, match="modules="):
        find_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    model = Net(depth=2)
    tracker = memscale.blocks(model, "50%", modules=[model.layers[1]])
    assert [n for n, _ in tracker.blocks] == ["layers.1"]
    with pytest.raises(ConfigError, match=r"modules=\[\]"):
        memscale.blocks(model, "50%", modules=[])


def test_gpt2_trains_bitwise_and_its_cache_is_turned_off() -> None:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, n_positions=32, vocab_size=64)
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(cfg)
    base.train()
    ids = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(1))

    def run(model: nn.Module) -> list[torch.Tensor]:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        out = []
        for step in range(3):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(100 + step)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            out += [loss.detach().clone(), *(p.grad.clone() for p in model.parameters())]
            opt.step()
        return out

    ref = run(copy.deepcopy(base))
    model = copy.deepcopy(base)
    tracker = memscale.blocks(model, "40%")
    assert model.config.use_cache is False
    got = run(model)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
    assert [n for n, _ in tracker.blocks] == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    assert tracker.summary()["rematerializations"] > 0


def test_forwards_without_backward_leave_nothing_behind() -> None:
    """Grad-mode forwards whose graph is dropped (a validation loop without
    no_grad) release their units: nothing is kept alive by a cycle."""
    torch.manual_seed(0)
    model = Net()
    tracker = memscale.blocks(model, "50%")
    for step in range(3):
        loss = model(batch(step))
        del loss
    tracker._flush()
    assert tracker._open == 0 and tracker._engine is None and not tracker._units
    assert tracker.summary()["steps"] == 3


_ZOO_WITHOUT_BLOCKS = {"unet", "gan", "lstm", "lstm_tf", "gru", "gru_tf"}


@pytest.mark.parametrize("family", sorted(__import__("zoo").MODELS))
def test_zoo_families_train_bitwise(family: str) -> None:
    """Every zoo family with repeated blocks trains bitwise with blocks evicted
    (budget: half the first step's block activations, at least one and a half
    blocks); the others are refused with a message naming ``modules=``."""
    import zoo

    z = zoo.MODELS[family]()
    if family in _ZOO_WITHOUT_BLOCKS:
        with pytest.raises(ConfigError, match="modules="):
            memscale.blocks(copy.deepcopy(z.model), "50%")
        return
    ref = zoo.train(z)
    probe = zoo.Trainer.of(z)
    measured = memscale.blocks(probe.model, "100%")
    probe.step()
    probe.step()  # the first step ends (and is measured) when the second starts
    s = measured.summary()
    if family == "gpt2_ckpt":  # its own checkpointing leaves the blocks nothing to hold
        assert s["first_step_peak"] == 0 and s["largest_block"] == 0
        return
    budget = max(s["first_step_peak"] // 2, s["largest_block"] + 1)
    trainer = zoo.Trainer.of(z)
    tracker = memscale.blocks(trainer.model, budget)
    got = [trainer.step() for _ in range(zoo.STEPS)]
    assert zoo.differences(ref, got) == []
    s = tracker.summary()
    assert s["evictions"] > 0 and s["rematerializations"] > 0


def test_large_buffers_are_copied_once_the_block_is_seen_updating_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffers too large to copy at every call: the first call that updates
    them stays resident (pinned), later calls copy them and are evictable."""
    from memscale._blocks import tracker as tracker_module

    monkeypatch.setattr(tracker_module, "_COPIED_BUFFER_BYTES", 0)
    torch.manual_seed(0)
    base = Net(norm=True)
    ref = train(copy.deepcopy(base), steps=3)
    model = copy.deepcopy(base)
    block = largest_block(model, batch(0))
    tracker = memscale.blocks(model, 4 * block + block // 2)  # the first step's 4 pinned calls fit
    got = train(model, steps=3)
    assert_bitwise(ref, got)
    assert tracker._mutating == {id(layer) for layer in model.layers}
    assert tracker.summary()["rematerializations"] == 0  # 4.5 blocks: nothing to evict once copied
    plain = copy.deepcopy(base)
    plain.load_state_dict(model.state_dict())
    tracker.set_budget(block + block // 2)  # now the copied calls are evicted and recomputed
    assert_bitwise(train(plain, steps=2), train(model, steps=2))
    assert tracker.summary()["rematerializations"] > 0


def test_a_deep_copy_of_a_tracked_model_is_tracked_by_the_same_blocks() -> None:
    torch.manual_seed(0)
    model = Net()
    tracker = memscale.blocks(model, "50%")
    twin = copy.deepcopy(model)
    twin(batch(0)).backward()
    assert tracker.summary()["block_calls"] == 4


class _Live(TorchDispatchMode):
    """Bytes of the storages ops made that are alive: now and at the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.seen: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.seen.discard(key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.seen:
                storage = t.untyped_storage()
                self.seen.add(storage.data_ptr())
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._freed, storage.data_ptr(), storage.nbytes())
        return out


def test_memory_real_peak_and_nothing_left_after_backward() -> None:
    """Counted by storage lifetimes (not the engine's count): at a budget of
    one block the step's peak is far below plain's, and after backward only
    what plain keeps (the gradients) is alive - no recomputed tensor stays
    behind (a cycle through a grad_fn would keep it)."""
    torch.manual_seed(0)
    base = Net(depth=6, width=64)
    x = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))  # activations dominate the peak

    def measured(model: nn.Module) -> tuple[int, int]:
        mode = _Live()
        with mode:
            torch.manual_seed(1)
            model(x).backward()
        gc.collect()
        return mode.peak, mode.live

    plain_peak, plain_after = measured(copy.deepcopy(base))
    model = copy.deepcopy(base)
    block = largest_block(model, x)
    tracker = BlockDTR(model, block + block // 2)
    peak, after = measured(model)
    assert tracker.summary()["rematerializations"] == 5
    assert after == plain_after
    assert peak <= plain_peak - 4 * block  # 6 blocks' activations, at most 2 alive at once


@pytest.mark.slow
def test_compiled_blocks_train_bitwise_to_the_compiled_model() -> None:
    """``torch.compile``d blocks: autograd's saved-tensor hooks run on the
    compiled graph's saved tensors, and a recompute runs the compiled block."""
    torch.manual_seed(0)
    base = Net()

    def compiled() -> nn.Module:
        model = copy.deepcopy(base)
        for i, layer in enumerate(model.layers):
            model.layers[i] = torch.compile(layer)
        return model

    ref = train(compiled())
    model = compiled()
    tracker = memscale.blocks(model, "50%")
    assert_bitwise(ref, train(model))
    assert tracker.summary()["rematerializations"] > 0


#: Families whose blocks hold nothing: reversible layers recompute in backward
#: themselves (Reformer); SqueezeBERT calls its layers' ``forward`` directly,
#: past the module hooks (nothing is tracked, ``block_calls`` stays 0).
_FAMILIES_HOLDING_NOTHING = {"reformer", "squeezebert"}


@pytest.mark.parametrize("name", sorted(__import__("families").FAMILIES))
def test_hugging_face_families_train_bitwise(name: str) -> None:
    """Every family of ``tests/families.py`` (36 Hugging Face architectures)
    trains three SGD steps bitwise under a budget of one block's activations
    (plus what never leaves: tensors under the engine's minimum size), blocks
    recomputed. The reference runs with ``use_cache = False`` too (blocks turn
    the key/value cache off, which alone moves GPT-J's gradients by an ulp)."""
    import numpy as np

    import families

    model, batch = families.build(name)
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False):
        config.use_cache = False

    def run(m: nn.Module, steps: int) -> list[torch.Tensor | None]:
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        out: list[torch.Tensor | None] = []
        for step in range(steps):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(100 + step)
            np.random.seed(step)  # wav2vec2's time masks
            loss = m(**batch).loss
            loss.backward()
            out += [loss.detach().clone(), *(None if p.grad is None else p.grad.clone() for p in m.parameters())]
            opt.step()
        return out

    probe = copy.deepcopy(model)
    measured = memscale.blocks(probe, "100%")
    run(probe, 2)
    largest = measured.summary()["largest_block"]
    if name in _FAMILIES_HOLDING_NOTHING:
        assert largest == 0
        return
    ref = run(copy.deepcopy(model), 3)
    trained = copy.deepcopy(model)
    tracker = memscale.blocks(trained, largest + 1024)
    got = run(trained, 3)
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), f"tensor {i} differs"
    assert tracker.summary()["rematerializations"] > 0


def test_blocks_called_past_their_hooks_are_reported(caplog: pytest.LogCaptureFixture) -> None:
    """A model that calls ``block.forward()`` directly (as SqueezeBERT does)
    passes by module hooks: nothing can be tracked, and a warning says so
    once, at the second training forward."""

    class Direct(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            for layer in self.layers:
                h = layer.forward(h)
            return self.out(h).square().mean()

    model = Direct()
    memscale.blocks(model, "50%")
    with caplog.at_level("WARNING", logger="memscale"):
        for step in range(3):
            model(batch(step)).backward()
    warnings = [r for r in caplog.records if "bypasses them" in r.getMessage()]
    assert len(warnings) == 1 and "layers.0" in warnings[0].getMessage()
    caplog.clear()
    tracked = Net()
    memscale.blocks(tracked, "50%")
    with caplog.at_level("WARNING", logger="memscale"):
        for step in range(3):
            tracked(batch(step)).backward()
    assert not [r for r in caplog.records if "bypasses them" in r.getMessage()]


