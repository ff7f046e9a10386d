"""``python -m benchmarks.gpu_shape``: its bandwidth floor at the release's shape, and its loops on a CPU (the
script a lent GPU runs, dry-run here with a small shape)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.gpu_shape import RELEASE, build, bytes_per_step

REPO = Path(__file__).resolve().parents[2]


def test_a_release_step_reads_its_weights_once() -> None:
    """The floor the issue quotes: about 52 GB of bf16 a step at canvas 256 (every expert is routed to), fewer
    experts at canvas 32 (1 - (1 - 8/128)^32 of them)."""
    model = build(RELEASE, torch.device("meta"), torch.bfloat16)
    at_256, at_32 = bytes_per_step(model, 256) / 1e9, bytes_per_step(model, 32) / 1e9
    assert 50 < at_256 < 54, at_256
    assert 0.85 * at_256 < at_32 < 0.92 * at_256, (at_32, at_256)
    assert 10 < at_256 / 4.8 < 11.3  # ms on an H200's 4.8 TB/s


def test_the_loops_run_and_write_their_rows(tmp_path: Path) -> None:
    out = tmp_path / "gpu_shape.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_shape", "--shape", "small", "--canvases", "16", "--steps", "2,3"]
        + ["--prompt", "40", "--loops", "eager", "static", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(row["loop"], row["steps"]) for row in rows] == [
        ("eager", 2),
        ("eager", 2),
        ("eager", 3),
        ("eager", 3),
        ("static", 2),
        ("static", 3),
    ]
    assert all(row["ms_per_step"] > 0 and row["canvas"] == 16 for row in rows)
