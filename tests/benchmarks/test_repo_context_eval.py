"""``benchmarks.repo_context_eval`` on an installed package: the lines it picks use another file's definition,
and the figures it writes say how often the prompt held it, with the index and with the ring buffer alone."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from benchmarks.cursor_cases import cases_of
from benchmarks.repo_context_eval import checkout_of, choose_lines, evaluate_cursor, source_checkout
from benchmarks.repo_sources import BY_NAME, SourceUnavailable
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
    command = [
        sys.executable,
        "-m",
        "benchmarks.repo_context_eval",
        "--packages",
        "pygls",
        "--lines",
        "15",
        "--sources",
    ]
    done = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["lines"] == 15 and figures["budgets_tokens"]["repoContextTokens"] == 512
    assert figures["cursor_cases"] == []  # none asked for
    recall = figures["recall"]
    assert set(recall) == {"index", "index_definitions_only", "ring", "ring_same_budget"}
    assert recall["index"] > recall["ring_same_budget"] >= recall["ring"]
    (package,) = figures["packages"]
    assert package["files"] > 10 and package["definitions"] > 100 and package["keystroke_ms_p50"] > 0
    assert out.with_suffix(".png").is_file()


@pytest.mark.parametrize("name", ["requests", "rxjs", "golang-github-hashicorp-hcl-dev"])
def test_cursor_cases_of_a_fetched_package_end_at_an_imported_name_its_context_holds(name: str, tmp_path: Path) -> None:
    source = BY_NAME[name]
    try:
        root, go_module = source_checkout(source, tmp_path)
    except SourceUnavailable as exc:
        pytest.skip(f"the pinned package could not be fetched (benchmarks/repo_sources.py): {exc}")
    index = WorkspaceIndex()
    index.build([root])
    cases = cases_of(root, index, go_module)
    assert len(cases) > 30
    for case in cases[:: max(len(cases) // 20, 1)]:
        line = case.path.read_text(encoding="utf-8").splitlines()[case.line]
        after_name = line[case.column : case.column + 1]  # the name may be an alias of the definition's
        assert line[case.column - 1].isidentifier() and not after_name.isidentifier() and not after_name.isdigit()
        assert case.defined_in != case.path
    figures = evaluate_cursor(source, 12, seed=0)
    assert figures["cases"] == 12 and figures["held"] >= 0.8, figures["misses"]
    assert figures["keystroke_ms_p50"] > 0 and figures["keystroke_ms_p95"] >= figures["keystroke_ms_p50"]
