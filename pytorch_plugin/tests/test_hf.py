"""Hugging Face integration: memscale.wrap(trainer) and MemscaleCallback.

A tiny GPT-2 with random weights (no downloads; HF_HUB_OFFLINE=1) trains a few
steps on the CPU with and without memscale; the losses must match.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import memscale
from memscale import Config, MemscaleError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

STEPS = 3


def test_callback_module_explains_a_missing_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "memscale.hf", raising=False)
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(ImportError, match="pip install"):
        importlib.import_module("memscale.hf")


def _needs_trainer_stack() -> Any:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (not installed)")
    try:
        from memscale._native import engine as _engine
        from memscale import dtr  # noqa: F401

        _engine.dtr_lib()
    except (ImportError, MemscaleError) as exc:  # pragma: no cover - until the engine lands
        pytest.skip(f"the DTR region or engine is unavailable: {exc}")
    return transformers


class _Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(3)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(transformers: Any, out: Path) -> Any:
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=2,
        n_positions=64,
        vocab_size=128,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    transformers.set_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=_Tokens(8 * STEPS, 64, 128))


def _losses(trainer: Any) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_wrapped_trainer_trains_like_the_plain_one(tmp_path: Path) -> None:
    transformers = _needs_trainer_stack()
    plain = _trainer(transformers, tmp_path / "plain")
    plain.train()

    trainer = _trainer(transformers, tmp_path / "memscale")
    assert memscale.wrap(trainer, Config(mode="conservative")) is trainer
    callbacks = [c for c in trainer.callback_handler.callbacks if isinstance(c, memscale.MemscaleCallback)]
    assert len(callbacks) == 1
    trainer.train()

    assert len(_losses(trainer)) == STEPS
    assert _losses(trainer) == pytest.approx(_losses(plain), rel=1e-4)
    for a, b in zip(plain.model.parameters(), trainer.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

    summary = memscale.summary(trainer)
    assert summary.steps == STEPS
    assert summary.evictions > 0, summary
    history = callbacks[0].history
    assert [h["event"] for h in history].count("log") >= STEPS
    assert history[-1]["event"] == "train_end"
    assert history[-1]["steps"] == STEPS and history[-1]["global_step"] == STEPS

    memscale.detach(trainer)
    assert "training_step" not in vars(trainer)
    assert not [c for c in trainer.callback_handler.callbacks if isinstance(c, memscale.MemscaleCallback)]
    assert memscale.summary(trainer).steps == STEPS


def test_callback_logs_the_summary(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    transformers = _needs_trainer_stack()
    trainer = _trainer(transformers, tmp_path / "log")
    memscale.wrap(trainer, Config(mode="conservative"))
    with caplog.at_level("INFO", logger="memscale"):
        trainer.train()
    messages = [r.getMessage() for r in caplog.records if r.name == "memscale"]
    assert any("train_end" in m and "evictions" in m for m in messages), messages
    memscale.detach(trainer)


def test_callback_can_be_silenced(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    transformers = _needs_trainer_stack()
    trainer = _trainer(transformers, tmp_path / "quiet")
    memscale.wrap(trainer, Config(log_summary=False))
    with caplog.at_level("INFO", logger="memscale"):
        trainer.train()
    assert not [r for r in caplog.records if r.name == "memscale" and "train_end" in r.getMessage()]
    memscale.detach(trainer)


def test_a_wrapped_trainer_runs_fitting_steps_untracked(tmp_path: Path) -> None:
    """A threshold far above the step: after two tracked steps of the batch's
    shapes, the Trainer's steps run as plain PyTorch (memscale._dropin.fitting)."""
    transformers = _needs_trainer_stack()
    plain = _trainer(transformers, tmp_path / "plain")
    plain.train()
    trainer = _trainer(transformers, tmp_path / "memscale")
    memscale.wrap(trainer, Config(threshold="1GiB"))
    trainer.train()
    assert _losses(trainer) == _losses(plain)
    summary = memscale.summary(trainer)
    assert (summary.steps, summary.untracked_steps, summary.evictions) == (STEPS, STEPS - 2, 0), summary
    memscale.detach(trainer)


def test_a_trainer_wrapped_with_blocks_trains_bitwise(tmp_path: Path) -> None:
    """``wrap(trainer, Config(unit="block"))``: blocks on the Trainer's model
    (no step patching); the losses and parameters are the plain run's."""
    transformers = _needs_trainer_stack()
    plain = _trainer(transformers, tmp_path / "plain")
    plain.model.config.use_cache = False  # as blocks set it
    plain.train()
    trainer = _trainer(transformers, tmp_path / "blocks")
    assert memscale.wrap(trainer, Config(unit="block", mode="aggressive", log_summary=False)) is trainer
    assert "training_step" not in vars(trainer)
    trainer.train()
    assert _losses(trainer) == _losses(plain)
    for a, b in zip(plain.model.parameters(), trainer.model.parameters(), strict=True):
        assert torch.equal(a, b)
    summary = memscale.summary(trainer)
    assert summary.rematerializations > 0 and summary.steps >= STEPS - 1, summary
    memscale.detach(trainer)
    assert not trainer.model.transformer.h[0]._forward_pre_hooks
