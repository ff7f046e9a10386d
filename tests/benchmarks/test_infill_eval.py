"""``python -m benchmarks.infill_eval`` end to end on two small tasks of the HumanEval-infilling format, both
backends."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.humaneval import SPLITS

REPO = Path(__file__).resolve().parents[2]
TASKS = [
    {  # the do-nothing fill (``pass``) fails this one's test
        "task_id": "Local/0",
        "prompt": "def add(a, b):\n",
        "suffix": "\n",
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
        "entry_point": "add",
    },
    {  # and passes this one's, whose test never calls the function
        "task_id": "Local/1",
        "prompt": "def noop(x):\n",
        "suffix": "\n",
        "canonical_solution": "    return None\n",
        "test": "def check(candidate):\n    assert callable(candidate)\n",
        "entry_point": "noop",
    },
]


@pytest.mark.parametrize("backend", ["engine", "generate"])
def test_infill_eval_reports_its_figures_and_the_floor(tmp_path: Path, backend: str) -> None:
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.infill_eval", "--data", str(data), "--backend", backend]
        + ["--steps", "4", "--samples", "2", "--also-raw", "--json", str(out), "--plot", str(tmp_path / "plot.png")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["backend"] == backend
    assert report["steps"] == 4 and report["n_tasks"] == 2
    split = report["splits"]["tasks.jsonl"]
    assert split["floor_pass_at_1"] == 0.5  # the harness ran both tests: one fails with ``pass``, one passes
    assert split["samples_per_task"] == 2 and len(split["pass_at_1_per_sample"]) == 2
    assert split["pass_at_1"] == sum(split["pass_at_1_per_sample"]) / 2
    for key in ("pass_at_1", "raw_pass_at_1", "exact_match", "parses", "suppressed"):
        assert 0 <= split[key] <= 1, key
    assert split["latency_ms_median"] > 0 and split["tokens_per_forward"] >= 0
    assert split["completions_by_canvas"] == {"32": 4}  # cursors at a line start: the model's canvas
    assert len(split["samples"]) == 4 and {s["task_id"] for s in split["samples"]} == {"Local/0", "Local/1"}


def test_the_default_splits_put_the_cursor_at_a_line_start_and_inside_the_line(tmp_path: Path) -> None:
    """Single-line and mid-line by default: the same first tasks, the mid-line ones on the engine's line canvas."""
    out = tmp_path / "figures.json"
    with gzip.open(tmp_path / SPLITS["single-line"], "wt") as data:  # the split's file, in its format
        data.write("".join(json.dumps(task) + "\n" for task in TASKS * 2))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.infill_eval", "--limit", "3", "--steps", "2", "--json", str(out)]
        + ["--plot", str(tmp_path / "plot.png"), "--data-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    splits = json.loads(out.read_text())["splits"]
    assert list(splits) == ["single-line", "mid-line"]
    assert splits["single-line"]["completions_by_canvas"] == {"32": 3}
    assert splits["mid-line"]["n_tasks"] == 3 and splits["mid-line"]["completions_by_canvas"].get("16", 0) >= 2
    single = [s["task_id"] for s in splits["single-line"]["samples"]]
    assert [s["task_id"] for s in splits["mid-line"]["samples"]] == [f"{task_id}/mid" for task_id in single]
