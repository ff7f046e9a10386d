"""``benchmarks.report`` and ``benchmarks.humaneval``: the shared tail of the benchmark scripts and the harness's
pure parts (no model, no engine)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.humaneval import floor_middle, mid_line_task, pick, program_for, run_tests
from benchmarks.report import add_step_argument, write_report
from diffgemma_engine.__main__ import build_parser, step_mode_of
from diffgemma_engine.shared.serve_options import STEP_MODES

REPO = Path(__file__).resolve().parents[2]


def test_write_report_writes_the_figures_with_the_machine_prints_them_and_plots_beside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "deeper" / "figures.json"
    plotted: list[Path] = []
    figures: dict[str, object] = {"p50_ms": 1.5, "samples_ms": [1.0, 2.0]}
    write_report(out, figures, {"reference_ms": 2.0}, plot=plotted.append, unprinted=("samples_ms",))
    assert json.loads(out.read_text()) == {"p50_ms": 1.5, "samples_ms": [1.0, 2.0], "machine": {"reference_ms": 2.0}}
    assert json.loads(capsys.readouterr().out) == {"p50_ms": 1.5, "machine": {"reference_ms": 2.0}}
    assert plotted == [out.with_suffix(".png")]


def test_the_step_argument_takes_the_engines_choices_and_defaults_eager() -> None:
    """Issue 44: the benchmarks that drive the engine pass its ``serve --step`` (the retired ``--compile`` is gone
    from both): each choice a benchmark takes is one the engine's own parser reads back."""
    parser = argparse.ArgumentParser()
    add_step_argument(parser)
    assert parser.parse_args([]).step == "eager"
    engine = build_parser()
    for choice in STEP_MODES:
        step = parser.parse_args(["--step", choice]).step
        assert step_mode_of(engine.parse_args(["serve", "--step", step]), engine) == choice
    for refused in (["--compile", "on"], ["--step", "maybe"]):
        with pytest.raises(SystemExit):
            parser.parse_args(refused)
        with pytest.raises(SystemExit):
            step_mode_of(engine.parse_args(["serve", *refused]), engine)


def test_the_harness_fills_the_gap_and_runs_the_tests() -> None:
    task = {
        "prompt": "def add(a, b):\n",
        "suffix": "\n",
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
        "entry_point": "add",
    }
    assert floor_middle(task) == "    pass\n"
    assert run_tests(program_for(task, task["canonical_solution"]), timeout=30)
    assert not run_tests(program_for(task, floor_middle(task)), timeout=30)
    assert pick(list(range(10)), 3, None) == [0, 3, 6] and pick(list(range(10)), 3, 2) == [0, 1]


def test_the_mid_line_split_puts_the_cursor_inside_the_removed_line() -> None:
    """On single-line tasks made from this repository's own lines (the HumanEval files live outside it)."""
    lines = [line for path in sorted(REPO.glob("engine/**/*.py")) for line in path.read_text().splitlines(True)]
    lines = [line for line in lines if line.strip()][:400]
    tasks = [
        {
            "task_id": f"Local/{index}",
            "prompt": "".join(lines[max(0, index - 3) : index]),
            "suffix": "\n",
            "canonical_solution": line,
        }
        for index, line in enumerate(lines)
    ]
    derived = [mid_line_task(task) for task in tasks]
    kept = [(task, mid) for task, mid in zip(tasks, derived, strict=True) if mid is not None]
    assert len(kept) > 0.9 * len(tasks)
    inside_words = 0
    for task, mid in kept:
        line = task["canonical_solution"]
        typed = mid["prompt"][len(task["prompt"]) :]
        assert mid["prompt"].startswith(task["prompt"]) and typed + mid["canonical_solution"] == line
        assert typed.strip() and mid["canonical_solution"].strip()  # code on both sides of the cursor
        assert mid["suffix"] == task["suffix"] and floor_middle(mid) == ""
        inside_words += typed[-1].isalnum() and mid["canonical_solution"][0].isalnum()
    assert inside_words > len(kept) // 4  # a random character: inside a word often
    again = [mid_line_task(task) for task in reversed(tasks)][::-1]
    assert again == derived  # drawn from the task alone: the same split for any subset, in any order
