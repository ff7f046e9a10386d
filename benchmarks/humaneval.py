"""The HumanEval-infilling harness: its task files, the program a filled-in gap makes, and running its tests.

A task (one line of the ``.jsonl[.gz]``) holds ``prompt`` (the code before the gap), ``suffix`` (after it),
``canonical_solution`` (the gap's text), ``test`` (a ``check(candidate)`` function) and ``entry_point``. A
completion passes when ``prompt + completion + suffix`` followed by the tests exits 0 in a subprocess within
the timeout. Data: ../shared/data/humaneval-infilling. Never train on it.
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "humaneval-infilling"
"""The two splits' files, beside the repository."""
SPLITS = {"single-line": "SingleLineInfilling.jsonl.gz", "multi-line": "MultiLineInfilling.jsonl.gz"}
MID_LINE = "mid-line"
"""The split derived from the single-line tasks with the cursor inside the removed line (``mid_line_task``)."""


def load_tasks(path: Path) -> list[dict]:
    """Every task in a ``.jsonl`` or ``.jsonl.gz`` file, in order."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def pick(tasks: list[dict], n: int | None, limit: int | None) -> list[dict]:
    """The first ``limit`` tasks, or else ``n`` tasks spread evenly over the file (deterministic), or all."""
    if limit:
        return tasks[:limit]
    if not n or n >= len(tasks):
        return tasks
    return [tasks[i * len(tasks) // n] for i in range(n)]


PASS, FAIL, TIMEOUT = "pass", "fail", "timeout"
"""``run_outcome``'s answers."""


def run_outcome(program: str, timeout: float) -> str:
    """``PASS`` if ``program`` exits 0 in a fresh interpreter within ``timeout`` seconds (in a scratch folder),
    ``TIMEOUT`` if it is still running then, else ``FAIL``."""
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "task.py"
        file.write_text(program)
        try:
            done = subprocess.run([sys.executable, str(file)], cwd=tmp, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return TIMEOUT
        return PASS if done.returncode == 0 else FAIL


def run_tests(program: str, timeout: float) -> bool:
    """Whether ``program`` exits 0 in a fresh interpreter within ``timeout`` seconds (in a scratch folder)."""
    return run_outcome(program, timeout) == PASS


def compiles(program: str) -> bool:
    """Whether the filled-in program is valid Python (whatever its tests say): does the completion read as code."""
    with warnings.catch_warnings():  # a completion's odd literals warn: not this script's output
        warnings.simplefilter("ignore")
        try:
            compile(program, "<task>", "exec")
        except (SyntaxError, ValueError):
            return False
    return True


def program_for(task: dict, middle: str, suffix: str | None = None) -> str:
    """The task's code with ``middle`` in the gap (before ``suffix``, the task's own by default), then its tests."""
    suffix = task["suffix"] if suffix is None else suffix
    return f"{task['prompt']}{middle}{suffix}\n\n{task['test']}\n\ncheck({task['entry_point']})\n"


def mid_line_task(task: dict) -> dict | None:
    """A single-line task with the cursor at a random character inside the removed line, after its first
    character of code and before its last (inside a word as often as typing puts it there): the prompt gains the
    line up to the cursor, the gap is the rest of the line. The character is drawn from the task's id, so the
    split is the same on every machine and for every subset. None for a line with under two characters of code.

    Its do-nothing fill (``floor_middle``) is the empty one: the line left as typed up to the cursor.
    """
    line = task["canonical_solution"]
    code = line.rstrip("\n")
    indent = len(code) - len(code.lstrip())
    if len(code) - indent < 2:
        return None
    cursor = random.Random(task["task_id"]).randint(indent + 1, len(code) - 1)
    return {
        **task,
        "task_id": f"{task['task_id']}/mid",
        "prompt": task["prompt"] + line[:cursor],
        "canonical_solution": line[cursor:],
        "floor": "",
    }


def floor_middle(task: dict) -> str:
    """The do-nothing fill: the task's own ``floor`` if it has one (a mid-line task's: nothing), else ``pass`` at
    the indentation of the canonical solution's first line."""
    if "floor" in task:
        return task["floor"]
    first = task["canonical_solution"].split("\n", 1)[0]
    return " " * (len(first) - len(first.lstrip())) + "pass\n"
