"""The sampler's own arithmetic: the token draw and the entropy-bound acceptance."""

from __future__ import annotations

import torch

from diffgemma_engine.canvas.sampler import accept_mask, draw_tokens, sample_accepted, score_logits


def test_draw_tokens_follows_each_rows_distribution() -> None:
    probs = torch.tensor(
        [
            [0.0, 0.5, 0.0, 0.3, 0.2, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
            [0.1, 0.1, 0.1, 0.1, 0.1, 0.5],
        ]
    )
    draws = 20_000
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros_like(probs)
    for _ in range(draws // 100):
        tokens = draw_tokens(probs.repeat_interleave(100, dim=0), generator).view(3, 100)
        for row in range(3):
            counts[row] += torch.bincount(tokens[row], minlength=probs.shape[1])
    frequencies = counts / draws
    assert counts[probs == 0].sum() == 0, "a token with zero probability was drawn"
    sigma = (probs * (1 - probs) / draws).sqrt()
    assert ((frequencies - probs).abs() <= 5 * sigma + 1e-9).all(), frequencies


def test_draw_tokens_is_reproducible_for_a_seed_and_scales_unnormalised_rows() -> None:
    probs = torch.softmax(torch.randn(8, 50, generator=torch.Generator().manual_seed(1)), dim=-1)
    first = draw_tokens(probs.clone(), torch.Generator().manual_seed(7))  # it writes the cdf over its argument
    again = draw_tokens(probs * 3.0, torch.Generator().manual_seed(7))  # same cdf up to scale
    assert torch.equal(first, again)
    assert first.shape == (8,) and first.dtype == torch.long


def test_accept_mask_keeps_the_lowest_entropies_within_the_bound() -> None:
    entropy = torch.tensor([[0.5, 0.01, 0.04, 0.2, 0.03]])
    # sorted: 0.01, 0.03, 0.04, 0.2, 0.5 -> the sums before each are 0, 0.01, 0.04, 0.08, 0.28
    assert accept_mask(entropy, 0.1).tolist() == [[False, True, True, True, True]]
    assert accept_mask(entropy, 0.0).tolist() == [[False, True, False, False, False]]


def test_sample_accepted_draws_only_where_the_entropy_bound_accepts() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 16, 40, generator=generator) * torch.linspace(0.5, 30, 16)[None, :, None]
    canvas = torch.randint(0, 40, (2, 16), generator=generator)
    scores = score_logits(logits)
    sample, accepted = sample_accepted(scores, canvas, 0.1, generator)
    entropy = scores.entropy
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(entropy, expected, atol=1e-4)
    assert torch.equal(accepted, accept_mask(entropy, 0.1))
    assert 0 < int(accepted.sum()) < accepted.numel()
    assert torch.equal(sample[~accepted], canvas[~accepted])
    # the sharpest positions (scale 30) put nearly all their mass on the argmax, so their draw is the argmax
    sharp = accepted & (entropy < 1e-6)
    assert sharp.any() and torch.equal(sample[sharp], logits.argmax(-1)[sharp])
