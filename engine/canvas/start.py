"""Where a canvas starts: from noise, or (a rewrite) from given tokens, a share of them renoised, part-way down the
schedule, with some positions held. Torch only."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class StartCanvas:
    """A canvas to start from instead of noise (a rewrite)."""

    tokens: torch.Tensor  # (B, C) token ids: the text to rewrite, as the canvas would hold it
    fixed: torch.Tensor | None = None  # (B, C) bool: positions held at their token through every step
    strength: float = 1.0  # the share of the positions not held that are renoised at the start, in (0, 1]


def share_of(strength: float, count: int) -> int:
    """``ceil(strength * count)``, without a float's last bit rounding 0.7 * 10 up to 8."""
    return math.ceil(round(strength * count, 6))


def start_step(strength: float, max_steps: int) -> int:
    """The step of the schedule (counting down ``max_steps`` .. 1) a canvas renoised by ``strength`` starts at:
    ``ceil(strength * max_steps)``, at least 1 (a light touch runs few steps; 1 runs them all)."""
    return min(max_steps, max(1, share_of(strength, max_steps)))


def first_step(start: StartCanvas | None, max_steps: int) -> int:
    """The schedule's first step for a canvas: ``max_steps`` from noise, ``start_step`` from a start."""
    return max_steps if start is None else start_step(start.strength, max_steps)


def renoise_start(start: StartCanvas, vocab_size: int, generator: torch.Generator | None) -> torch.Tensor:
    """The first canvas of a rewrite (B, C): in each row ``ceil(strength * free)`` of its ``free`` positions (those
    not held), drawn with ``generator``, take a uniform random token (the sampler's own noise); the rest keep their
    start tokens."""
    tokens = start.tokens
    free = torch.ones_like(tokens, dtype=torch.bool) if start.fixed is None else ~start.fixed
    counts = torch.tensor([share_of(start.strength, int(n)) for n in free.sum(dim=-1).tolist()], device=tokens.device)
    order = torch.rand(tokens.shape, generator=generator, device=tokens.device).masked_fill(~free, 2.0)
    ranks = order.argsort(dim=-1).argsort(dim=-1)  # held positions rank last: never chosen
    chosen = ranks < counts[:, None]
    noise = torch.randint(0, vocab_size, tokens.shape, device=tokens.device, generator=generator)
    return torch.where(chosen, noise, tokens)


def first_canvas(
    shape: tuple[int, int],
    vocab_size: int,
    device: torch.device,
    generator: torch.Generator | None,
    start: StartCanvas | None,
) -> torch.Tensor:
    """The canvas before the first step: uniform random tokens, or ``start`` renoised (``renoise_start``)."""
    if start is None:
        return torch.randint(0, vocab_size, shape, device=device, generator=generator)
    return renoise_start(start, vocab_size, generator)
