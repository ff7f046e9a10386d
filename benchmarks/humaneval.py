"""The HumanEval-infilling harness: its task files, the program a filled-in gap makes, and running its tests.

A task (one line of the ``.jsonl[.gz]``) holds ``prompt`` (the code before the gap), ``suffix`` (after it),
``canonical_solution`` (the gap's text), ``test`` (a ``check(candidate)`` function) and ``entry_point``. A
completion passes when ``prompt + completion + suffix`` followed by the tests exits 0 in a subprocess within
the timeout. Data: ../shared/data/humaneval-infilling. Never train on it.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "humaneval-infilling"
"""The two splits' files, beside the repository."""
SPLITS = {"single-line": "SingleLineInfilling.jsonl.gz", "multi-line": "MultiLineInfilling.jsonl.gz"}


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


def floor_middle(task: dict) -> str:
    """The do-nothing fill: ``pass`` at the indentation of the canonical solution's first line."""
    first = task["canonical_solution"].split("\n", 1)[0]
    return " " * (len(first) - len(first.lstrip())) + "pass\n"
