"""Hugging Face model families beyond the zoo, for ``memscale.check`` (random weights, no downloads).

Each entry of :data:`FAMILIES` builds a tiny model from a config (two layers,
width 32 or so: a step takes a fraction of a second) and one batch with labels,
so the model's forward returns a loss. ``test_families.py`` runs
``memscale.check`` on each (one plain step against one step under the stress
setting, every rebuild verified); ``bench/families_check.py`` writes the table.

The families cover what the zoo does not: encoders (BERT and its kin,
DeBERTa's disentangled attention, ALBERT's shared layers, Funnel's pooling,
Canine's character hashing), decoders (Mistral, Qwen2, Gemma, Phi, GPT-NeoX,
GPT-J, OPT, BLOOM's ALiBi, Falcon, XLNet's two-stream attention, Mamba's
selective scan), sparse and local attention (BigBird's random blocks,
Longformer), reversible layers that recompute in backward (Reformer),
encoder-decoders (Pegasus, Marian, mT5, Whisper), speech (wav2vec2's
convolutional feature extractor and time masks drawn from NumPy), two-tower
contrastive (CLIP) and vision (ViT, DeiT, Swin's shifted windows, ConvNeXt,
MobileNetV2, RegNet).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: A family: builds ``(model, batch)``; ``model(**batch).loss`` is the step's loss.
Builder = Callable[[], tuple[torch.nn.Module, dict[str, Any]]]


def _t() -> Any:
    import transformers

    return transformers


def _ids(length: int = 16, high: int = 100) -> torch.Tensor:
    return torch.randint(2, high, (2, length))


_SMALL = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}


def _classifier(config: str, model: str, **kw: Any) -> Builder:
    def build() -> tuple[torch.nn.Module, dict[str, Any]]:
        t = _t()
        return getattr(t, model)(getattr(t, config)(**kw)), {"input_ids": _ids(), "labels": torch.tensor([0, 1])}

    return build


def _lm(config: str, model: str, length: int = 16, **kw: Any) -> Builder:
    def build() -> tuple[torch.nn.Module, dict[str, Any]]:
        t = _t()
        ids = _ids(length)
        return getattr(t, model)(getattr(t, config)(**kw)), {"input_ids": ids, "labels": ids}

    return build


def _seq2seq(config: str, model: str, **kw: Any) -> Builder:
    def build() -> tuple[torch.nn.Module, dict[str, Any]]:
        t = _t()
        return getattr(t, model)(getattr(t, config)(**kw)), {"input_ids": _ids(), "labels": _ids()}

    return build


def _vision(config: str, model: str, **kw: Any) -> Builder:
    def build() -> tuple[torch.nn.Module, dict[str, Any]]:
        t = _t()
        batch = {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 1])}
        return getattr(t, model)(getattr(t, config)(**kw)), batch

    return build


def _speech() -> tuple[torch.nn.Module, dict[str, Any]]:
    t = _t()
    config = t.Wav2Vec2Config(
        vocab_size=20, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4, mask_time_prob=0.2, mask_time_length=2,
    )
    return t.Wav2Vec2ForCTC(config), {"input_values": torch.randn(2, 800), "labels": torch.randint(1, 20, (2, 5))}


def _whisper() -> tuple[torch.nn.Module, dict[str, Any]]:
    t = _t()
    config = t.WhisperConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,
        max_target_positions=32, decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    return t.WhisperForConditionalGeneration(config), {"input_features": torch.randn(2, 8, 32), "labels": _ids()}


def _clip() -> tuple[torch.nn.Module, dict[str, Any]]:
    t = _t()
    text = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
            "intermediate_size": 64, "max_position_embeddings": 32, "bos_token_id": 0, "eos_token_id": 1}
    vision = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 64,
              "image_size": 32, "patch_size": 8}
    batch = {"input_ids": _ids(), "pixel_values": torch.randn(2, 3, 32, 32), "return_loss": True}
    return t.CLIPModel(t.CLIPConfig(text_config=text, vision_config=vision)), batch


def _reformer() -> tuple[torch.nn.Module, dict[str, Any]]:
    t = _t()
    config = t.ReformerConfig(
        vocab_size=100, hidden_size=32, attention_head_size=8, num_attention_heads=4, feed_forward_size=64,
        axial_pos_shape=[4, 4], axial_pos_embds_dim=[16, 16], attn_layers=["local", "lsh", "local", "lsh"],
        is_decoder=True, local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2, max_position_embeddings=16,
    )
    ids = _ids()
    return t.ReformerModelWithLMHead(config), {"input_ids": ids, "labels": ids}


FAMILIES: dict[str, Builder] = {
    "bert": _classifier("BertConfig", "BertForSequenceClassification", max_position_embeddings=32, **_SMALL),
    "roberta": _classifier("RobertaConfig", "RobertaForSequenceClassification", max_position_embeddings=40, pad_token_id=1, **_SMALL),
    "distilbert": _classifier(
        "DistilBertConfig", "DistilBertForSequenceClassification", vocab_size=100, dim=32, n_layers=2, n_heads=4,
        hidden_dim=64, max_position_embeddings=32,
    ),
    "electra": _classifier("ElectraConfig", "ElectraForSequenceClassification", embedding_size=16, max_position_embeddings=32, **_SMALL),
    "albert": _classifier("AlbertConfig", "AlbertForSequenceClassification", embedding_size=16, max_position_embeddings=32, **_SMALL),
    "deberta_v2": _classifier("DebertaV2Config", "DebertaV2ForSequenceClassification", max_position_embeddings=32, **_SMALL),
    "canine": lambda: (
        _t().CanineForSequenceClassification(_t().CanineConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, downsampling_rate=2,
            num_hash_buckets=64, num_hash_functions=2, local_transformer_stride=8,
        )),
        {"input_ids": _ids(16, 1000), "labels": torch.tensor([0, 1])},
    ),
    "mpnet": _lm("MPNetConfig", "MPNetForMaskedLM", max_position_embeddings=40, **_SMALL),
    "squeezebert": _lm("SqueezeBertConfig", "SqueezeBertForMaskedLM", embedding_size=32, max_position_embeddings=32, **_SMALL),
    "funnel": _lm("FunnelConfig", "FunnelForMaskedLM", vocab_size=100, d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1]),
    "big_bird": _lm(
        "BigBirdConfig", "BigBirdForMaskedLM", length=32, attention_type="block_sparse", block_size=2,
        num_random_blocks=2, max_position_embeddings=64, **_SMALL,
    ),
    "longformer": _lm("LongformerConfig", "LongformerForMaskedLM", attention_window=4, max_position_embeddings=64, pad_token_id=1, **_SMALL),
    "mistral": _lm("MistralConfig", "MistralForCausalLM", num_key_value_heads=2, max_position_embeddings=64, **_SMALL),
    "qwen2": _lm("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2, max_position_embeddings=64, **_SMALL),
    "gemma": _lm("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=2, head_dim=8, max_position_embeddings=64, **_SMALL),
    "phi": _lm("PhiConfig", "PhiForCausalLM", max_position_embeddings=64, **_SMALL),
    "gpt_neox": _lm("GPTNeoXConfig", "GPTNeoXForCausalLM", max_position_embeddings=64, **_SMALL),
    "gptj": _lm("GPTJConfig", "GPTJForCausalLM", vocab_size=100, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64),
    "opt": _lm(
        "OPTConfig", "OPTForCausalLM", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32,
    ),
    "bloom": _lm("BloomConfig", "BloomForCausalLM", vocab_size=100, hidden_size=32, n_layer=2, n_head=4),
    "falcon": _lm("FalconConfig", "FalconForCausalLM", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
    "xlnet": _lm("XLNetConfig", "XLNetLMHeadModel", vocab_size=100, d_model=32, n_layer=2, n_head=4, d_inner=64),
    "mamba": _lm("MambaConfig", "MambaForCausalLM", vocab_size=100, hidden_size=32, num_hidden_layers=2, state_size=8),
    "reformer": _reformer,
    "pegasus": _seq2seq(
        "PegasusConfig", "PegasusForConditionalGeneration", vocab_size=100, d_model=32, encoder_layers=1,
        decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=32,
    ),
    "marian": _seq2seq(
        "MarianConfig", "MarianMTModel", vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=32, pad_token_id=0, decoder_start_token_id=0,
    ),
    "mt5": _seq2seq(
        "MT5Config", "MT5ForConditionalGeneration", vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1,
        num_heads=4, decoder_start_token_id=0,
    ),
    "whisper": _whisper,
    "wav2vec2": _speech,
    "clip": _clip,
    "vit": _vision(
        "ViTConfig", "ViTForImageClassification", image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64,
    ),
    "deit": _vision(
        "DeiTConfig", "DeiTForImageClassification", image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64,
    ),
    "swin": _vision(
        "SwinConfig", "SwinForImageClassification", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
        num_heads=[2, 2], window_size=4,
    ),
    "convnext": _vision("ConvNextConfig", "ConvNextForImageClassification", hidden_sizes=[8, 16], depths=[1, 1], num_stages=2),
    "mobilenet_v2": _vision("MobileNetV2Config", "MobileNetV2ForImageClassification", image_size=32, depth_multiplier=0.25),
    "regnet": _vision("RegNetConfig", "RegNetForImageClassification", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8),
}


def build(name: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Family ``name``'s model (seeded, in training mode) and its batch."""
    torch.manual_seed(0)
    model, batch = FAMILIES[name]()
    model.train()
    return model, batch


def step_of(model: torch.nn.Module, batch: dict[str, Any]) -> Callable[[], torch.Tensor]:
    """The step ``memscale.check`` runs: the forward's loss (check runs its backward)."""

    def step() -> torch.Tensor:
        loss: torch.Tensor = model(**batch).loss
        return loss

    return step
