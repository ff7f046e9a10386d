"""``benchmarks.repo_context_eval`` on an installed package: the lines it picks use another file's definition,
and the figures it writes say how often the prompt held it, with the index and with the ring buffer alone."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.repo_context_eval import checkout_of, choose_lines
from diffgemma_lsp.repo.index import WorkspaceIndex

REPO = Path(__file__).resolve().parents[2]


def test_the_chosen_lines_use_a_top_level_name_of_another_file() -> None:
    with tempfile.TemporaryDirectory() as work:
        root = checkout_of("pygls", Path(work))
        index = WorkspaceIndex()
        index.build([root])
        chosen = choose_lines(index, root, 20, seed=0)
        assert len(chosen) == 20
        for path, line, column, definition in chosen:
            text = path.read_text(encoding="utf-8").splitlines()[line]
            assert text[column:].startswith(definition.name) and definition.path != str(path)
            assert not text.lstrip().startswith(("import ", "from ", "def ", "class ", "@"))


def test_the_figures_give_the_recall_with_and_without_the_index(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    command = [sys.executable, "-m", "benchmarks.repo_context_eval", "--packages", "pygls", "--lines", "15"]
    done = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["lines"] == 15 and figures["budgets_tokens"]["repoContextTokens"] == 512
    recall = figures["recall"]
    assert set(recall) == {"index", "index_definitions_only", "ring", "ring_same_budget"}
    assert recall["index"] > recall["ring_same_budget"] >= recall["ring"]
    (package,) = figures["packages"]
    assert package["files"] > 10 and package["definitions"] > 100 and package["keystroke_ms_p50"] > 0
    assert out.with_suffix(".png").is_file()
