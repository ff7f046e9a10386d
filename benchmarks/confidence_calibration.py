"""Is the confidence the engine shows with each character worth acting on? A reliability table and the gate's cost.

    python -m benchmarks.confidence_calibration [--model DIR ...] [--limit 150] [--json PATH]

For each checkpoint (the shipped model by default; the test checkpoints by their folders), each HumanEval-infilling
single-line task and its mid-line variant (``benchmarks.humaneval``: code nobody here wrote; evaluation only) is
completed in-process as the language server would ask (``run_infill``, one seed per task), with the engine's
confidence per character (``Result.confidence``) carried through the language server's post-processing
(``diffgemma_lsp.postprocess``, ``confidence=``). Besides them, ``--own-prompt`` adds a document each test checkpoint
was trained to answer (its memorized prompt, several seeds), where it is right.

* **Reliability**: every character shown is put in a bin of its confidence (tenths); a character *survives* when the
  suggestion is right up to and including it (the canonical line starts with it): what a user who accepts that far
  keeps. A calibrated model's share of survivors in a bin is about the bin's confidence.
* **The suggestion gate** (``minConfidence``, ``postprocess.confidence.confident_part``), swept over thresholds:
  the share of suggestions withheld, how many of them were *right* (the whole suggestion the canonical line, blank
  space aside) and withheld anyway, how many wrong ones are still shown (what is left of them, cut or not, is not
  a prefix of the canonical text), and the share of the characters still shown that survive.
* **The rewrite gate** (``unsure_replacement``): each task's canonical line selected and rewritten at the
  ``rewriteStrength`` default (0.6), as "Rewrite selection" sends it; a rewrite is *right* when it gives back the
  working line (blank space aside), else it replaced working code with something else (the ``total_:`` report).
  Swept: right rewrites refused, wrong ones refused.

The JSON holds every figure; a PNG beside it plots survival against confidence, one line per checkpoint.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from benchmarks.humaneval import DEFAULT_DATA, SPLITS, load_tasks, mid_line_task
from benchmarks.machine import machine_report
from benchmarks.plots import pyplot, save
from benchmarks.report import RESULTS, write_report
from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.infill import run_infill
from diffgemma_engine.shared import protocol
from diffgemma_lsp.postprocess import postprocess
from diffgemma_lsp.postprocess.confidence import Scored, confident_part, per_character, unsure_replacement
from diffgemma_lsp.postprocess.replacement import scored_replacement

THRESHOLDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
BINS = 10
REWRITE_STRENGTH = 0.6
"""The ``rewriteStrength`` setting's default."""
OWN_PROMPT = ("def add(a, b):\n", "\n\nprint(add(1, 2))\n", "    total = a + b\n    return total")
"""The memorized test checkpoint's document and answer (tests/support/models.py ``MEMORIZED_*``)."""


def tasks(limit: int) -> Iterator[dict]:
    """The first ``limit`` single-line tasks, each followed by its mid-line variant where it has one."""
    for task in load_tasks(DEFAULT_DATA / SPLITS["single-line"])[:limit]:
        yield task
        mid = mid_line_task(task)
        if mid is not None:
            yield mid


def _same(a: str, b: str) -> bool:
    return a.strip() == b.strip()


def suggestion(loaded: LoadedModel, prefix: str, suffix: str, seed: int) -> Scored | None:
    """The suggestion the editor would be offered, with its confidence per character (None: nothing to show)."""
    request = protocol.Infill(
        id=str(seed),
        uri="file:///task.py",
        prefix=prefix,
        suffix=suffix,
        language_id="python",
        scope=protocol.cursor_scope(prefix),
        seed=seed,
    )
    answer = run_infill(loaded, request)
    edit = postprocess(prefix, suffix, answer.text, "python", confidence=per_character(answer.text, answer.confidence))
    return None if edit is None or edit.confidence is None else edit.scored


def rewrite(loaded: LoadedModel, prefix: str, selection: str, suffix: str, seed: int) -> Scored | None:
    """What "Rewrite selection" would put in place of ``selection``, with its confidence per character."""
    request = protocol.Infill(
        id=f"r{seed}",
        uri="file:///task.py",
        prefix=prefix,
        suffix=suffix,
        language_id="python",
        start=[protocol.StartSegment(text=selection)],
        strength=REWRITE_STRENGTH,
        seed=seed,
    )
    answer = run_infill(loaded, request)
    raw = Scored(answer.text, per_character(answer.text, answer.confidence))
    scored = scored_replacement(prefix, selection, suffix, raw, "python")
    return None if scored is None or scored.confidence is None else scored


def survivors(shown: str, truth: str) -> list[bool]:
    """Per character of ``shown``: whether ``truth`` starts with ``shown`` up to and including it."""
    out, alive = [], True
    for index, char in enumerate(shown):
        alive = alive and index < len(truth) and truth[index] == char
        out.append(alive)
    return out


def reliability(samples: list[tuple[float, bool]]) -> list[dict[str, float]]:
    """Per tenth of confidence: characters, their mean confidence and the share that survive."""
    rows = []
    for low in range(BINS):
        inside = [
            (p, kept) for p, kept in samples if low / BINS <= p < (low + 1) / BINS or (low == BINS - 1 and p == 1)
        ]
        if inside:
            rows.append(
                {
                    "from": low / BINS,
                    "to": (low + 1) / BINS,
                    "chars": len(inside),
                    "mean_confidence": round(sum(p for p, _ in inside) / len(inside), 3),
                    "survive": round(sum(kept for _, kept in inside) / len(inside), 3),
                }
            )
    return rows


def suggestion_gate(shown: list[tuple[Scored, str]]) -> list[dict[str, float]]:
    """The ``minConfidence`` sweep over the suggestions (each with its canonical text)."""
    right = [(scored, truth) for scored, truth in shown if _same(scored.text, truth)]
    rows = []
    for minimum in THRESHOLDS:
        kept_chars = surviving = withheld = withheld_right = cut_right = kept_wrong = 0
        for scored, truth in shown:
            part = confident_part(scored, minimum)
            if part is None:
                withheld += 1
                withheld_right += _same(scored.text, truth)
                continue
            kept_wrong += not all(survivors(part.text, truth))
            cut_right += _same(scored.text, truth) and not _same(part.text, truth)
            kept = [
                alive for char, alive in zip(part.text, survivors(part.text, truth), strict=True) if not char.isspace()
            ]
            kept_chars += len(kept)
            surviving += sum(kept)
        rows.append(
            {
                "min_confidence": minimum,
                "withheld": round(withheld / max(len(shown), 1), 3),
                "withheld_right": withheld_right,
                "right": len(right),
                "right_cut_short": cut_right,
                "kept_wrong": kept_wrong,
                "wrong": len(shown) - len(right),
                "shown_chars_survive": round(surviving / max(kept_chars, 1), 3),
                "chars_shown": kept_chars,
            }
        )
    return rows


def rewrite_gate(rewrites: list[tuple[Scored, str]]) -> list[dict[str, float]]:
    """The ``minConfidence`` sweep over the rewrites (each with the working line it replaced)."""
    rows = []
    for minimum in THRESHOLDS:
        refused = [(scored, truth) for scored, truth in rewrites if unsure_replacement(scored, minimum) is not None]
        rows.append(
            {
                "min_confidence": minimum,
                "refused_right": sum(_same(scored.text, truth) for scored, truth in refused),
                "right": sum(_same(scored.text, truth) for scored, truth in rewrites),
                "refused_wrong": sum(not _same(scored.text, truth) for scored, truth in refused),
                "wrong": sum(not _same(scored.text, truth) for scored, truth in rewrites),
            }
        )
    return rows


def measure(model_dir: Path, limit: int, own_prompt: bool) -> dict[str, object]:
    loaded = load_model(model_dir)
    cases = [(task["prompt"], task["suffix"], task["canonical_solution"]) for task in tasks(limit)]
    if own_prompt:
        cases += [OWN_PROMPT] * 20
    shown: list[tuple[Scored, str]] = []
    rewrites: list[tuple[Scored, str]] = []
    for seed, (prefix, suffix, truth) in enumerate(cases):
        scored = suggestion(loaded, prefix, suffix, seed)
        if scored is not None:
            shown.append((scored, truth))
        whole_line = truth.endswith("\n") and prefix.endswith("\n")  # a single-line task, not its mid-line variant
        if whole_line:
            replaced = rewrite(loaded, prefix, truth, suffix, seed)
            if replaced is not None:
                rewrites.append((replaced, truth))
    samples = [
        (p, alive)
        for scored, truth in shown
        for char, p, alive in zip(scored.text, scored.confidence or (), survivors(scored.text, truth), strict=True)
        if not char.isspace()
    ]
    return {
        "model": str(model_dir),
        "cases": len(cases),
        "suggestions_shown": len(shown),
        "reliability": reliability(samples),
        "suggestion_gate": suggestion_gate(shown),
        "rewrites": len(rewrites),
        "rewrite_gate": rewrite_gate(rewrites),
    }


def plot(path: Path, runs: list[dict[str, object]]) -> None:
    plt = pyplot()
    if plt is None:
        return
    figure, axes = plt.subplots(figsize=(5.5, 4.2))
    axes.plot([0, 1], [0, 1], color="#999999", linestyle="--", linewidth=1, label="calibrated")
    for run in runs:
        rows = run["reliability"]
        assert isinstance(rows, list)
        axes.plot(
            [row["mean_confidence"] for row in rows],
            [row["survive"] for row in rows],
            marker="o",
            label=Path(str(run["model"])).name,
        )
    axes.set_xlabel("confidence shown (mean of the bin)")
    axes.set_ylabel("share of characters that survive")
    axes.set_title("Confidence calibration (HumanEval-infilling, single- and mid-line)", fontsize=9)
    axes.legend(fontsize=7)
    save(figure, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, action="append", help="a checkpoint folder (repeat); default: shipped")
    parser.add_argument("--own-prompt", type=Path, action="append", default=[], help="a test checkpoint, with its own")
    parser.add_argument("--limit", type=int, default=150, help="single-line tasks (each with its mid-line variant)")
    parser.add_argument("--json", type=Path, default=RESULTS / "confidence_calibration.json")
    args = parser.parse_args()
    machine = machine_report()
    models = [(path, False) for path in args.model or ([] if args.own_prompt else [DEFAULT_MODEL_DIR])]
    runs = [measure(path, args.limit, own) for path, own in [*models, *((p, True) for p in args.own_prompt)]]
    write_report(args.json, {"limit": args.limit, "runs": runs}, machine, lambda png: plot(png, runs))


if __name__ == "__main__":
    main()
