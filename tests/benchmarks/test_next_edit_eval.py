"""``benchmarks.next_edit_eval`` on a repository made here: a commit of two hunks is one case (the first made, the
second next), its window and the window after the next edit are what the language server would have, and the run
writes every outcome's share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.next_edit_eval import OUTCOMES, find_cases
from tests.support.commits import two_commits

REPO = Path(__file__).resolve().parents[2]
BEFORE = 'def area(width, height):\n    """The area."""\n    return width * height\n\n\nprint(area(2, 3))\n'
AFTER = BEFORE.replace("(width,", "(size,").replace("return width", "return size")


def _repository(folder: Path) -> Path:
    return two_commits(folder, "area.py", BEFORE, AFTER)


def test_a_commit_of_two_hunks_is_one_case_whose_next_edit_is_the_second(tmp_path: Path) -> None:
    (case,) = find_cases(_repository(tmp_path / "repo"), commits=10)
    assert case.path == "area.py" and case.made == 1 and len(case.hunks) == 2
    made, history = case.text_after(1)
    assert "".join(made) == BEFORE.replace("(width,", "(size,")  # the rename made, its use not yet
    assert [(hunk.start, hunk.old, hunk.new) for hunk in history] == [
        (0, ("def area(width, height):\n",), ("def area(size, height):\n",))
    ]
    assert "".join(case.text_after(2)[0]) == AFTER


def test_the_figures_give_each_outcomes_share_and_the_window_after_the_next_edit(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    command = [sys.executable, "-m", "benchmarks.next_edit_eval", "--repo", str(_repository(tmp_path / "repo"))]
    done = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["cases_found"] == figures["cases"] == 1 and figures["canvas_tokens"] == 32
    assert set(figures["shares"]) == set(OUTCOMES) and sum(figures["shares"].values()) == 1.0
    (result,) = figures["results"]
    # The shipped model's canvas holds 80 characters of window: the function and the blank lines, not the call.
    assert result["window"] == 'def area(size, height):\n    """The area."""\n    return width * height\n\n\n'
    assert result["expected"] == 'def area(size, height):\n    """The area."""\n    return size * height\n\n\n'
    assert (result["outcome"] == "exact") == (result["suggested"] == result["expected"])
    assert out.with_suffix(".png").is_file()
