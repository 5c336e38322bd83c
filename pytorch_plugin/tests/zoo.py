"""A zoo of small model families for DTR tests and benches (random weights, no downloads).

Each builder returns a :class:`ZooModel`: the model (built under
``torch.manual_seed(0)``, in training mode, dropout on where the family has it),
``make_batch(step)`` (plain input tensors from a seeded generator: the same batch
for the same step in every run) and ``step_fn(model, batch)``, which runs the
forward pass *and* every backward pass of one training step and returns the
losses. Sizes are chosen so that a plain step takes a few tens of milliseconds
on a CPU core, yet activations (not weights) dominate the step's peak.

:func:`train` runs a few steps of a model (a ``copy.deepcopy`` of the zoo
model, so the plain and region runs start from the same weights), with SGD
between steps, outside or inside a DTR region, and records what each step
produced. Used by ``test_zoo.py`` and ``bench/zoo_bench.py`` (importable by
module name from this directory).

Families: ``resnet`` (Hugging Face ResNet, batch norm in training mode),
``efficientnet`` (depthwise convolutions, squeeze-excitation, batch norm,
dropout), ``lstm`` / ``lstm_tf`` and ``gru`` / ``gru_tf`` (language models on
``nn.LSTM`` / ``nn.GRU``, batch_first=True and the time-first layout), ``t5``
and ``bart`` (encoder-decoder), ``llama`` (rotary embeddings, RMSNorm, grouped
query attention), ``gpt2_ckpt`` (GPT-2 with Hugging Face gradient checkpointing
on), ``gan`` (generator and discriminator: two losses, two backward passes in
one step) and ``unet`` (hand-written: skip connections, transposed convolution
and bilinear upsampling, batch and group norm).
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: Training steps per run.
STEPS = 3
#: The seed of the global RNG before step ``i`` is ``STEP_SEED + i`` (dropout,
#: the GAN's noise), in every run.
STEP_SEED = 100


@dataclass
class ZooModel:
    """One family: the model, the batch of each step and the training step."""

    name: str
    model: nn.Module
    #: ``make_batch(step)``: the inputs of step ``step`` (plain tensors).
    make_batch: Callable[[int], Any]
    #: ``step_fn(model, batch)``: forward and backward pass(es); the losses.
    step_fn: Callable[[nn.Module, Any], list[torch.Tensor]]
    #: What the family covers (for reports).
    about: str = ""
    lr: float = 0.05


def _transformers() -> Any:
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _gen(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 * seed + step)


def _hf_loss(model: nn.Module, batch: dict[str, Any]) -> list[torch.Tensor]:
    loss = model(**batch).loss
    loss.backward()
    return [loss]


# -------------------------------------------------------------------- vision


def build_resnet() -> ZooModel:
    tf = _transformers()
    cfg = tf.ResNetConfig(
        num_channels=3,
        embedding_size=8,
        hidden_sizes=[32, 48, 64, 64],
        depths=[4, 2, 1, 1],
        layer_type="basic",
        num_labels=10,
    )
    torch.manual_seed(0)
    model = tf.ResNetForImageClassification(cfg).train()

    def make_batch(step: int) -> dict[str, Any]:
        g = _gen(1, step)
        return {"pixel_values": torch.randn(32, 3, 64, 64, generator=g), "labels": torch.randint(0, 10, (32,), generator=g)}

    return ZooModel("resnet", model, make_batch, _hf_loss, "HF ResNet (basic blocks), batch norm in training mode")


def build_efficientnet() -> ZooModel:
    tf = _transformers()
    cfg = tf.EfficientNetConfig(
        image_size=64,
        width_coefficient=0.5,
        depth_coefficient=1.0,
        kernel_sizes=[3, 3, 5, 3],
        in_channels=[32, 16, 24, 40],
        out_channels=[16, 24, 40, 80],
        strides=[2, 1, 2, 2],
        num_block_repeats=[1, 3, 3, 2],
        expand_ratios=[1, 4, 4, 4],
        hidden_dim=640,  # round_filters(1280): the top convolution's width
        dropout_rate=0.2,
        drop_connect_rate=0.2,
        num_labels=10,
    )
    torch.manual_seed(0)
    model = tf.EfficientNetForImageClassification(cfg).train()

    def make_batch(step: int) -> dict[str, Any]:
        g = _gen(2, step)
        return {"pixel_values": torch.randn(8, 3, 64, 64, generator=g), "labels": torch.randint(0, 10, (8,), generator=g)}

    return ZooModel(
        "efficientnet",
        model,
        make_batch,
        _hf_loss,
        "HF EfficientNet: depthwise convolutions, squeeze-excitation, swish, batch norm, dropout",
    )


class _UNet(nn.Module):
    """Two levels down, two up: skip connections by concatenation, a transposed
    convolution and a bilinear upsample, batch norm (encoder) and group norm
    (decoder), in-place ReLU, channel dropout at the bottleneck."""

    def __init__(self, cin: int = 3, base: int = 8, classes: int = 4) -> None:
        super().__init__()

        def block(a: int, b: int, norm: str, convs: int = 3) -> nn.Sequential:
            layers: list[nn.Module] = []
            for i in range(convs):
                layers.append(nn.Conv2d(a if i == 0 else b, b, 3, padding=1, bias=False))
                layers.append(nn.BatchNorm2d(b) if norm == "bn" else nn.GroupNorm(4, b))
                layers.append(nn.ReLU(inplace=True))
            return nn.Sequential(*layers)

        self.enc1 = block(cin, base, "bn")
        self.enc2 = block(base, 2 * base, "bn")
        self.mid = nn.Sequential(block(2 * base, 4 * base, "gn"), nn.Dropout2d(0.1))
        self.up2 = nn.ConvTranspose2d(4 * base, 2 * base, 2, stride=2)
        self.dec2 = block(4 * base, 2 * base, "gn")
        self.up1 = nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False), nn.Conv2d(2 * base, base, 1))
        self.dec1 = block(2 * base, base, "gn")
        self.head = nn.Conv2d(base, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


def build_unet() -> ZooModel:
    torch.manual_seed(0)
    model = _UNet().train()

    def make_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _gen(3, step)
        return torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 4, (16, 32, 32), generator=g)

    def step_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
        x, y = batch
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        return [loss]

    return ZooModel(
        "unet", model, make_batch, step_fn, "hand-written U-Net: skips (cat), ConvTranspose2d, bilinear upsample, BN + GN, Dropout2d"
    )


class _GAN(nn.Module):
    """DCGAN-style, 16x16 images: generator (linear, transposed convolutions,
    batch norm) and discriminator (strided convolutions, LeakyReLU, batch norm,
    dropout)."""

    def __init__(self, nz: int = 32) -> None:
        super().__init__()
        self.nz = nz
        self.G = nn.Sequential(
            nn.Linear(nz, 64 * 4 * 4),
            nn.Unflatten(1, (64, 4, 4)),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1, bias=False),  # 8x8
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1, bias=False),  # 16x16
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.Conv2d(16, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.Conv2d(16, 3, 3, padding=1),
            nn.Tanh(),
        )
        self.D = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(16, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Dropout(0.1),
            nn.Conv2d(16, 32, 4, stride=2, padding=1, bias=False),  # 8x8
            nn.BatchNorm2d(32),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(32, 64, 4, stride=2, padding=1, bias=False),  # 4x4
            nn.BatchNorm2d(64),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, 1),
        )


def build_gan() -> ZooModel:
    torch.manual_seed(0)
    model = _GAN().train()

    def make_batch(step: int) -> torch.Tensor:
        return torch.randn(64, 3, 16, 16, generator=_gen(4, step)).tanh()

    def step_fn(m: nn.Module, real: torch.Tensor) -> list[torch.Tensor]:
        # The noise comes from the global RNG inside the step (replayed if evicted).
        z = torch.randn(real.shape[0], m.nz)
        fake = m.G(z)
        real_logits = m.D(real)
        fake_logits = m.D(fake.detach())
        d_loss = F.binary_cross_entropy_with_logits(
            real_logits, torch.ones_like(real_logits)
        ) + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
        d_loss.backward()
        # The generator's loss: through the discriminator, whose parameters
        # take no gradient from it.
        for p in m.D.parameters():
            p.requires_grad_(False)
        try:
            gen_logits = m.D(fake)
            g_loss = F.binary_cross_entropy_with_logits(gen_logits, torch.ones_like(gen_logits))
            g_loss.backward()
        finally:
            for p in m.D.parameters():
                p.requires_grad_(True)
        return [d_loss, g_loss]

    return ZooModel(
        "gan", model, make_batch, step_fn, "DCGAN-style G + D: two losses, two backward passes, noise drawn in the step"
    )


# ------------------------------------------------------------------ sequence


class _RNNLM(nn.Module):
    """Embedding, a 2-layer LSTM or GRU (inter-layer dropout), dropout, a linear head."""

    def __init__(self, cell: str, batch_first: bool, layers: int, vocab: int = 128, emb: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(vocab, emb)
        self.drop = nn.Dropout(0.2)
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = rnn(emb, hidden, num_layers=layers, dropout=0.2, batch_first=batch_first)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: (batch, time) when batch_first, else (time, batch).
        out, _ = self.rnn(self.drop(self.embed(ids)))
        return self.head(self.drop(out))


def _rnn_lm(cell: str, batch_first: bool) -> ZooModel:
    torch.manual_seed(0)
    # The CPU LSTM runs a whole layer in one op (mkldnn_rnn_layer, with a
    # workspace of ~16x its output): 4 layers, so one layer is not half the
    # peak. The GRU runs op by op per time step: shorter sequences.
    layers, hidden, batch, length = {"lstm": (4, 128, 32, 64), "gru": (3, 64, 64, 12)}[cell]
    model = _RNNLM(cell, batch_first, layers, hidden=hidden).train()
    seed = {"lstm": 5, "gru": 6}[cell]

    def make_batch(step: int) -> torch.Tensor:
        ids = torch.randint(0, 128, (batch, length + 1), generator=_gen(seed, step))
        return ids if batch_first else ids.t().contiguous()

    def step_fn(m: nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
        if batch_first:
            logits, target = m(ids[:, :-1]), ids[:, 1:]
        else:
            logits, target = m(ids[:-1]), ids[1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        loss.backward()
        return [loss]

    layout = "batch_first=True" if batch_first else "batch_first=False (time first)"
    name = cell if batch_first else f"{cell}_tf"
    return ZooModel(name, model, make_batch, step_fn, f"nn.{cell.upper()} language model, {layers} layers, {layout}, dropout")


def build_lstm() -> ZooModel:
    return _rnn_lm("lstm", True)


def build_lstm_tf() -> ZooModel:
    return _rnn_lm("lstm", False)


def build_gru() -> ZooModel:
    return _rnn_lm("gru", True)


def build_gru_tf() -> ZooModel:
    return _rnn_lm("gru", False)


def _seq2seq_batch(seed: int, step: int, vocab: int) -> dict[str, Any]:
    g = _gen(seed, step)
    return {
        "input_ids": torch.randint(3, vocab, (16, 32), generator=g),
        "labels": torch.randint(3, vocab, (16, 16), generator=g),
    }


def build_t5() -> ZooModel:
    tf = _transformers()
    cfg = tf.T5Config(
        vocab_size=128,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        dropout_rate=0.1,
        decoder_start_token_id=0,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = tf.T5ForConditionalGeneration(cfg).train()
    return ZooModel(
        "t5",
        model,
        lambda step: _seq2seq_batch(7, step, 128),
        _hf_loss,
        "HF T5 encoder-decoder: relative position bias, RMS layer norm, cross-attention, dropout",
    )


def build_bart() -> ZooModel:
    tf = _transformers()
    cfg = tf.BartConfig(
        vocab_size=128,
        max_position_embeddings=64,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        dropout=0.1,
        attention_dropout=0.1,
        activation_dropout=0.1,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = tf.BartForConditionalGeneration(cfg).train()
    return ZooModel(
        "bart",
        model,
        lambda step: _seq2seq_batch(8, step, 128),
        _hf_loss,
        "HF Bart encoder-decoder: learned positions, layer norm, GELU, attention + activation dropout",
    )


def _lm_batch(seed: int, step: int, vocab: int, shape: tuple[int, int]) -> dict[str, Any]:
    ids = torch.randint(0, vocab, shape, generator=_gen(seed, step))
    return {"input_ids": ids, "labels": ids}


def build_llama() -> ZooModel:
    tf = _transformers()
    cfg = tf.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_dropout=0.1,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg).train()
    return ZooModel(
        "llama",
        model,
        lambda step: _lm_batch(9, step, 128, (8, 64)),
        _hf_loss,
        "HF Llama decoder: rotary embeddings, RMSNorm, SwiGLU, grouped-query attention, attention dropout",
    )


def build_gpt2_ckpt() -> ZooModel:
    tf = _transformers()
    cfg = tf.GPT2Config(
        n_layer=4, n_embd=64, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0, use_cache=False
    )
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(cfg)
    with warnings.catch_warnings():  # transformers 5 renames it activation_checkpointing_enable
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable()
        assert model.is_gradient_checkpointing
    model.train()
    return ZooModel(
        "gpt2_ckpt",
        model,
        lambda step: _lm_batch(10, step, 128, (16, 64)),
        _hf_loss,
        "HF GPT-2 with model.gradient_checkpointing_enable() (torch.utils.checkpoint per block), dropout",
    )


MODELS: dict[str, Callable[[], ZooModel]] = {
    "resnet": build_resnet,
    "efficientnet": build_efficientnet,
    "unet": build_unet,
    "gan": build_gan,
    "lstm": build_lstm,
    "lstm_tf": build_lstm_tf,
    "gru": build_gru,
    "gru_tf": build_gru_tf,
    "t5": build_t5,
    "bart": build_bart,
    "llama": build_llama,
    "gpt2_ckpt": build_gpt2_ckpt,
}


# ----------------------------------------------------------------------- runs


@dataclass
class Trainer:
    """A copy of a zoo model and its optimizer, one :meth:`step` at a time."""

    zoo: ZooModel
    model: nn.Module
    optimizer: torch.optim.Optimizer
    step_index: int = 0

    @classmethod
    def of(cls, zoo: ZooModel) -> Trainer:
        model = copy.deepcopy(zoo.model)
        return cls(zoo, model, torch.optim.SGD(model.parameters(), lr=zoo.lr))

    def step(self, region: Any = None) -> dict[str, Any]:
        """One training step (in ``region`` when given), then SGD outside it.

        Returns ``losses``, ``grads`` (name -> clone, or None), ``buffers``,
        ``time`` (seconds, forward + backward + leaving the region) and, with a
        region, ``stats`` (its ``last_summary()``).
        """
        from memscale import unwrap

        step = self.step_index
        batch = self.zoo.make_batch(step)
        self.optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(STEP_SEED + step)
        t0 = time.perf_counter()
        if region is None:
            losses = self.zoo.step_fn(self.model, batch)
        else:
            with region:
                losses = self.zoo.step_fn(self.model, batch)
        elapsed = time.perf_counter() - t0
        grads: dict[str, torch.Tensor | None] = {}
        for name, p in self.model.named_parameters():
            if p.grad is not None and type(p.grad) is not torch.Tensor:
                raise AssertionError(f"{name}.grad is {type(p.grad).__name__} after the region")
            grads[name] = None if p.grad is None else p.grad.clone()
        record: dict[str, Any] = {
            "losses": [unwrap(x).detach().clone() for x in losses],
            "grads": grads,
            "buffers": {n: b.clone() for n, b in self.model.named_buffers()},
            "time": elapsed,
        }
        if region is not None:
            record["stats"] = region.last_summary()
        self.optimizer.step()
        self.step_index += 1
        return record


def train(zoo: ZooModel, region: Any = None, steps: int = STEPS) -> list[dict[str, Any]]:
    """``steps`` steps of a fresh copy of ``zoo.model`` (in ``region`` when given)."""
    trainer = Trainer.of(zoo)
    return [trainer.step(region) for _ in range(steps)]


def differences(ref: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[str]:
    """What differs (not bitwise equal) between two runs' records; empty: nothing."""
    out = []
    for step, (a, b) in enumerate(zip(ref, got, strict=True)):
        for i, (x, y) in enumerate(zip(a["losses"], b["losses"], strict=True)):
            if not torch.equal(x, y):
                out.append(f"step {step}: loss {i} {y.item()!r} != {x.item()!r}")
        for kind in ("grads", "buffers"):
            for name, x in a[kind].items():
                y = b[kind][name]
                if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
                    what = "gradient" if kind == "grads" else "buffer"
                    out.append(f"step {step}: {what} of {name} differs")
    return out


def budget_for(peak: int, fraction: float, min_budget: int | None) -> int:
    """``fraction`` of ``peak``, or ``1.1 * min_budget`` (the engine's lower
    bound of a feasible budget, where it reports one) when that is higher."""
    budget = int(peak * fraction)
    if min_budget:
        budget = max(budget, int(min_budget * 1.1))
    return budget


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
