"""The engine's infill loop against transformers' ``model.generate`` on one checkpoint, prompts and settings.

    python -m benchmarks.engine_vs_generate [--model DIR] [--requests 40] [--threads N] [--device cpu|cuda]

The workload is keystrokes: a prefix that grows one character at a time inside a real source file, with the
suffix after it. Both sides get the same prompt ids, canvas, step budget and seed; the figures are the median
latency ratio (``speedup_median``) and the share of requests whose tokens are identical. By default the engine
runs as it serves (prefix reuse, and samples drawn only where accepted: a different random stream, so tokens
differ from ``generate``'s; ``--step compiled`` as ``serve --step compiled``); ``--exact --no-prefix-reuse`` gives
generate's own random stream and arithmetic, and identical tokens.
Writes
``benchmarks/results/engine_vs_generate.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sysconfig
import time
from pathlib import Path

import torch

from benchmarks.machine import machine_report, synchronize
from benchmarks.plots import bars
from benchmarks.report import RESULTS, add_step_argument, write_report
from diffgemma_engine.canvas.denoise import run_canvas
from diffgemma_engine.canvas.sampler import SamplerSettings
from diffgemma_engine.canvas.warmup import trace_serving_shapes
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.infill import cut_at_eos, prompt_ids
from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.serve_options import StepMode


def workload(count: int) -> list[protocol.Infill]:
    """Typing into a stdlib file: the function's first ``count`` characters are typed back one at a time."""
    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()
    start = text.index("def dedent(")
    return [
        protocol.Infill(id=str(n), uri="file:///t.py", prefix=text[: start + n], suffix=text[start + count :], seed=n)
        for n in range(count)
    ]


def parse_args() -> argparse.Namespace:
    """The benchmark's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (the model in the engine's dtype there)")
    add_step_argument(
        parser,
        "the engine's step: eager, or compiled (serve --step compiled); compiling ends before the timing starts",
        choices=(StepMode.EAGER.value, StepMode.COMPILED.value),
    )
    parser.add_argument(
        "--exact", action="store_true", help="draw random numbers as generate does (identical tokens without reuse)"
    )
    parser.add_argument(
        "--no-prefix-reuse",
        dest="prefix_reuse",
        action="store_false",
        help="encode the whole prompt each time, as generate does (tokens then identical)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "engine_vs_generate.json")
    return parser.parse_args()


@dataclasses.dataclass
class Timings:
    """What each timed request gave (the first, a warm-up, is not kept)."""

    ratios: list[float] = dataclasses.field(default_factory=list)
    identical: int = 0
    ours_ms: list[float] = dataclasses.field(default_factory=list)
    reference_ms: list[float] = dataclasses.field(default_factory=list)
    steps: list[int] = dataclasses.field(default_factory=list)
    cached: list[int] = dataclasses.field(default_factory=list)
    encode_ms: list[float] = dataclasses.field(default_factory=list)


def measure(loaded: LoadedModel, settings: SamplerSettings, args: argparse.Namespace) -> Timings:
    """Each keystroke's request through ``generate`` and through the engine's loop, timed."""
    model, canvas, device = loaded.model, loaded.canvas_length, loaded.device
    timed = Timings()
    for index, request in enumerate([workload(1)[0], *workload(args.requests)]):
        ids = torch.tensor([prompt_ids(loaded, request)], device=device)
        synchronize(device)
        start = time.perf_counter()
        torch.manual_seed(request.seed or 0)
        reference = model.generate(input_ids=ids, max_new_tokens=canvas).sequences[0, ids.shape[1] :].tolist()
        middle = time.perf_counter()
        out = run_canvas(
            model,
            ids,
            canvas,
            settings,
            generator=torch.Generator(device=device).manual_seed(request.seed or 0),
            prefix_cache=loaded.serving.prefix_cache if args.prefix_reuse else None,
            cache_key="benchmark",
            step=loaded.serving.step,
        )
        synchronize(device)
        end = time.perf_counter()
        if index == 0:
            continue  # warm-up
        timed.reference_ms.append((middle - start) * 1000)
        timed.ours_ms.append((end - middle) * 1000)
        timed.ratios.append(timed.reference_ms[-1] / timed.ours_ms[-1])
        timed.steps.append(out.steps)
        timed.cached.append(out.cached_tokens)
        timed.encode_ms.append(out.encode_ms)
        same = cut_at_eos(out.tokens[0].tolist(), loaded.eos_ids, loaded.pad_id)
        timed.identical += same == cut_at_eos(reference, loaded.eos_ids, loaded.pad_id)
    return timed


def main() -> None:
    """Command-line entry point."""
    args = parse_args()
    machine = machine_report()  # before the benchmark loads the machine
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, args.device)
    settings = dataclasses.replace(loaded.sampler, exact=args.exact)
    if args.step == StepMode.COMPILED.value and not args.exact:  # exact runs generate's eager arithmetic
        loaded.serving.step.start_compiling(warm_up=trace_serving_shapes)
        loaded.serving.step.wait()
    timed = measure(loaded, settings, args)
    device = loaded.device
    figures = {
        "model": loaded.model_id,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(loaded.model.dtype).removeprefix("torch."),
        "requests": len(timed.ratios),
        "canvas_length": loaded.canvas_length,
        "max_steps": settings.max_steps,
        "steps_mean": round(statistics.fmean(timed.steps), 2),
        "generate_ms_median": round(statistics.median(timed.reference_ms), 1),
        "engine_ms_median": round(statistics.median(timed.ours_ms), 1),
        "speedup_median": round(statistics.median(timed.ratios), 3),
        "identical_tokens": f"{timed.identical}/{len(timed.ratios)}",
        "prefix_reuse": args.prefix_reuse,
        "exact_sampler": args.exact,
        "engine_step": loaded.serving.step.state,
        "compile_s": loaded.serving.step.compile_s,
        "cached_tokens_mean": round(statistics.fmean(timed.cached), 1),
        "encode_ms_median": round(statistics.median(timed.encode_ms), 2),
    }
    write_report(
        args.out,
        figures,
        machine,
        plot=lambda png: bars(
            png,
            f"median latency per completion, same prompts and settings: speedup {figures['speedup_median']}",
            ["model.generate", "engine"],
            [figures["generate_ms_median"], figures["engine_ms_median"]],
            "ms",
        ),
    )


if __name__ == "__main__":
    main()
