"""The released DiffusionGemma 26B-A4B shape, random weights in bf16, on a GPU: what a completion costs.

    python -m benchmarks.gpu_shape                 # on a CUDA machine (one H200)
    python -m benchmarks.gpu_shape --shape small   # the same script on a CPU, with a scaled-down shape

For canvases of 32, 64 and 256 and 8, 16 and 48 denoising steps (every step run), it times the engine's loop
with and without prefix reuse (a 1,024-token prompt, then one more token as after a keystroke) and reports
milliseconds per completion, per step, and tokens per second. The weights are random, so no canvas settles
early: these are worst-case step counts. Writes ``benchmarks/results/gpu_shape.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import (
    DiffusionGemmaForBlockDiffusion,
    DiffusionGemmaTextConfig,
)

from benchmarks.machine import synchronize
from benchmarks.plots import pyplot, save
from benchmarks.report import RESULTS, write_json
from diffgemma_engine.canvas.caches import PrefixCache
from diffgemma_engine.canvas.denoise import run_canvas
from diffgemma_engine.canvas.sampler import SamplerSettings
from diffgemma_engine.training.configs import text_only_config

RELEASE = dict(  # google/diffusiongemma-26B-A4B-it config.json (text part)
    vocab_size=262144,
    hidden_size=2816,
    intermediate_size=2112,
    num_hidden_layers=30,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=256,
    global_head_dim=512,
    num_global_key_value_heads=2,
    sliding_window=1024,
    num_experts=128,
    top_k_experts=8,
    moe_intermediate_size=704,
)
SMALL = dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    global_head_dim=64,
    num_global_key_value_heads=1,
    sliding_window=512,
    num_experts=8,
    top_k_experts=2,
    moe_intermediate_size=128,
)


def build(shape: dict[str, int], device: torch.device, dtype: torch.dtype) -> DiffusionGemmaForBlockDiffusion:
    """A random-weight model of ``shape``, built directly on ``device`` in ``dtype``."""
    layers = shape["num_hidden_layers"]
    text = DiffusionGemmaTextConfig(
        **shape,
        layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(layers - 1)]
        + ["full_attention"],
        use_bidirectional_attention="vision",
        max_position_embeddings=8192,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    vocab = shape["vocab_size"]
    config = text_only_config(text, 256, image_token_id=vocab - 1, boi_token_id=vocab - 2, eoi_token_id=vocab - 3)
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = DiffusionGemmaForBlockDiffusion(config)
    torch.set_default_dtype(torch.float32)
    return model.eval()


def plot(figures: dict, path: Path) -> None:
    """Milliseconds per completion against denoising steps, one line per canvas (dashed: no prefix reuse)."""
    plt = pyplot()
    if plt is None:
        return
    figure, axes = plt.subplots(figsize=(6, 3.6))
    for canvas in sorted({row["canvas"] for row in figures["rows"]}):
        for reuse, style in ((True, "-"), (False, "--")):
            rows = [r for r in figures["rows"] if r["canvas"] == canvas and r["prefix_reuse"] == reuse]
            label = f"canvas {canvas}" + ("" if reuse else ", no reuse")
            steps, ms = [r["steps"] for r in rows], [r["ms_per_completion"] for r in rows]
            axes.plot(steps, ms, style, marker="o", label=label)
    axes.set_xlabel("denoising steps (all run)")
    axes.set_ylabel("ms per completion")
    axes.set_title(f"{figures['shape']} shape, {figures['dtype']}, {figures['device']}", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    save(figure, path)


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["release", "small"], default="release")
    parser.add_argument("--canvases", default="32,64,256")
    parser.add_argument("--steps", default="8,16,48")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_shape.json")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    started = time.perf_counter()
    model = build(RELEASE if args.shape == "release" else SMALL, device, dtype)
    load_s = time.perf_counter() - started
    vocab = model.config.text_config.vocab_size
    prompt = torch.randint(10, vocab - 10, (1, args.prompt), device=device)
    rows = []
    with torch.inference_mode():
        for canvas in map(int, args.canvases.split(",")):
            for steps in map(int, args.steps.split(",")):
                settings = SamplerSettings(max_steps=steps, confidence_threshold=-1.0)
                run_canvas(model, prompt, canvas, settings)  # warm-up for this shape
                for reuse in (False, True):
                    cache = PrefixCache(model) if reuse else None
                    if cache is not None:
                        cache.prepare("doc", prompt[0].tolist())  # the keystroke before
                    typed = torch.cat([prompt, prompt[:, -1:]], dim=1)
                    synchronize(device)
                    start = time.perf_counter()
                    out = run_canvas(model, typed, canvas, settings, prefix_cache=cache, cache_key="doc")
                    synchronize(device)
                    total_ms = (time.perf_counter() - start) * 1000
                    rows.append(
                        {
                            "canvas": canvas,
                            "steps": steps,
                            "prefix_reuse": reuse,
                            "ms_per_completion": round(total_ms, 1),
                            "encode_ms": round(out.encode_ms, 1),
                            "ms_per_step": round(out.denoise_ms / out.steps, 2),
                            "tokens_per_s": round(canvas / total_ms * 1000, 1),
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
    figures = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "prompt_tokens": args.prompt,
        "build_s": round(load_s, 1),
        "max_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if device.type == "cuda" else None,
        "rows": rows,
    }
    write_json(args.out, figures)
    plot(figures, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
