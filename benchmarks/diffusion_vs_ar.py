"""The canvas against an autoregressive decoder of the same size, producing the same number of tokens.

    python -m benchmarks.diffusion_vs_ar [--model DIR] [--prompt 300] [--tokens 32] [--repeats 5] [--threads N]

The autoregressive side is a Gemma 4 causal model (``Gemma4ForCausalLM``) built from the diffusion model's own
text config (same layers, widths, attention pattern and mixture of experts; the per-layer input embeddings
off), with random weights, decoding greedily with a KV cache. The diffusion side is the engine's loop on the
checkpoint, every denoising step run (the early stop disabled) so both produce exactly ``--tokens`` tokens.
Reports ``tokens_per_s_ratio`` (diffusion / AR) and where each spends its time. Writes
``benchmarks/results/diffusion_vs_ar.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache, Gemma4ForCausalLM, Gemma4TextConfig

from benchmarks.machine import machine_report
from benchmarks.plots import bars
from benchmarks.report import RESULTS, write_report
from diffgemma_engine.canvas.denoise import run_canvas
from diffgemma_engine.loading.model import load_model


def causal_twin(text_config: object) -> Gemma4ForCausalLM:
    """A Gemma 4 causal LM with the diffusion model's architecture."""
    fields = text_config.to_dict()  # type: ignore[attr-defined]
    for key in ("model_type", "architectures", "transformers_version", "use_bidirectional_attention"):
        fields.pop(key, None)
    fields.update(enable_moe_block=True, hidden_size_per_layer_input=0)
    return Gemma4ForCausalLM(Gemma4TextConfig(**fields)).eval()


def time_ar(model: Gemma4ForCausalLM, prompt: torch.Tensor, tokens: int) -> dict[str, float]:
    """Greedy decoding with a KV cache: prefill, then one forward per token."""
    with torch.inference_mode():
        start = time.perf_counter()
        cache = DynamicCache(config=model.config)
        out = model(input_ids=prompt, cache=cache, use_cache=True)
        prefill = time.perf_counter()
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(tokens - 1):
            out = model(input_ids=token, cache=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        end = time.perf_counter()
    return {
        "prefill_ms": (prefill - start) * 1000,
        "decode_ms": (end - prefill) * 1000,
        "total_ms": (end - start) * 1000,
    }


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--prompt", type=int, default=300, help="prompt tokens (HumanEval prompts are 150-300)")
    parser.add_argument("--tokens", type=int, default=0, help="tokens to produce (default: the canvas length)")
    parser.add_argument("--steps", type=int, default=0, help="denoising steps (default: the model's)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "diffusion_vs_ar.json")
    args = parser.parse_args()
    machine = machine_report()  # before the benchmark loads the machine
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    tokens = args.tokens or loaded.canvas_length
    steps = args.steps or loaded.sampler.max_steps
    settings = dataclasses.replace(loaded.sampler, max_steps=steps, confidence_threshold=-1.0)  # never settle
    torch.manual_seed(0)
    ar = causal_twin(loaded.model.config.get_text_config(decoder=True))
    prompt = torch.randint(20, loaded.model.config.text_config.vocab_size - 20, (1, args.prompt))
    ar_runs, dg_runs = [], []
    for repeat in range(args.repeats + 1):
        ar_time = time_ar(ar, prompt, tokens)
        out = run_canvas(loaded.model, prompt, tokens, settings, generator=torch.Generator().manual_seed(repeat))
        if repeat:  # the first round warms up
            ar_runs.append(ar_time)
            dg_runs.append(
                {
                    "encode_ms": out.encode_ms,
                    "denoise_ms": out.denoise_ms,
                    "total_ms": out.encode_ms + out.denoise_ms,
                    "steps": out.steps,
                }
            )

    def median(runs: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(run[key] for run in runs), 2)

    ar_total, dg_total = median(ar_runs, "total_ms"), median(dg_runs, "total_ms")
    params = sum(p.numel() for n, p in loaded.model.named_parameters() if "vision" not in n)
    figures = {
        "model": loaded.model_id,
        "parameters_m": round(params / 1e6, 2),
        "ar_parameters_m": round(sum(p.numel() for p in ar.parameters()) / 1e6, 2),
        "prompt_tokens": args.prompt,
        "tokens": tokens,
        "denoising_steps": steps,
        "threads": torch.get_num_threads(),
        "ar": {
            "total_ms": ar_total,
            "prefill_ms": median(ar_runs, "prefill_ms"),
            "ms_per_token": round(median(ar_runs, "decode_ms") / max(tokens - 1, 1), 2),
            "tokens_per_s": round(tokens / ar_total * 1000, 1),
        },
        "diffusion": {
            "total_ms": dg_total,
            "encode_ms": median(dg_runs, "encode_ms"),
            "ms_per_step": round(median(dg_runs, "denoise_ms") / steps, 2),
            "tokens_per_s": round(tokens / dg_total * 1000, 1),
        },
        "tokens_per_s_ratio": round(ar_total / dg_total, 3),
    }
    write_report(
        args.out,
        figures,
        machine,
        plot=lambda png: bars(
            png,
            f"{figures['tokens']} new tokens, same model size: ratio {figures['tokens_per_s_ratio']}",
            ["autoregressive (greedy, KV cache)", f"canvas ({figures['denoising_steps']} steps)"],
            [figures["ar"]["tokens_per_s"], figures["diffusion"]["tokens_per_s"]],
            "tokens/s",
        ),
    )


if __name__ == "__main__":
    main()
