"""The released DiffusionGemma 26B-A4B shape, random weights in bf16, on a GPU: what a completion costs.

    python -m benchmarks.gpu_shape                 # on a CUDA machine (one H200)
    python -m benchmarks.gpu_shape --shape small   # the same script on a CPU, with a scaled-down shape
    python -m benchmarks.gpu_shape --loops eager static captured --canvases 32,64,256 --steps 8,16,48

For canvases of 32, 64 and 256 and 8, 16 and 48 denoising steps (every step run), it times each loop on a 1,024-token
prompt and reports milliseconds per completion, per step, and tokens per second, with the step's bandwidth floor
beside (``floor_ms``: the weights a step reads over the memory bandwidth measured here by a device copy). The loops:

* ``eager``: the engine's loop (``diffgemma_engine.canvas.denoise.run_canvas``), with and without prefix reuse (then one
  more token, as after a keystroke);
* ``static``: the capturable step (``diffgemma_engine.canvas.static``) run op by op: fixed shapes, no host sync inside;
* ``captured``: the same step compiled as one graph with ``mode="reduce-overhead"``: on a GPU, a CUDA graph replayed
  once a step (the compile and its warm-up are timed apart, as ``compile_s``).

The weights are random, so no canvas settles early: these are worst-case step counts. Writes
``benchmarks/results/gpu_shape.json`` (rows appended as they are measured) and a plot beside it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import (
    DiffusionGemmaForBlockDiffusion,
    DiffusionGemmaTextConfig,
    DynamicCache,
)

from benchmarks.machine import synchronize
from benchmarks.plots import pyplot, save
from benchmarks.report import RESULTS, write_json
from diffgemma_engine.canvas.caches import PrefixCache, encode_prompt
from diffgemma_engine.canvas.denoise import run_canvas
from diffgemma_engine.canvas.sampler import SamplerSettings
from diffgemma_engine.canvas.static import StaticPrompt, compile_step, denoise_static, prompt_bucket
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
STRUCTURE = dict(
    RELEASE,
    vocab_size=512,
    hidden_size=64,
    intermediate_size=64,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    global_head_dim=32,
    sliding_window=64,
    moe_intermediate_size=16,
)
"""The release's layer structure (30 layers, five sliding then one full, 128 experts with 8 active beside the
dense MLP, full layers with their own head size and key/value heads) at toy widths: what the operator count and the
host synchronisations of a step come to, measured on a CPU in seconds (``tests/engine/test_static_step.py``)."""


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


def bandwidth_gb_s(device: torch.device, megabytes: int = 2048) -> float | None:
    """The memory bandwidth a device-to-device copy reaches here (read plus write), GB/s; None on a CPU."""
    if device.type != "cuda":
        return None
    source = torch.empty(megabytes << 20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    synchronize(device)
    start = time.perf_counter()
    repeats = 10
    for _ in range(repeats):
        target.copy_(source)
    synchronize(device)
    return 2 * repeats * source.numel() / (time.perf_counter() - start) / 1e9


def bytes_per_step(model: DiffusionGemmaForBlockDiffusion, canvas: int) -> float:
    """The weights one decoder step reads: every dense weight, and each expert with the chance that at least one of
    the canvas's tokens routes to it (``1 - (1 - k/E)^C``, uniform routing: random weights route about so). The
    vision tower and the encoder-only weights are not read (the encoder and decoder are tied)."""
    text = model.config.get_text_config()
    experts, active = text.num_experts, text.top_k_experts
    touched = 1 - (1 - active / experts) ** canvas
    total = 0.0
    seen: set[int] = set()
    for name, parameter in model.named_parameters():
        if "vision" in name or id(parameter) in seen:
            continue
        seen.add(id(parameter))
        share = touched if ".experts." in name else 1.0
        total += parameter.numel() * parameter.element_size() * share
    return total


def plot(figures: dict, path: Path) -> None:
    """Milliseconds per step against the canvas, one line per loop, with the bandwidth floor."""
    plt = pyplot()
    if plt is None:
        return
    figure, axes = plt.subplots(figsize=(6, 3.6))
    rows = [r for r in figures["rows"] if not r.get("prefix_reuse")]
    for loop in sorted({r["loop"] for r in rows}):
        for steps in sorted({r["steps"] for r in rows}):
            mine = sorted((r["canvas"], r["ms_per_step"]) for r in rows if r["loop"] == loop and r["steps"] == steps)
            if mine:
                axes.plot(*zip(*mine, strict=True), marker="o", label=f"{loop}, {steps} steps")
    floors = sorted({(r["canvas"], r["floor_ms"]) for r in rows if r.get("floor_ms")})
    if floors:
        axes.plot(*zip(*floors, strict=True), "k--", label="bandwidth floor")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("canvas tokens")
    axes.set_ylabel("ms per denoising step")
    axes.set_title(f"{figures['shape']} shape, {figures['dtype']}, {figures['device']}", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    save(figure, path)


def timed(device: torch.device, run, *args, **kwargs) -> tuple[float, Any]:
    """(milliseconds, result) of ``run(*args, **kwargs)``, the device's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    out = run(*args, **kwargs)
    synchronize(device)
    return (time.perf_counter() - start) * 1000, out


class Measure:
    """The rows of one run: each loop's time per step and per completion at each canvas and step count, written
    after every row (a run cut short keeps what it measured)."""

    def __init__(
        self, model: Any, prompt: torch.Tensor, figures: dict[str, Any], out: Path, bandwidth: float | None
    ) -> None:
        self.model, self.prompt, self.figures, self.out = model, prompt, figures, out
        self.device = prompt.device
        self.bandwidth = bandwidth
        """The device's measured memory bandwidth, GB/s (None: not measured)."""

    def record(self, row: dict, canvas: int, steps: int, total_ms: float, step_ms: float) -> None:
        read = bytes_per_step(self.model, canvas)
        floor = read / (self.bandwidth * 1e9) * 1000 if self.bandwidth else None
        row.update(
            canvas=canvas,
            steps=steps,
            ms_per_completion=round(total_ms, 1),
            ms_per_step=round(step_ms, 2),
            tokens_per_s=round(canvas / total_ms * 1000, 1),
            floor_ms=round(floor, 2) if floor else None,
            gb_read_per_step=round(read / 1e9, 2),
        )
        self.figures["rows"].append(row)
        print(json.dumps(row), flush=True)
        if self.device.type == "cuda":
            self.figures["max_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
        write_json(self.out, self.figures)

    def eager_rows(self, canvas: int, steps: int) -> None:
        model, prompt = self.model, self.prompt
        settings = SamplerSettings(max_steps=steps, confidence_threshold=-1.0)
        run_canvas(model, prompt, canvas, settings)  # warm-up for this shape
        for reuse in (False, True):
            cache = PrefixCache(model) if reuse else None
            if cache is not None:
                cache.prepare("doc", prompt[0].tolist())  # the keystroke before
            typed = torch.cat([prompt, prompt[:, -1:]], dim=1)
            total_ms, out = timed(
                self.device, run_canvas, model, typed, canvas, settings, prefix_cache=cache, cache_key="doc"
            )
            row = {"loop": "eager", "prefix_reuse": reuse, "encode_ms": round(out.encode_ms, 1)}
            self.record(row, canvas, steps, total_ms, out.denoise_ms / out.steps)

    def static_rows(self, loop: str, canvas: int, step_counts: list[int]) -> None:
        model, prompt, device = self.model, self.prompt, self.device
        view = DynamicCache(config=model.config.get_text_config(decoder=True))
        encode_prompt(model, prompt, view)
        static_prompt = StaticPrompt.allocate(model, view, 1, prompt_bucket(prompt.shape[1]), canvas)
        static_prompt.load([view])
        step, compile_s = None, None
        for steps in step_counts:
            settings = SamplerSettings(max_steps=steps, confidence_threshold=-1.0, exact=True)
            if loop == "captured" and step is None:  # one graph per canvas, whatever the step count
                step = compile_step(model, settings, mode="reduce-overhead")
                warm_ms = 0.0
                for _ in range(3):  # compile, record the graph, replay it: three warm-up canvases
                    warm_ms += timed(device, denoise_static, model, static_prompt, settings, step=step)[0]
                compile_s = round(warm_ms / 1000, 1)
            elif loop == "static":
                denoise_static(model, static_prompt, settings)  # warm-up
            total_ms, out = timed(device, denoise_static, model, static_prompt, settings, step=step)
            self.record({"loop": loop, "compile_s": compile_s}, canvas, steps, total_ms, total_ms / out.steps)


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["release", "small", "structure"], default="release")
    parser.add_argument("--canvases", default="32,64,256")
    parser.add_argument("--steps", default="8,16,48")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--loops", nargs="+", choices=["eager", "static", "captured"], default=["eager"])
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_shape.json")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    started = time.perf_counter()
    model = build({"release": RELEASE, "small": SMALL, "structure": STRUCTURE}[args.shape], device, dtype)
    load_s = time.perf_counter() - started
    bandwidth = bandwidth_gb_s(device)
    vocab = model.config.text_config.vocab_size
    prompt = torch.randint(10, vocab - 10, (1, args.prompt), device=device)
    figures = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "prompt_tokens": args.prompt,
        "build_s": round(load_s, 1),
        "bandwidth_gb_s": round(bandwidth, 1) if bandwidth else None,
        "rows": [],
    }
    measure = Measure(model, prompt, figures, args.out, bandwidth)
    step_counts = [int(steps) for steps in args.steps.split(",")]
    with torch.inference_mode():
        for canvas in map(int, args.canvases.split(",")):
            if "eager" in args.loops:
                for steps in step_counts:
                    measure.eager_rows(canvas, steps)
            for loop in args.loops:
                if loop != "eager":
                    measure.static_rows(loop, canvas, step_counts)
    plot(figures, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
