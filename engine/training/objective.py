"""The DiffusionGemma training objective: a batch's block layout, the corrupted forward pass, and the loss.

Objective (DiffusionGemma, notes §8): uniform-state corruption with one level t ~ U(eps, 1) per (example, block),
cross-entropy on every position of every block (prompt blocks, the middle, its <eos> and the <pad> after it), and
two-pass self-conditioning (pass 1 without gradients, pass 2 reads its logits with probability 0.5). One step
scores every token of the batch: the encoder runs causally over the clean sequence once, the decoder denoises all
canvas-sized blocks at once, each against the clean tokens before it, through a block-causal 4-D mask dict.

Shape comments name the axes: ``batch`` (rows), ``seq`` (the padded sequence), ``keys`` (clean then noisy
sequence, ``2 * seq``), ``vocab``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..canvas.runtime import text_config_of
from .data import PAD, Example

if TYPE_CHECKING:
    from transformers import DiffusionGemmaForBlockDiffusion

ROW_PADDING_BLOCKS = 10_000
"""Block numbers from here on mark row padding: each such position is a block of its own."""


def pad_batch(examples: list[Example]) -> dict[str, torch.Tensor]:
    """Right-pad to a common length and describe the blocks of each row, every tensor ``(batch, seq)``.

    Each row's blocks are its own canvas long (``Example.canvas``: the line canvas for the rest of a line).

    ``start[row, i]`` is the first position of the block of position i (the clean context it sees ends there),
    ``block[row, i]`` its block number, ``scored[row, i]`` whether it is a real (not row padding) position,
    ``middle[row, i]`` whether it is in the canvas block.
    """
    seq_len = max(len(example.ids) for example in examples)
    batch_size = len(examples)
    ids = torch.full((batch_size, seq_len), PAD, dtype=torch.long)
    start = torch.zeros(batch_size, seq_len, dtype=torch.long)
    block = torch.zeros(batch_size, seq_len, dtype=torch.long)
    scored = torch.zeros(batch_size, seq_len, dtype=torch.bool)
    middle = torch.zeros(batch_size, seq_len, dtype=torch.bool)
    for row, example in enumerate(examples):
        length, prompt_len, canvas = len(example.ids), example.prompt_len, example.canvas
        ids[row, :length] = torch.tensor(example.ids)
        # blocks counted backwards from the canvas start P = prompt_len, C = canvas: [.., P-2C, P-C), [P-C, P), [P, P+C)
        positions = torch.arange(seq_len)
        row_block = torch.div(positions - prompt_len, canvas, rounding_mode="floor")
        row_start = (prompt_len + row_block * canvas).clamp(min=0)
        # row padding after the canvas: each position its own block (sees clean context, scores nothing)
        tail = positions >= length
        row_block = torch.where(tail, ROW_PADDING_BLOCKS + positions, row_block)
        row_start = torch.where(tail, positions, row_start)
        start[row], block[row] = row_start, row_block
        scored[row, :length] = True
        middle[row, prompt_len:length] = True
    return {"ids": ids, "start": start, "block": block, "scored": scored, "middle": middle}


def block_masks(start: torch.Tensor, block: torch.Tensor, window: int) -> dict[str, torch.Tensor]:
    """4-D bool masks ``(batch, 1, seq, keys)`` (True = attend) over keys ``[clean sequence ; noisy sequence]``.

    A query at i sees clean keys j < start[i] (sliding layers: only the last window-1 of them, as the
    inference cache holds) and the noisy keys of its own block, bidirectionally.
    """
    seq_len = start.shape[1]
    key_positions = torch.arange(seq_len, device=start.device)[None, None, :]
    query_start = start[:, :, None]
    clean_full = key_positions < query_start
    clean_slide = clean_full & (key_positions >= query_start - (window - 1))
    noisy = block[:, :, None] == block[:, None, :]
    return {
        "full_attention": torch.cat([clean_full, noisy], 2)[:, None],
        "sliding_attention": torch.cat([clean_slide, noisy], 2)[:, None],
    }


def diffusion_forward(
    model: DiffusionGemmaForBlockDiffusion,
    batch: dict[str, torch.Tensor],
    sc_prob: float = 0.5,
    eps: float = 1e-3,
    t_override: float | None = None,
    self_condition: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt, run encoder + (two-pass) decoder; return the logits ``(batch, seq, vocab)`` and the corrupted
    sequence ``(batch, seq)``."""
    clean, block = batch["ids"], batch["block"]
    batch_size, seq_len = clean.shape
    text = text_config_of(model.config)
    vocab_size = text.vocab_size
    device = clean.device
    cache = DynamicCache()  # config-less: keeps every position of every layer, with gradients
    model.model.encoder(input_ids=clean, cache=cache)
    # one level t per (example, block)
    if t_override is None:
        level_of_block = torch.empty(batch_size, seq_len, device=device).uniform_(eps, 1.0)
        block_index = (block - block.min(1, keepdim=True).values).clamp(max=seq_len - 1)
        level = torch.gather(level_of_block, 1, block_index)
    else:
        level = torch.full((batch_size, seq_len), float(t_override), device=device)
    corrupted = torch.rand(batch_size, seq_len, device=device) < level
    noise = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)
    noisy = torch.where(corrupted, noise, clean)
    masks = block_masks(batch["start"], block, text.sliding_window)
    positions = torch.arange(seq_len, device=device)[None].expand(batch_size, seq_len)
    decoder_inputs = dict(
        decoder_input_ids=noisy, cache=cache, decoder_attention_mask=masks, decoder_position_ids=positions
    )
    sc_logits = sc_mask = None
    if self_condition:
        with torch.no_grad():
            sc_logits = model(**decoder_inputs).logits
        sc_mask = torch.rand(batch_size, device=device) < sc_prob
    logits = model(**decoder_inputs, self_conditioning_logits=sc_logits, self_conditioning_mask=sc_mask).logits
    return logits, noisy


def weighted_ce(logits: torch.Tensor, batch: dict[str, torch.Tensor], middle_weight: float) -> torch.Tensor:
    """Mean cross-entropy over the scored positions, the canvas block weighing ``middle_weight``."""
    logits = logits.float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ids"].reshape(-1), reduction="none")
    weight = batch["scored"].float() * (1.0 + (middle_weight - 1.0) * batch["middle"].float())
    return (ce * weight.reshape(-1)).sum() / weight.sum()


def autocast(device: torch.device) -> torch.autocast:
    """bfloat16 forward passes on CUDA; nothing changes on CPU."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
