"""The sampler: the denoising schedule's settings, what a step's logits give it, and which tokens it accepts.

One step's logits become :class:`Scores` (temperature, argmax, probabilities, entropy, each computed once); the
lowest-entropy positions within the bound are accepted (:func:`accept_mask`) and only they draw a token
(:func:`sample_accepted`, :func:`draw_tokens`). Torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class SamplerSettings:
    """The denoising schedule; defaults are the released generation config's."""

    max_steps: int = 48
    t_min: float = 0.4
    t_max: float = 0.8
    entropy_bound: float = 0.1
    stability_threshold: int = 1
    confidence_threshold: float = 0.005
    exact: bool = False
    """Draw random numbers exactly as ``generate`` does (same tokens for the same seed), at the cost of a
    multinomial over every canvas position each step. Off: sample only the accepted positions."""


class Scores(NamedTuple):
    """What the sampler needs from one step's logits, each computed once."""

    logits: torch.Tensor  # (B, C, V) divided by the step's temperature; the next step's self-conditioning
    best: torch.Tensor  # (B, C) argmax
    probs: torch.Tensor  # (B, C, V) float32 softmax
    entropy: torch.Tensor  # (B, C)


def score_logits(logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> Scores:
    """Temperature, argmax, probabilities and entropy of (B, C, V) logits.

    The entropy is ``logsumexp(x) - sum(p * x)`` (the same as ``-sum(p * log p)``), so no vocabulary-sized
    log-probabilities are made: each such float32 tensor is 256 MiB per row for the release (canvas 256 x 262,144).
    The model's logits are soft-capped, hence finite.
    """
    logits = logits / temperature
    as_float = logits.float()
    probs = torch.softmax(as_float, dim=-1)
    entropy = torch.logsumexp(as_float, dim=-1) - torch.linalg.vecdot(probs, as_float)
    return Scores(logits, logits.argmax(dim=-1), probs, entropy)


def sample_accepted(
    scores: Scores, canvas: torch.Tensor, bound: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's fast path: (sample, accepted) with a draw only where a token is accepted.

    Which positions are accepted depends only on their entropies, so the (B*C, V) multinomial draw that
    ``generate`` makes, most of it thrown away, shrinks to the accepted rows, and each of those takes one
    uniform number (``draw_tokens``). Same distribution, a different random stream: use ``exact`` for
    token-for-token agreement with ``generate``.
    """
    accepted = accept_mask(scores.entropy, bound)
    sample = canvas.clone()
    rows = accepted.nonzero(as_tuple=True)
    if rows[0].numel():
        sample[rows] = draw_tokens(scores.probs[rows], generator)
    return sample, accepted


def draw_tokens(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` (R, V), drawn by inverting the cumulative distribution; ``probs`` is
    overwritten with it (one vocabulary-sized tensor fewer).

    ``torch.multinomial`` draws an exponential variate for every vocabulary entry of every row (on CPU, a large
    share of a small model's step); this draws one uniform number per row.
    ``right=True`` skips zero-probability tokens when the number is exactly 0.
    """
    cdf = probs.cumsum_(dim=-1)  # (R, V), in place: callers pass a copy (the accepted rows)
    uniform = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype)
    tokens = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True)
    return tokens.clamp_max(probs.shape[-1] - 1).squeeze(-1)


def accept_mask(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """Positions whose lower-entropy peers sum to at most ``bound`` (the lowest one always qualifies)."""
    sorted_entropy, order = torch.sort(entropy, dim=-1)
    keep_sorted = torch.cumsum(sorted_entropy, dim=-1) - sorted_entropy <= bound
    return torch.scatter(torch.zeros_like(keep_sorted), dim=-1, index=order, src=keep_sorted)
