"""The released DiffusionGemma-26B-A4B's shape, random weights, served by the engine's own load path in bf16 and
fp8 on one GPU: peak memory and milliseconds per denoising step (issue 18, item 7). Ready for the next lent GPU.

    python -m benchmarks.release_on_gpu --out-dir $OUT                        # one H200
    python -m benchmarks.release_on_gpu --shape wide --device cpu --methods none,int8 --out-dir /tmp/o  # dry run

The model is built on the meta device from the release's ``config.json`` (``tests/data/release``), tied, moved
with ``to_empty`` onto the GPU (tied: never the untied construction, twice the size), tied again and initialised
there (random weights; the rotary tables recomputed), then saved as a checkpoint with the release-format test
tokenizer (``tests/support/release_format.py``): what ``diffgemma-engine serve --model`` reads. Each method then
runs in its own process through ``diffgemma_engine.loading.model.load_model(..., quantization=...)`` and
``diffgemma_engine.request.infill.run_infill`` at the model's canvas (256) with 16 and 48 steps (random weights never
settle: every step runs). Reports the load time, memory after loading, peak memory, and the median ms per step;
writes ``release_on_gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.report import RESULTS, write_json

ROOT = Path(__file__).resolve().parents[1]

STEPS = (16, 48)
ONE_METHOD = r"""
import json, statistics, sys, time
import torch
from diffgemma_engine.shared import protocol
from diffgemma_engine.request.infill import run_infill
from diffgemma_engine.loading.model import load_model

folder, device, method, requests = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
steps_list = [int(s) for s in sys.argv[5].split(",")]
cuda = device.startswith("cuda")

def allocated():
    return torch.cuda.memory_allocated() / 2**30 if cuda else None

started = time.perf_counter()
loaded = load_model(folder, device, "auto", quantization=None if method == "none" else method)
load_s = time.perf_counter() - started
after_load = allocated()
if cuda:
    torch.cuda.reset_peak_memory_stats()
prompt = "def f(x):\n    return x\n" * 60
result = {"method": method, "device": device, "load_s": round(load_s, 1), "after_load_gib": after_load,
          "quantized": loaded.quantized.summary() if loaded.quantized else None, "steps": {}}
for steps in steps_list:
    per_step = []
    for index in range(requests + 1):
        text = prompt + f"# {index}\n"
        request = protocol.Infill(id=str(index), uri="bench", prefix=text, max_steps=steps, seed=index)
        _, _, timings = run_infill(loaded, request, cache_key=("bench", index))
        if index:  # the first one warms up
            per_step.append(timings.denoise_ms / max(timings.steps, 1))
    result["steps"][str(steps)] = {"ms_per_step_median": round(statistics.median(per_step), 2),
                                   "ms_per_step": [round(v, 2) for v in per_step], "canvas": loaded.canvas_length}
result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
print(json.dumps(result))
"""


def build_checkpoint(folder: Path, shape: str, device: str) -> dict[str, object]:
    """The release's shape (or ``wide``, for a CPU dry run) with random weights, built on ``device`` from the meta
    device and saved in the release's format."""
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    from tests.support import release_format

    tokenizer = release_format.build_tokenizer()
    if shape == "release":
        config = DiffusionGemmaConfig.from_dict(json.loads((release_format.RELEASE / "config.json").read_text()))
    else:
        ids = {
            name: tokenizer.convert_tokens_to_ids(token)
            for name, token in (
                ("boi_token_id", "<|image>"),
                ("image_token_id", "<|image|>"),
                ("eoi_token_id", "<image|>"),
            )
        }
        config = release_format.build_config(len(tokenizer), ids, release_format.WIDE)
    started = time.perf_counter()
    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(config)
    model.tie_weights()
    model.to_empty(device=device)  # one tensor per Parameter object: the tie survives only as shared objects...
    model.tie_weights()  # ...so tie again, then fill every tensor (the rotary tables too) where it lives
    model.init_weights()
    model.to(torch.bfloat16)
    encoder = model.model.encoder.language_model.layers[0].experts.gate_up_proj
    decoder = model.model.decoder.layers[0].experts.gate_up_proj
    assert encoder is decoder, "the encoder and the decoder must share their weights"
    built_s = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    started = time.perf_counter()
    release_format.save_release_format(model, tokenizer, folder, shard_size="5GB")
    return {"build_s": round(built_s, 1), "build_peak_gib": peak, "save_s": round(time.perf_counter() - started, 1)}


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=("release", "wide"), default="release")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--methods", default="none,fp8", help="comma-separated: none, int8, fp8")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--steps", default=",".join(map(str, STEPS)))
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/diffgemma-release-random"))
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    report: dict[str, object] = {"shape": args.shape, "device": args.device}
    if not (args.checkpoint / "config.json").is_file():
        report["build"] = build_checkpoint(args.checkpoint, args.shape, args.device)
        print(json.dumps(report["build"]), flush=True)
    runs = []
    for method in args.methods.split(","):
        command = [sys.executable, "-c", ONE_METHOD, str(args.checkpoint), args.device, method]
        done = subprocess.run([*command, str(args.requests), args.steps], capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            runs.append({"method": method, "error": done.stderr.strip().splitlines()[-5:]})
        else:
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    report["runs"] = runs
    write_json(args.out_dir / "release_on_gpu.json", report)


if __name__ == "__main__":
    main()
