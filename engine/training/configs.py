"""Small DiffusionGemma configurations built with the real transformers classes.

Used for the shipped default model and for test fixtures. Every size keeps the release's structure
(sliding and full attention layers, the dense MLP beside a mixture of experts, tied encoder and decoder)
at a scale a laptop CPU runs in milliseconds per denoising step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import (
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    DiffusionGemmaTextConfig,
    Gemma4VisionConfig,
)
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

from ..shared import vocab

SIZES: dict[str, dict[str, int]] = {
    # name: hidden, layers, heads, kv heads, head dim, dense MLP, experts, top-k, expert MLP
    "test": dict(hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, mlp=128, experts=2, top_k=1, moe=64),
    "mini": dict(hidden=128, layers=4, heads=2, kv_heads=1, head_dim=64, mlp=256, experts=4, top_k=2, moe=128),
    "small": dict(hidden=192, layers=4, heads=3, kv_heads=1, head_dim=64, mlp=384, experts=4, top_k=2, moe=192),
    "tiny": dict(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, mlp=512, experts=4, top_k=2, moe=256),
    "medium": dict(hidden=320, layers=6, heads=5, kv_heads=1, head_dim=64, mlp=640, experts=8, top_k=2, moe=320),
    "base": dict(hidden=384, layers=6, heads=6, kv_heads=2, head_dim=64, mlp=768, experts=8, top_k=2, moe=384),
}


TINY_VISION: dict[str, Any] = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    position_embedding_size=64,
)
"""The smallest Gemma 4 vision tower: every DiffusionGemma builds one, and code never runs it."""

RELEASE_IMAGE_TOKENS = 280
"""The release's ``vision_config.default_output_length`` (soft tokens per image): transformers' Gemma 4 vision
config does not declare it, and vLLM's Gemma 4 multimodal code reads it unconditionally at start
(``'Gemma4VisionConfig' object has no attribute 'default_output_length'`` without it)."""


def build_config(
    size: str, vocab_size: int, canvas_length: int = 32, sliding_window: int = 512
) -> DiffusionGemmaConfig:
    """A DiffusionGemma config of one of ``SIZES``; the last layer is full attention, the rest sliding."""
    s = SIZES[size]
    text = DiffusionGemmaTextConfig(
        vocab_size=vocab_size,
        hidden_size=s["hidden"],
        intermediate_size=s["mlp"],
        num_hidden_layers=s["layers"],
        layer_types=["sliding_attention"] * (s["layers"] - 1) + ["full_attention"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        # Gemma 4's global-attention fields, read from the config's extra keyword arguments (not in its signature)
        **dict[str, Any](global_head_dim=s["head_dim"], num_global_key_value_heads=1),
        sliding_window=sliding_window,
        num_experts=s["experts"],
        top_k_experts=s["top_k"],
        moe_intermediate_size=s["moe"],
        use_bidirectional_attention="vision",
        max_position_embeddings=4096,
        pad_token_id=vocab.SPECIAL_IDS[vocab.PAD],
        eos_token_id=vocab.SPECIAL_IDS[vocab.EOS],
        bos_token_id=vocab.SPECIAL_IDS[vocab.BOS],
    )
    return text_only_config(
        text,
        canvas_length,
        image_token_id=vocab.SPECIAL_IDS[vocab.IMAGE],
        boi_token_id=vocab.SPECIAL_IDS[vocab.BOI],
        eoi_token_id=vocab.SPECIAL_IDS[vocab.EOI],
    )


def text_only_config(
    text: DiffusionGemmaTextConfig, canvas_length: int, image_token_id: int, boi_token_id: int, eoi_token_id: int
) -> DiffusionGemmaConfig:
    """The full config around ``text`` with the smallest vision tower (never run for code).

    DiffusionGemma always builds a vision tower; ``vision_config=None`` would mean a 168M-parameter one.
    """
    vision = Gemma4VisionConfig(**TINY_VISION)
    config = DiffusionGemmaConfig(
        text_config=text,
        vision_config=vision,
        canvas_length=canvas_length,
        image_token_id=image_token_id,
        boi_token_id=boi_token_id,
        eoi_token_id=eoi_token_id,
    )
    complete_for_serving(config)
    return config


def complete_for_serving(config: DiffusionGemmaConfig) -> None:
    """Write into ``config`` what the release's config holds and transformers' classes leave out of a saved one, so
    that vLLM serves the checkpoint as transformers runs it: the vision tower's ``default_output_length`` (vLLM
    cannot start without it), the text config's ``final_logit_softcapping`` (a class default transformers applies
    but never writes; vLLM reads a missing one as no softcapping) and the end-of-sequence ids at the top. A value
    already there is kept."""
    vision, text = config.vision_config, config.text_config
    assert isinstance(vision, Gemma4VisionConfig) and isinstance(text, DiffusionGemmaTextConfig), config
    vision.default_output_length = getattr(vision, "default_output_length", RELEASE_IMAGE_TOKENS)
    text.final_logit_softcapping = text.final_logit_softcapping  # the class's default, made the config's own
    if getattr(config, "eos_token_id", None) is None:
        eos = text.eos_token_id
        config.eos_token_id = list(eos) if isinstance(eos, list) else [eos]


def set_generation_defaults(model: DiffusionGemmaForBlockDiffusion, steps: int = 16) -> None:
    """A model built from a config has an empty generation config; give it the release's settings."""
    g = model.generation_config
    g.eos_token_id = [vocab.SPECIAL_IDS[vocab.EOS]]
    g.pad_token_id = vocab.SPECIAL_IDS[vocab.PAD]
    g.max_new_tokens = model.config.canvas_length
    # DiffusionGemma's own fields, which GenerationConfig keeps as extra attributes (not in its declared type)
    release = dict(
        max_denoising_steps=steps,
        t_min=0.4,
        t_max=0.8,
        stability_threshold=1,
        confidence_threshold=0.005,
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.1),
    )
    for name, value in release.items():
        setattr(g, name, value)


def save_checkpoint(model: DiffusionGemmaForBlockDiffusion, tokenizer_dir: Path, out_dir: Path) -> None:
    """Write config, weights, generation config and the tokenizer into one folder ``from_pretrained`` loads."""
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    complete_for_serving(model.config)  # a checkpoint read from an older folder too
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
