"""The sampler: the denoising schedule's settings, what a step's logits give it, which tokens it accepts and draws,
and when a row stops. transformers states its sampler and stopper as small named pieces too
(``generation_diffusion_gemma.py``); these are the engine's, each used by the one step
(``diffgemma_engine.canvas.step``):

* scoring: one step's logits become :class:`Scores` (temperature, argmax, probabilities, entropy, each computed
  once), with ``generate``'s arithmetic (:func:`exact_scores`) or a cheaper entropy (:func:`score_logits`);
* acceptance: the lowest-entropy positions within the bound (:func:`accept_mask`);
* drawing: :class:`ExactSampler` (``generate``'s random stream, its numbers drawn outside the step by
  :meth:`StepNoise.draw`, so the step has no host in it) or :class:`AcceptedOnlySampler` (a draw only where a
  token is accepted: less work on a CPU, another random stream);
* stopping: :func:`settled`, stable and confident;
* confidence: :func:`stable_steps`, how many steps in a row each position's argmax has been its answer token; as
  a share of the steps the row ran, what the engine reports with the answer (``Result.confidence``).

Torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

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


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``torch.distributions.Categorical(logits=logits).entropy()``, the same arithmetic, without the argument
    check (an ``.all()`` read by the host)."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(normalized, dim=-1)
    clamped = torch.clamp(normalized, min=torch.finfo(normalized.dtype).min)
    return -(clamped * probs).sum(-1)


def exact_scores(logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> Scores:
    """:class:`Scores` with ``generate``'s arithmetic: its temperature, float32 softmax and ``Categorical``
    entropy (the same tokens for the same seed)."""
    logits = logits / temperature
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    return Scores(logits, torch.argmax(logits, dim=-1), probs, categorical_entropy(logits))


@dataclass
class StepNoise:
    """One step's random numbers for :class:`ExactSampler`, drawn outside the step with the request's generator."""

    exponential: torch.Tensor  # (B * C, V) float32: the variates ``torch.multinomial`` would draw
    renoise: torch.Tensor  # (B, C) long: the random tokens for positions not accepted

    @classmethod
    def draw(
        cls, batch: int, canvas_length: int, vocab_size: int, device: torch.device, generator: torch.Generator | None
    ) -> StepNoise:
        """What ``generate``'s step draws, in its order: the multinomial's variates, then the renoising tokens."""
        exponential = torch.empty((batch * canvas_length, vocab_size), dtype=torch.float32, device=device)
        exponential.exponential_(1, generator=generator)
        renoise = torch.randint(0, vocab_size, (batch, canvas_length), device=device, generator=generator)
        return cls(exponential, renoise)


class Sampler(Protocol):
    """How a step scores its logits and draws its tokens."""

    def scores(self, logits: torch.Tensor, temperature: torch.Tensor) -> Scores:
        """The step's :class:`Scores` from the decoder's logits (B, C, V)."""
        ...

    def draw(
        self, scores: Scores, canvas: torch.Tensor, accepted: torch.Tensor, noise: StepNoise | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sample, renoise), both (B, C): the tokens the ``accepted`` positions take, and the others' noise."""
        ...


class ExactSampler:
    """``generate``'s sampler: a multinomial draw at every position, as ``argmax(p / q)`` over the exponential
    variates ``q`` that ``torch.multinomial`` draws (:class:`StepNoise`, drawn outside the step in the same order),
    so the same seed gives the same tokens and the step reads nothing back on the host."""

    def scores(self, logits: torch.Tensor, temperature: torch.Tensor) -> Scores:
        return exact_scores(logits, temperature)

    def draw(
        self, scores: Scores, canvas: torch.Tensor, accepted: torch.Tensor, noise: StepNoise | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if noise is None:
            raise ValueError("the exact sampler's numbers are drawn before the step (StepNoise.draw)")
        probs = scores.probs
        sample = (probs.view(-1, probs.shape[-1]) / noise.exponential).argmax(dim=-1).view(canvas.shape)
        return sample, noise.renoise


@dataclass
class AcceptedOnlySampler:
    """The fast sampler: a draw only where a token is accepted (:func:`draw_accepted`), then the renoising
    tokens, both from ``generator`` inside the step (the accepted positions' ``nonzero`` is a host read)."""

    generator: torch.Generator | None

    def scores(self, logits: torch.Tensor, temperature: torch.Tensor) -> Scores:
        return score_logits(logits, temperature)

    def draw(
        self, scores: Scores, canvas: torch.Tensor, accepted: torch.Tensor, noise: StepNoise | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sample = draw_accepted(scores, canvas, accepted, self.generator)
        vocab_size = scores.logits.shape[-1]
        renoise = torch.randint(0, vocab_size, canvas.shape, device=canvas.device, generator=self.generator)
        return sample, renoise


def settled(
    history: torch.Tensor, best: torch.Tensor, entropy: torch.Tensor, settings: SamplerSettings
) -> torch.Tensor:
    """The stopper: the (B,) rows whose ``best`` (B, C) equals each of the last steps' (``history``, (S, B, C)) and
    whose mean entropy is under the confidence threshold."""
    if settings.stability_threshold == 0:
        stable = torch.ones(best.shape[0], dtype=torch.bool, device=best.device)
    else:
        stable = (history == best[None]).all(dim=-1).all(dim=0)
    return stable & (entropy.mean(dim=-1) < settings.confidence_threshold)


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
    return draw_accepted(scores, canvas, accepted, generator), accepted


def draw_accepted(
    scores: Scores, canvas: torch.Tensor, accepted: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """``canvas`` with a token drawn (:func:`draw_tokens`) at each ``accepted`` position."""
    sample = canvas.clone()
    rows = accepted.nonzero(as_tuple=True)
    if rows[0].numel():
        sample[rows] = draw_tokens(scores.probs[rows], generator)
    return sample


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


def stable_steps(best: torch.Tensor, previous: torch.Tensor, stable: torch.Tensor | None) -> torch.Tensor:
    """(B, C) float32: how many steps in a row, this one included, each position's argmax has been ``best``;
    ``previous`` is the last step's argmax (before the first step, the canvas it starts from) and ``stable`` the last
    step's count (None or 0 before the first step). A held position's argmax is its token at every step.

    Divided by the steps the row ran, it is the answer's confidence: the share of the denoising the model has kept
    each token. The probability of a token at the last step is about 1 wherever a canvas settled, wrong tokens
    included (the stopper wants a mean entropy under ``confidence_threshold``), and its probability when it was
    chosen ranks right tokens no better than chance; how long it has been kept ranks them best of what the loop can
    keep without a vocabulary-sized tensor across steps (benchmarks/README.md, "Which confidence")."""
    ones = torch.ones(best.shape, dtype=torch.float32, device=best.device)
    return ones if stable is None else torch.where(best == previous, stable + 1.0, ones)
