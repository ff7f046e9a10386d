"""Next edits that jump, replayed from real commits (issue 45, part 3).

    python -m benchmarks.next_edit_chains [next_edit_eval's options; --json default: results/next_edit_chains.json]

A chain case is a Python file a commit changes in two hunks or more whose first hunk renames a name
(``diffgemma_lsp.jumps.renamed``): the user has made that hunk, and the commit's other hunks are the later places.
The language server's own code finds the places (``places``: the other uses of the old name) and asks for them as it
does, in one request (``chain_request``) that the engine denoises in one batch (``run_windows``). Reported:

- ``found``: the share of the later hunks (each at most a few lines) that a place found lies in;
- ``exact``: the share of them whose place's suggestion is the window after that hunk, exactly;
- the wait for the 2nd to k-th edit of a chain: batched, they were computed with the first (the first Tab waits for
  the batch, ``batch_ms``), against one after another (each Tab asks its own request: ``single_ms`` each).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import attrs
import torch

from benchmarks.keystroke_replay import percentile
from benchmarks.machine import machine_report
from benchmarks.next_edit_eval import Case, draws, find_cases, git, options, suggestion_of
from benchmarks.report import RESULTS, write_report
from diffgemma_engine.errors import EngineError
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.batch import Row
from diffgemma_engine.request.windows import each_window, run_windows
from diffgemma_engine.shared import protocol
from diffgemma_engine.shared.prompt import EDITS_CHUNK_NAME
from diffgemma_lsp.document import LineDocument
from diffgemma_lsp.edit_history import render
from diffgemma_lsp.extra_context import file_name
from diffgemma_lsp.features.next_edit import next_edit_request
from diffgemma_lsp.features.selection import Selection
from diffgemma_lsp.jumps import CHAIN_WINDOW_LINES, chain_request, chain_settings, places, renamed
from diffgemma_lsp.settings import Settings

MAX_HUNK_LINES = 3
"""A later hunk longer than this is not a place's edit (a place's window is its line)."""


def chain_cases(cases: list[Case]) -> list[Case]:
    """The cases whose user has made the first hunk only, and that hunk renamed a name."""
    return [case for case in cases if case.made == 1 and renamed(_old_lines(case, 0), case.hunks[0][2]) is not None]


def _old_lines(case: Case, index: int) -> tuple[str, ...]:
    i1, i2, _ = case.hunks[index]
    return case.before[i1:i2]


def _rename(case: Case) -> tuple[str, str]:
    found = renamed(_old_lines(case, 0), case.hunks[0][2])
    assert found is not None
    return found.old, found.new


@attrs.frozen
class Later:
    """A later hunk of a chain case, in the document after the first: its lines and the text of its window after."""

    first: int
    count: int
    after: str


def later_hunks(case: Case, lines: list[str]) -> list[Later]:
    """The commit's hunks after the first, each of at most ``MAX_HUNK_LINES`` old lines and as many new ones, at
    their place in the document after the first hunk (it moved them by its change of line count)."""
    shift = len(lines) - len(case.before)
    later = []
    for i1, i2, new in case.hunks[1:]:
        if 0 < i2 - i1 <= MAX_HUNK_LINES and len(new) == i2 - i1:
            later.append(Later(first=i1 + shift, count=i2 - i1, after="".join(new)))
    return later


def judge_chain(case: Case, settings: Settings, loaded: LoadedModel, number: int) -> dict[str, object] | None:
    """One chain case: the places found, each place's suggestion batched and alone, and the waits."""
    lines, history = case.text_after(1)
    old, _ = _rename(case)
    first_hunk = history[0]
    found = places(lines, old, range(first_hunk.start, first_hunk.start + len(first_hunk.new)))
    later = later_hunks(case, lines)
    if not found or not later:
        return None
    document = LineDocument(case.uri, "".join(lines), version=1)
    extra = [protocol.Chunk(filename=EDITS_CHUNK_NAME, text=render(history, file_name))]
    narrow = chain_settings(settings)
    asked = [
        next_edit_request(document, line, narrow, loaded.canvas_length, extra, f"chain-{number}") for line in found
    ]
    pairs = [pair for pair in asked if pair is not None]
    windows = [window for window, _ in pairs]
    request = chain_request([request for _, request in pairs])
    torch.manual_seed(number)
    began = time.perf_counter()
    try:
        batched = run_windows(
            loaded, request, lambda window: Row(request=window, cache_key=("chain", number), should_stop=lambda: None)
        )
    except EngineError as exc:
        return {"commit": case.commit, "path": case.path, "refused": str(exc)}
    batch_ms = (time.perf_counter() - began) * 1000
    single_ms = []
    for window_request in each_window(request):
        began = time.perf_counter()
        draws(loaded, window_request, number)
        single_ms.append((time.perf_counter() - began) * 1000)
    suggestions = [suggestion_of(loaded, window, answers) for window, answers in zip(windows, batched, strict=True)]
    hit = [_place_of(windows, item) for item in later]
    exact = [index is not None and suggestions[index] == item.after for index, item in zip(hit, later, strict=True)]
    return {
        "commit": case.commit,
        "path": case.path,
        "renamed": old,
        "places": len(windows),
        "later": len(later),
        "found": sum(index is not None for index in hit),
        "exact": sum(exact),
        "batch_ms": round(batch_ms, 1),
        "single_ms": [round(ms, 1) for ms in single_ms],
    }


def _place_of(windows: list[Selection], item: Later) -> int | None:
    """The index of the place whose window holds the later hunk ``item`` (None: no place found it)."""
    for index, window in enumerate(windows):
        start = window.range.start.line
        if start <= item.first and item.first + item.count <= start + len(window.text.splitlines()):
            return index
    return None


def summarize_chains(results: list[dict[str, object]]) -> dict[str, object]:
    """The shares of later places found and edited exactly, and the waits for the 2nd to k-th edit."""
    judged = [result for result in results if "refused" not in result]
    later = sum(int(result["later"]) for result in judged)  # type: ignore[call-overload]
    found = sum(int(result["found"]) for result in judged)  # type: ignore[call-overload]
    exact = sum(int(result["exact"]) for result in judged)  # type: ignore[call-overload]
    first_single = [float(result["single_ms"][0]) for result in judged]  # type: ignore[index]
    later_single = [float(ms) for result in judged for ms in result["single_ms"][1:]]  # type: ignore[index]
    batch = [float(result["batch_ms"]) for result in judged]  # type: ignore[arg-type]
    whole = [sum(result["single_ms"]) for result in judged]  # type: ignore[call-overload]
    waits = {
        "first_wait_ms_p50": {"batched": _p50(batch), "one_after_another": _p50(first_single)},
        "later_wait_ms_p50": {"batched": 0.0, "one_after_another": _p50(later_single)},
        "chain_ms_mean": {"batched": _mean(batch), "one_after_another": _mean(whole)},
    }
    return {
        "chains": len(judged),
        "refused": len(results) - len(judged),
        "later_places": later,
        "found_share": round(found / later, 3) if later else 0.0,
        "exact_share": round(exact / later, 3) if later else 0.0,
        **waits,
    }


def _p50(values: list[float]) -> float:
    return round(percentile(values, 0.5), 1) if values else 0.0


def _mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 1) if values else 0.0


def write_chains(
    args: argparse.Namespace, cases: list[Case], loaded: LoadedModel, settings: Settings, machine: dict[str, object]
) -> None:
    """Up to ``--n`` chain cases (seeded), judged, summed up and written (no plot)."""
    chains = chain_cases(cases)
    chosen = random.Random(args.seed).sample(chains, min(args.n, len(chains)))
    judged = [judge_chain(case, settings, loaded, number) for number, case in enumerate(chosen)]
    results = [result for result in judged if result is not None]
    figures: dict[str, object] = {
        "model": str(args.model),
        "repo": str(args.repo),
        "repo_head": git(args.repo, "rev-parse", "--short", "HEAD").strip(),
        "chain_cases_found": len(chains),
        "settings": {"nextEditStrength": settings.next_edit_strength, "nextEditDraws": settings.next_edit_draws},
        "chain_window_lines": CHAIN_WINDOW_LINES,
        "seed": args.seed,
        **summarize_chains(results),
        "results": results,
    }
    json_path = args.json if args.json != RESULTS / "next_edit_eval.json" else RESULTS / "next_edit_chains.json"
    write_report(json_path, figures, machine, None, unprinted=("results",))


def main() -> None:
    args = options(__doc__.split("\n\n", 1)[0]).parse_args()
    machine = machine_report()
    cases = find_cases(args.repo, args.commits)
    loaded = load_model(args.model, args.device, "float32" if args.device == "cpu" else None)
    write_chains(args, cases, loaded, Settings(next_edit_draws=args.draws), machine)


if __name__ == "__main__":
    main()
