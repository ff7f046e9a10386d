"""int8 against bf16 through the engine's own path: weights, process memory, and milliseconds per denoising step.

    python -m benchmarks.quantization [--model DIR] [--requests 6] [--steps 8]

``--model`` defaults to a release-format checkpoint of random weights at ``tests.support.release_format.WIDE``
sizes (most of its weights in the routed experts, as in the release), built once into ``.cache/bench-models/``.
Each method runs in its own process (so memory figures do not mix): ``diffgemma_engine.loading.model.load_model`` with
``--quantization``, then ``--requests`` completions at the model's canvas (256) with ``--steps`` steps each
(random weights never settle, so every step runs). Reports the weights by the quantization check's count (tied
tensors once), the resident and anonymous memory after loading and after the completions, and the median ms per
step. Writes ``benchmarks/results/quantization.json`` and a bar plot.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.machine import machine_report
from benchmarks.plots import grouped_bars
from benchmarks.report import RESULTS, write_report

ROOT = Path(__file__).resolve().parents[1]

METHODS = ("none", "int8")
ONE_METHOD = r"""
import json, statistics, sys
from diffgemma_engine.shared import protocol
from diffgemma_engine.request.infill import run_infill
from diffgemma_engine.loading.model import load_model

def memory():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return {name: int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "RssAnon", "RssFile")}

folder, method, requests, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
loaded = load_model(folder, "cpu", "auto", quantization=method)
after_load = memory()
per_step = []
for index in range(requests + 1):
    request = protocol.Infill(id=str(index), uri="", prefix="def f(x):\n" * 40, max_steps=steps, seed=index)
    _, _, timings = run_infill(loaded, request)
    if index:  # the first one warms up
        per_step.append(timings.denoise_ms / max(timings.steps, 1))
report = loaded.quantized
print(json.dumps({
    "method": method,
    "dtype": str(loaded.model.dtype).removeprefix("torch."),
    "weights_mib": round((report.bytes if report else sum(
        p.numel() * p.element_size() for p in {id(p): p for p in loaded.model.parameters()}.values())) / 2**20, 2),
    "summary": report.summary() if report else "not quantized",
    "after_load_mib": {k: round(v, 1) for k, v in after_load.items()},
    "after_requests_mib": {k: round(v, 1) for k, v in memory().items()},
    "ms_per_step_median": round(statistics.median(per_step), 2),
    "ms_per_step": [round(value, 2) for value in per_step],
    "canvas_length": loaded.canvas_length,
}))
"""


def default_model() -> Path:
    """The release-format ``WIDE`` checkpoint of random weights, built on first use."""
    folder = ROOT / ".cache" / "bench-models" / "release-wide"
    if not (folder / "config.json").is_file():
        from tests.support.release_format import build_release_wide

        build_release_wide(folder)
    return folder


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS / "quantization.json")
    args = parser.parse_args()
    folder = args.model or default_model()
    rows = []
    for method in METHODS:
        done = subprocess.run(
            [sys.executable, "-c", ONE_METHOD, str(folder), method, str(args.requests), str(args.steps)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    plain, int8 = rows
    machine = machine_report()
    result = {
        "model": str(folder),
        "requests": args.requests,
        "steps": args.steps,
        "methods": rows,
        "weights_ratio_int8_vs_bf16": round(int8["weights_mib"] / plain["weights_mib"], 3),
        "anon_after_load_ratio": round(
            int8["after_load_mib"]["RssAnon"] / max(plain["after_load_mib"]["RssAnon"], 1), 3
        ),
        "step_time_ratio_int8_vs_bf16": round(int8["ms_per_step_median"] / plain["ms_per_step_median"], 2),
    }
    write_report(
        args.out,
        result,
        machine,
        plot=lambda png: grouped_bars(
            png,
            "int8 against bf16, release-format checkpoint (CPU)",
            ["weights (MiB)", "resident after load (MiB)", "one step (ms)"],
            {
                row["method"] if row["method"] != "none" else "bf16": [
                    row["weights_mib"],
                    row["after_load_mib"]["VmRSS"],
                    row["ms_per_step_median"],
                ]
                for row in rows
            },
            unit="MiB / ms",
            log=True,
        ),
        unprinted=("methods",),
    )
    for row in rows:
        print(row["method"], row["summary"], row["after_load_mib"], row["ms_per_step_median"], "ms/step")


if __name__ == "__main__":
    main()
