"""Next edits replayed from real edit sequences: the first hunks of a commit applied, the model asked for the next.

    python -m benchmarks.next_edit_eval [--repo PATH] [--n 40] [--commits 400] [--seed 0] [--model DIR]
                                        [--device cpu] [--json PATH] [--plot PATH]

Next edits that jump, over the commits whose change spans several places: ``python -m benchmarks.next_edit_chains``
with the same options (``benchmarks/next_edit_chains.py``).

The edit sequences are the commits of a git repository (default: this checkout): each Python file a commit changes
in two hunks or more (line hunks, as ``difflib`` finds them between the file before and after) gives cases. In a
case the user has made the first ``k`` hunks (``k`` from 1 to the last but one), in order, and the cursor is at the
end of the last one; what they do next is hunk ``k + 1``. Up to ``--n`` cases, spread over the commits (seeded).

Each case is the request the language server sends for ``diffgemma/nextEdit`` there, built by its own code
(``diffgemma_lsp.features.next_edit.next_edit_request``: the window of ``nextEditLines`` each way fitted to the model's
canvas, ``nextEditStrength`` renoised, the made hunks in the prompt as the edit history renders them), served
in-process by the engine's ``run_infill`` and post-processed as the server does (``suggested_window``). Outcomes:

- ``exact``: the next hunk lies in the window and the suggestion is the window after it, exactly;
- ``wrong``: it lies in the window and the suggestion is another edit;
- ``missed``: it lies in the window and the model left the window as it was ("no edit");
- ``false_positive``: it lies outside the window and the model suggested an edit anyway;
- ``quiet``: it lies outside the window and the model suggested nothing (right: nothing to do there);
- ``refused``: the engine refused the request (the window did not fit its canvas).

Reported: the share of each, the share of suggestions that were false positives, "no edit" over all cases, ms and
steps per suggestion (p50, p95). The shipped model was trained to fill in code, not to edit it: its figures say what
the pipeline does with such a model, not what next edits can be. The release with its weights:
``python -m benchmarks.next_edit_eval --model PATH/diffusiongemma-26B-A4B-it --device cuda``.
"""

from __future__ import annotations

import argparse
import difflib
import random
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import attrs
import torch

from benchmarks.keystroke_replay import percentile
from benchmarks.machine import machine_report
from benchmarks.report import RESULTS, add_commit_walk_arguments, write_report
from diffgemma_engine.errors import EngineError
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.batch import Row, run_batch
from diffgemma_engine.request.infill import Answer, run_infill
from diffgemma_engine.runtimes.seam import distinct_alternatives
from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.prompt import EDITS_CHUNK_NAME
from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.edit_history import Hunk, render
from diffgemma_lsp.extra_context import file_name
from diffgemma_lsp.features.next_edit import next_edit_request, suggested_window
from diffgemma_lsp.features.selection import Selection
from diffgemma_lsp.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 1500
OUTCOMES = ("exact", "wrong", "missed", "false_positive", "quiet", "refused")


@attrs.frozen
class Case:
    """The user has made ``made`` of a commit's hunks to ``path``; ``next`` is what they do after."""

    commit: str
    path: str
    before: tuple[str, ...]
    """The file's lines before the commit."""
    hunks: tuple[tuple[int, int, tuple[str, ...]], ...]
    """The commit's hunks, in order: lines ``i1`` to ``i2`` of ``before`` replaced by the new lines."""
    made: int

    def text_after(self, count: int) -> tuple[list[str], list[Hunk]]:
        """The file's lines after the first ``count`` hunks, and those hunks as the edit history keeps them (each at
        its place in the document as it was then)."""
        lines, shift, history = list(self.before), 0, []
        for i1, i2, new in self.hunks[:count]:
            start = i1 + shift
            history.append(Hunk(uri=self.uri, start=start, old=tuple(lines[start : i2 + shift]), new=new, closed_at=0))
            lines[start : i2 + shift] = new
            shift += len(new) - (i2 - i1)
        return lines, history

    @property
    def uri(self) -> str:
        return f"file:///repo/{self.path}"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def changed_python_files(repo: Path, commits: int) -> Iterator[tuple[str, str, list[str], list[str]]]:
    """(commit, path, lines before, lines after) of each Python file the last ``commits`` commits (merges left out)
    modify, files of more than ``MAX_FILE_LINES`` lines before it left out."""
    for commit in git(repo, "log", "--no-merges", f"-n{commits}", "--format=%H").split():
        for path in git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", "--diff-filter=M", commit).split():
            if not path.endswith(".py"):
                continue
            before = git(repo, "show", f"{commit}^:{path}").splitlines(keepends=True)
            after = git(repo, "show", f"{commit}:{path}").splitlines(keepends=True)
            if len(before) <= MAX_FILE_LINES:
                yield commit, path, before, after


def find_cases(repo: Path, commits: int) -> list[Case]:
    """Every case of the last ``commits`` commits (merges left out) that touch Python files in two hunks or more."""
    cases = []
    for commit, path, before, after in changed_python_files(repo, commits):
        matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
        hunks = tuple((i1, i2, tuple(after[j1:j2])) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")
        for made in range(1, len(hunks)):
            cases.append(Case(commit=commit[:12], path=path, before=tuple(before), hunks=hunks, made=made))
    return cases


@attrs.frozen
class Asked:
    """A case's request for the next edit, as the language server builds it, and what a right answer would be."""

    window: Selection
    request: protocol.Infill
    expected: str | None
    """The window after the next hunk; None when that hunk lies outside the window."""

    @property
    def lines(self) -> int:
        return len(self.window.text.splitlines())


def ask(case: Case, settings: Settings, canvas_length: int, number: int) -> Asked:
    """The request the language server sends for ``diffgemma/nextEdit`` at the end of ``case``'s last hunk made."""
    lines, history = case.text_after(case.made)
    document = LineDocument(case.uri, "".join(lines), version=1)
    cursor = max(0, history[-1].start + len(history[-1].new) - 1)
    extra = [protocol.Chunk(filename=EDITS_CHUNK_NAME, text=render(history, file_name))]
    asked = next_edit_request(document, cursor, settings, canvas_length, extra, f"case-{number}")
    assert asked is not None, case
    window, request = asked
    start, end = window.range.start.line, window.range.start.line + len(window.text.splitlines())
    expected_lines, _ = case.text_after(case.made + 1)
    i1, i2, new = case.hunks[case.made]
    first = i1 + len(lines) - len(case.before)  # the next hunk's place now: the hunks made moved it
    inside = start <= first and first + (i2 - i1) <= end
    expected = "".join(expected_lines[start : end + len(new) - (i2 - i1)]) if inside else None
    return Asked(window=window, request=request, expected=expected)


def judge(case: Case, settings: Settings, loaded: LoadedModel, number: int) -> dict[str, object]:
    """Ask for the next edit in ``case`` as the language server would, and name the outcome."""
    asked = ask(case, settings, loaded.canvas_length, number)
    window, request, expected = asked.window, asked.request, asked.expected
    inside = expected is not None
    began = time.perf_counter()
    try:
        answers = draws(loaded, request, number)
    except EngineError as exc:
        return {"outcome": "refused", "reason": str(exc), "commit": case.commit, "path": case.path}
    elapsed_ms = (time.perf_counter() - began) * 1000
    stop, timings = answers[0].stop, answers[0].timings
    suggestion = suggestion_of(loaded, window, answers)
    if inside:
        outcome = "missed" if suggestion is None else "exact" if suggestion == expected else "wrong"
    else:
        outcome = "quiet" if suggestion is None else "false_positive"
    return {
        "outcome": outcome,
        "commit": case.commit,
        "path": case.path,
        "window_lines": asked.lines,
        "ms": round(elapsed_ms, 1),
        "steps": timings.steps,
        "stop": stop.value,
        "window": window.text,
        "expected": expected,
        "suggested": suggestion,
    }


def draws(loaded: LoadedModel, request: protocol.Infill, number: int) -> list[Answer]:
    """The engine's answer to ``request`` as it serves it: one canvas (seeded with ``number``), or its
    ``candidates`` in one batch (the batch draws from torch's generator, seeded with ``number`` here)."""
    if request.candidates == 1:
        return [run_infill(loaded, attrs.evolve(request, seed=number))]
    torch.manual_seed(number)
    row = Row(request=request, cache_key=("case", number), should_stop=lambda: None)
    return run_batch(loaded, [row] * request.candidates)


def suggestion_of(loaded: LoadedModel, window: Selection, answers: list[Answer]) -> str | None:
    """What the language server makes of the engine's draws: the first answer and the other distinct ones, as the
    wire carries them, through ``suggested_window``."""
    texts = [answers[0].text, *(other.text for other in distinct_alternatives(answers))]
    return suggested_window(window, texts, instruct=loaded.layout.name is protocol.Layout.CHAT)


def summarize(results: list[dict[str, object]]) -> dict[str, object]:
    counts = Counter(str(result["outcome"]) for result in results)
    total = max(len(results), 1)
    suggested = counts["exact"] + counts["wrong"] + counts["false_positive"]
    answered = [result for result in results if result["outcome"] != "refused"]
    ms = [float(result["ms"]) for result in answered]  # type: ignore[arg-type]
    steps = [int(result["steps"]) for result in answered]  # type: ignore[call-overload]

    return {
        "cases": len(results),
        "shares": {outcome: round(counts[outcome] / total, 3) for outcome in OUTCOMES},
        "false_positives_of_suggestions": round(counts["false_positive"] / suggested, 3) if suggested else 0.0,
        "no_edit": round((counts["missed"] + counts["quiet"]) / total, 3),
        "ms_p50": round(percentile(ms, 0.5), 1) if ms else 0.0,
        "ms_p95": round(percentile(ms, 0.95), 1) if ms else 0.0,
        "steps_mean": round(statistics.fmean(steps), 2) if steps else 0.0,
    }


def options(description: str) -> argparse.ArgumentParser:
    """The command line of this benchmark (and of ``next_edit_chains``, which replays the same commits)."""
    parser = argparse.ArgumentParser(description=description)
    add_commit_walk_arguments(parser, ROOT, commits=400)
    parser.add_argument("--n", type=int, default=40, help="cases")
    parser.add_argument("--draws", type=int, default=Settings().next_edit_draws, help="nextEditDraws (1: eager)")
    parser.add_argument("--json", type=Path, default=RESULTS / "next_edit_eval.json")
    parser.add_argument("--plot", type=Path, default=None, help="default: the --json path with .png")
    return parser


def main() -> None:
    args = options(__doc__.split("\n\n", 1)[0]).parse_args()
    machine = machine_report()
    cases = find_cases(args.repo, args.commits)
    chosen = random.Random(args.seed).sample(cases, min(args.n, len(cases)))
    loaded = load_model(args.model, args.device, "float32" if args.device == "cpu" else None)
    settings = Settings(next_edit_draws=args.draws)
    results = [judge(case, settings, loaded, number) for number, case in enumerate(chosen)]
    figures: dict[str, object] = {
        "model": str(args.model),
        "repo": str(args.repo),
        "repo_head": git(args.repo, "rev-parse", "--short", "HEAD").strip(),
        "cases_found": len(cases),
        "settings": {
            "nextEditLines": settings.next_edit_lines,
            "nextEditStrength": settings.next_edit_strength,
            "nextEditDraws": settings.next_edit_draws,
        },
        "canvas_tokens": loaded.canvas_length,
        "seed": args.seed,
        **summarize(results),
        "results": results,
    }

    def plot(path: Path) -> None:
        from benchmarks.plots import bars

        shares = figures["shares"]
        assert isinstance(shares, dict)
        bars(
            args.plot or path,
            "Next edits replayed from commits: outcomes",
            list(OUTCOMES),
            [100 * shares[o] for o in OUTCOMES],
            "%",
        )

    write_report(args.json, figures, machine, plot, unprinted=("results",))


if __name__ == "__main__":
    main()
