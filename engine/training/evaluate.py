"""Held-out figures during training: the diffusion loss, full-noise accuracy, and first-line exact match of infills.

The held-out sets are fixed for a run (files with ``is_held_out``, a seed of their own): ``n_eval`` examples in
batches of ``EVAL_BATCH`` for the loss and accuracy, and ``n_em`` single-line examples for exact match, filled with
``model.generate`` and the checkpoint's sampler settings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..loading.checkpoint_files import canvas_length_of
from ..loading.model import decode_text
from ..request.infill import cut_at_eos
from .batches import to_device
from .data import EOS, PAD, Example, ExampleMaker, ExampleStream, FileEntry
from .objective import autocast, diffusion_forward, pad_batch, weighted_ce

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion, PreTrainedTokenizerBase

HELD_OUT_SEED = 12345
"""The seed of the held-out example stream: the same held-out sets in every run."""
EVAL_BATCH = 8
"""Rows per held-out batch."""
CORRUPTION_SEED = 1234
"""The torch seed of every evaluation's corruption, so that evaluations compare."""


@dataclass
class HeldOut:
    """A run's fixed held-out sets."""

    batches: list[dict[str, torch.Tensor]]
    """Padded batches for the loss and accuracy, on the training device."""
    em_examples: list[Example]
    """Single-line examples for first-line exact match."""
    rest_of_line: list[Example]
    """Rest-of-line examples (the cursor inside a line, often inside a word) for exact match on their canvas."""


def held_out_sets(
    entries: list[FileEntry], maker: ExampleMaker, n_eval: int, n_em: int, device: torch.device
) -> HeldOut:
    """The first ``n_eval`` held-out examples, batched, then the next ``n_em`` single-line ones and the next
    ``n_em`` rest-of-line ones (prefix first, the engine's order)."""
    held = ExampleStream(entries, maker, held_out=True, seed=HELD_OUT_SEED)
    eval_examples = [next(held) for _ in range(n_eval)]
    batches = [
        to_device(pad_batch(eval_examples[i : i + EVAL_BATCH]), device)
        for i in range(0, len(eval_examples), EVAL_BATCH)
    ]
    em_examples: list[Example] = []
    rest_of_line: list[Example] = []
    while len(em_examples) < n_em or len(rest_of_line) < n_em:
        example = next(held)
        if example.kind == "line" and len(em_examples) < n_em:
            em_examples.append(example)
        elif example.kind == "rest_of_line" and len(rest_of_line) < n_em:
            rest_of_line.append(example)
    return HeldOut(batches=batches, em_examples=em_examples, rest_of_line=rest_of_line)


def first_line(text: str) -> str:
    """The text's first line, without trailing spaces."""
    return text.split("\n", 1)[0].rstrip()


def infill(
    model: DiffusionGemmaForBlockDiffusion,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[int],
    seed: int = 0,
    canvas: int | None = None,
) -> tuple[str, list[int], float]:
    """One canvas with ``model.generate`` (the engine's sampler settings); text up to the first <eos>, its tokens,
    and the tokens per forward pass. A ``canvas`` shorter than the model's gets proportionally fewer steps, as
    the engine gives it (``diffgemma_engine.request.infill.check_request``)."""
    torch.manual_seed(seed)
    own = canvas_length_of(model.config)
    canvas = canvas or own
    # set by ``configs.set_generation_defaults``, an extra attribute of a plain ``GenerationConfig``
    steps = max(1, int(getattr(model.generation_config, "max_denoising_steps", 16)) * canvas // own)
    model.config.canvas_length = canvas
    try:
        out = model.generate(
            input_ids=torch.tensor([prompt_ids], device=model.device), max_new_tokens=canvas, max_denoising_steps=steps
        )
    finally:
        model.config.canvas_length = own
    tokens, _ = cut_at_eos(out.sequences[0, len(prompt_ids) :].tolist(), {EOS}, PAD)
    return decode_text(tokenizer, tokens, skip_special_tokens=True), tokens, float(out.tokens_per_forward[0])


@torch.no_grad()
def evaluate(
    model: DiffusionGemmaForBlockDiffusion,
    tokenizer: PreTrainedTokenizerBase,
    held_out: HeldOut,
    middle_weight: float,
) -> dict[str, Any]:
    """The held-out figures of ``train.log``'s eval records; the caller's torch RNG and training mode are kept."""
    was_training = model.training
    model.train(False)  # model.eval(), which transformers leaves unannotated
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(CORRUPTION_SEED)
    losses, canvas_losses = [], []
    hits_canvas = hits_middle = n_canvas = n_middle = 0
    for batch in held_out.batches:
        with autocast(model.device):
            logits, _ = diffusion_forward(model, batch, sc_prob=0.5)
        losses.append(weighted_ce(logits, batch, 1.0).item())
        canvas_losses.append(weighted_ce(logits, {**batch, "scored": batch["middle"]}, 1.0).item())
        # fully corrupted canvases (t = 1), one decoder pass without self-conditioning: what the first
        # denoising step sees
        with autocast(model.device):
            logits, _ = diffusion_forward(model, batch, t_override=1.0, self_condition=False)
        hit = logits.argmax(-1) == batch["ids"]
        canvas = batch["middle"]
        hits_canvas += int(hit[canvas].sum())
        n_canvas += int(canvas.sum())
        content = canvas & (batch["ids"] != PAD) & (batch["ids"] != EOS)
        hits_middle += int(hit[content].sum())
        n_middle += int(content.sum())
    exact, tokens_per_forward, started = 0, 0.0, time.perf_counter()
    samples = []
    for i, example in enumerate(held_out.em_examples):
        text, _, example_tokens_per_forward = infill(model, tokenizer, example.ids[: example.prompt_len], seed=i)
        tokens_per_forward += example_tokens_per_forward
        exact += first_line(text) == first_line(example.middle_text)
        if i < 3:
            samples.append({"want": example.middle_text, "got": text})
    generate_s = time.perf_counter() - started
    rest_exact = 0
    for i, example in enumerate(held_out.rest_of_line):
        text, _, _ = infill(model, tokenizer, example.ids[: example.prompt_len], seed=i, canvas=example.canvas)
        rest_exact += first_line(text) == first_line(example.middle_text)
    torch.random.set_rng_state(rng_state)
    model.train(was_training)
    n_em = max(len(held_out.em_examples), 1)
    return {
        "heldout_loss": sum(losses) / len(losses),
        "heldout_canvas_loss": sum(canvas_losses) / len(canvas_losses),
        "full_noise_acc_canvas": hits_canvas / max(n_canvas, 1),
        "full_noise_acc_middle_tokens": hits_middle / max(n_middle, 1),
        "first_line_em": exact / n_em,
        "n_em": len(held_out.em_examples),
        "rest_of_line_em": rest_exact / max(len(held_out.rest_of_line), 1),
        "tokens_per_forward": tokens_per_forward / n_em,
        "ms_per_infill": 1000 * generate_s / n_em,
        "samples": samples,
    }
