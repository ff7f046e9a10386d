"""``python -m benchmarks.edit_eval``: the corruptions it chooses break their tasks, and end to end on two small tasks
of the single-line infilling format, its figures for each strength."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.edit_eval import KINDS, candidates, choose_edits, line_tokens, program_names, split_task
from benchmarks.humaneval import FAIL, PASS, run_outcome

REPO = Path(__file__).resolve().parents[2]
TASKS = [
    {
        "task_id": "SingleLineInfilling/Local/0/L0",
        "prompt": "def add(a, b):\n",
        "suffix": "\n",
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
        "entry_point": "add",
    },
    {
        "task_id": "SingleLineInfilling/Local/1/L0",
        "prompt": "def is_small(x):\n",
        "suffix": "\n",
        "canonical_solution": "    return x < 10\n",
        "test": "def check(candidate):\n    assert candidate(3) is True\n    assert candidate(20) is False\n",
        "entry_point": "is_small",
    },
]


def test_each_kind_of_corruption_changes_the_line_as_it_says() -> None:
    prefix, line, suffix = "def f(total, x):\n", "    if total >= x and x:", "\n        return x\n"
    tokens = line_tokens(prefix, line, suffix)
    assert [t.string for t in tokens] == ["if", "total", ">=", "x", "and", "x", ":"]
    names = program_names(prefix, line, suffix)
    assert names == ["f", "total", "x"]
    assert candidates("operator", line, tokens, names) == ["    if total <= x and x:", "    if total >= x or x:"]
    assert "    if x >= x and x:" in candidates("name", line, tokens, names)
    assert "    if f >= x and x:" in candidates("name", line, tokens, names)
    dropped = candidates("drop", line, tokens, names)
    assert (
        "    total >= x and x:" in dropped
        and "    if total >= x and x" in dropped
        and "    if total x and x:" in dropped
    )
    for kind in KINDS:  # never the line itself, never twice the same
        made = candidates(kind, line, tokens, names)
        assert line not in made and len(made) == len(set(made)), kind


def test_the_chosen_corruptions_break_their_tasks_and_take_turns_by_kind() -> None:
    edits, tally = choose_edits(TASKS, None, seed=0, tries=8, timeout=10)
    assert [edit.kind for edit in edits] == ["operator", "name"] and tally.left_out == 0
    for edit, task in zip(edits, TASKS, strict=True):
        assert (edit.prefix, edit.line, edit.suffix) == split_task(task)
        assert edit.corrupted != edit.line
        assert run_outcome(edit.program(edit.line), 10) == PASS
        assert run_outcome(edit.program(edit.corrupted), 10) == FAIL
    assert choose_edits(TASKS, None, seed=0, tries=8, timeout=10)[0] == edits  # the seed fixes them


def test_edit_eval_reports_repairs_for_each_strength_against_the_baseline(tmp_path: Path) -> None:
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    out, plot = tmp_path / "figures.json", tmp_path / "plot.png"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.edit_eval", "--data", str(data), "--n", "0", "--strengths", "0.5"]
        + ["--steps", "4", "--also-raw", "--json", str(out), "--plot", str(plot)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["n_edits"] == 2 and report["floor_pass_at_1"] == 0.0
    assert "postprocess_replacement" in report["postprocessing"] and report["machine"]["reference_ms"] > 0
    assert [run["strength"] for run in report["runs"]] == [0.5, 1.0]  # the from-noise baseline last
    assert report["baseline"] == report["runs"][-1]["pass_at_1"]
    for run in [*report["runs"], report["keep_the_line"]]:
        assert run["n_edits"] == 2 and len(run["samples"]) == 2
        for key in ("pass_at_1", "raw_pass_at_1", "unchanged", "restored", "suppressed", "parses"):
            assert 0 <= run[key] <= 1, key
        assert 1 <= run["steps_per_edit"] <= 4 and run["ms_per_edit"] > 0 and run["engine_ms_per_edit"] > 0
    light, noise = report["runs"]
    assert light["steps_per_edit"] <= 2 and noise["steps_per_edit"] <= 4  # 0.5 runs half of the 4-step schedule
    keep = report["keep_the_line"]
    assert keep["keep"] is True and keep["starts_with_corrupted"] == 1.0  # the held line comes back
    for edit, task in zip(report["edits"], TASKS, strict=True):  # what the JSON says was repaired does break
        program = (
            f"{task['prompt']}{edit['corrupted']}\n{task['suffix']}\n\n{task['test']}\n\ncheck({task['entry_point']})\n"
        )
        assert run_outcome(program, 10) == FAIL, edit
    assert plot.stat().st_size > 0
