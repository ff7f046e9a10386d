"""Which confidence signal tells a right character from a wrong one? Candidates read off the denoising steps.

    python -m benchmarks.confidence_signals [--model DIR ...] [--own-prompt DIR ...] [--limit 100]
        [--repo PATH --lines 100] [--json PATH]

The engine's first confidence was each position's probability of its token at the last step; it is about 1 wherever
a canvas settled (the stopper wants a mean entropy under 0.005), wrong tokens included. This benchmark records every
step of each canvas (its argmax and its probabilities, read from the state the one step returns: no second forward
pass) and computes, per position, with ``f`` its final token and ``s`` the first step from which the argmax stayed
``f`` (the step it *settled* at):

* ``last``: the probability of ``f`` at the last step (the engine's first signal, and what vLLM reports);
* ``settled``: the probability of ``f`` at step ``s``, when it became the final argmax;
* ``settled_min`` / ``settled_mean``: its lowest / mean probability from ``s`` on;
* ``settled_margin``: at ``s``, its probability less the runner-up's;
* ``age``: the share of the steps run from ``s`` on (what the engine reports now: ``canvas.sampler.stable_steps``);
* ``first``: the probability of ``f`` at the first step; ``min_all`` / ``mean_all``: its lowest / mean over all
  steps (these need every step's whole distribution kept until the end: not computable in the loop as it runs).

Each is carried to the characters exactly as the engine's confidence is (``finish_row``: a character takes the lowest
of its tokens') and through the language server's post-processing (``postprocess``, ``confidence=``), then scored on
what a user sees: a character *survives* when the suggestion is right up to and including it (the canonical text
starts with it). Per candidate: the AUROC of its confidence for the characters that survive against those that do
not (0.5: no better than chance), the same per suggestion (its lowest confidence against it being right whole), per
rewrite (its mean against giving back the working line), the reliability table (per tenth of confidence, the
share of characters that survive) and the ``minConfidence`` sweeps of the suggestion gate (``confident_part``: withheld,
right ones withheld or cut short, wrong ones still shown) and of the rewrite gate (``unsure_replacement``: right and
wrong rewrites refused).

Cases: HumanEval-infilling single-line tasks and their mid-line variants (``--limit``; evaluation only), and lines of
a repository nobody here wrote (``--repo``: each a whole line and a mid-line cut, from the Python files at HEAD).
"""

from __future__ import annotations

import argparse
import contextlib
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from unittest import mock

import torch

from benchmarks.humaneval import DEFAULT_DATA, SPLITS, load_tasks, mid_line_task
from benchmarks.machine import machine_report
from benchmarks.next_edit_eval import git
from benchmarks.plots import pyplot, save
from benchmarks.report import RESULTS, write_report
from diffgemma_engine.canvas import denoise
from diffgemma_engine.canvas.step import DecoderInputs, Step, StepState
from diffgemma_engine.errors import BadRequestError
from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.infill import finish_row, run_infill
from diffgemma_engine.shared import protocol
from diffgemma_lsp.postprocess import postprocess
from diffgemma_lsp.postprocess.confidence import Scored, confident_part, per_character, unsure_replacement
from diffgemma_lsp.postprocess.replacement import scored_replacement

Case = tuple[str, str, str]
"""(prefix, suffix, the canonical middle)."""

Trace = list[tuple[torch.Tensor, torch.Tensor]]
"""Per step run: the argmax (C,) and the probabilities (C, V) of the canvas's one row."""

SIGNALS = (
    "last",
    "settled",
    "settled_min",
    "settled_mean",
    "settled_margin",
    "age",
    "first",
    "min_all",
    "mean_all",
)
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


@contextlib.contextmanager
def traced() -> Iterator[Trace]:
    """Record each step of the eager loop (``denoise.run_steps``) while inside: the argmax and the probabilities at the
    step's temperature, from the self-conditioning logits the step hands to the next one (the step's own scores)."""
    trace: Trace = []
    original = denoise.run_steps

    def run_steps(step: Step, inputs: DecoderInputs, state: StepState, *args: object, **kwargs: object) -> object:
        trace.clear()

        def recorded(inputs: DecoderInputs, state: StepState, noise: object) -> StepState:
            after = step(inputs, state, noise)  # type: ignore[arg-type]
            assert after.self_conditioning is not None
            trace.append((after.best[0].clone(), torch.softmax(after.self_conditioning[0].float(), dim=-1)))
            return after

        return original(recorded, inputs, state, *args, **kwargs)  # type: ignore[arg-type]

    with mock.patch.object(denoise, "run_steps", run_steps):
        yield trace


def signals(trace: Trace) -> dict[str, list[float]]:
    """Every candidate, per canvas position, from a canvas's steps."""
    best = torch.stack([argmax for argmax, _ in trace])  # (n, C)
    probs = torch.stack([p for _, p in trace])  # (n, C, V)
    final = best[-1]
    steps = best.shape[0]
    of_final = probs.gather(-1, final.expand(steps, -1)[..., None]).squeeze(-1)  # (n, C)
    top2 = probs.topk(2, dim=-1).values  # (n, C, 2)
    changed = best != final  # (n, C)
    index = torch.arange(steps)[:, None].expand_as(changed)
    settle = torch.where(changed, index + 1, 0).amax(dim=0)  # (C,) first step of the final run
    positions = torch.arange(final.shape[0])
    since = index >= settle[None]
    at_settle = of_final[settle, positions]
    first, second = top2[settle, positions, 0], top2[settle, positions, 1]
    runner_up = torch.where(first == at_settle, second, first)
    out = {
        "last": of_final[-1],
        "settled": at_settle,
        "settled_min": torch.where(since, of_final, 2.0).amin(dim=0),
        "settled_mean": (of_final * since).sum(dim=0) / since.sum(dim=0),
        "settled_margin": (at_settle - runner_up).clamp(min=0.0),
        "age": (steps - settle).float() / steps,
        "first": of_final[0],
        "min_all": of_final.amin(dim=0),
        "mean_all": of_final.mean(dim=0),
    }
    return {name: value.tolist() for name, value in out.items()}


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


def auroc(samples: Sequence[tuple[float, bool]]) -> float | None:
    """The probability that a random positive scores above a random negative (ties count half): Mann-Whitney U."""
    ordered = sorted(samples, key=lambda sample: sample[0])
    ranks: list[float] = [0.0] * len(ordered)
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1][0] == ordered[start][0]:
            end += 1
        for at in range(start, end + 1):
            ranks[at] = (start + end) / 2 + 1
        start = end + 1
    positives = sum(kept for _, kept in ordered)
    negatives = len(ordered) - positives
    if not positives or not negatives:
        return None
    rank_sum = sum(rank for rank, (_, kept) in zip(ranks, ordered, strict=True) if kept)
    return round((rank_sum - positives * (positives + 1) / 2) / (positives * negatives), 3)


def repo_cases(repo: Path, lines: int, seed: int = 0) -> list[Case]:
    """``lines`` lines of the repository's Python files at HEAD (drawn with ``seed``), each as a whole-line gap and a
    mid-line one (``humaneval.mid_line_task``'s cut)."""
    files = [path for path in git(repo, "ls-tree", "-r", "--name-only", "HEAD").split() if path.endswith(".py")]
    chosen: list[tuple[str, int]] = []
    for path in files:
        text = git(repo, "show", f"HEAD:{path}")
        chosen += [(text, n) for n, line in enumerate(text.splitlines(keepends=True)) if len(line.strip()) >= 4]
    out: list[Case] = []
    for text, n in random.Random(seed).sample(chosen, min(lines, len(chosen))):
        split = text.splitlines(keepends=True)
        task = {"task_id": f"{n}:{hash(text) % 997}", "prompt": "".join(split[:n]), "suffix": "".join(split[n + 1 :])}
        task["canonical_solution"] = split[n] if split[n].endswith("\n") else split[n] + "\n"
        out.append((task["prompt"], task["suffix"], task["canonical_solution"]))
        mid = mid_line_task(task)
        if mid is not None:
            out.append((mid["prompt"], mid["suffix"], mid["canonical_solution"]))
    return out


Scorer = Callable[[protocol.Infill, list[int], Sequence[float]], Scored | None]
"""(the request, its final canvas, one confidence per canvas position) -> what the user would be shown."""


def measure(loaded: LoadedModel, cases: list[Case]) -> dict[str, object]:
    shown: dict[str, list[tuple[Scored, str]]] = {name: [] for name in SIGNALS}
    rewrites: dict[str, list[tuple[Scored, str]]] = {name: [] for name in SIGNALS}

    def suggestion(request: protocol.Infill, canvas: list[int], values: Sequence[float]) -> Scored | None:
        answer = finish_row(loaded, canvas, None, confidence=values)
        confidence = per_character(answer.text, answer.confidence)
        edit = postprocess(request.prefix, request.suffix, answer.text, "python", confidence=confidence)
        return None if edit is None or edit.confidence is None else edit.scored

    def replaced(request: protocol.Infill, canvas: list[int], values: Sequence[float]) -> Scored | None:
        answer = finish_row(loaded, canvas, None, confidence=values)
        raw = Scored(answer.text, per_character(answer.text, answer.confidence))
        selection = request.start[0].text
        scored = scored_replacement(request.prefix, selection, request.suffix, raw, "python")
        return None if scored is None or scored.confidence is None else scored

    for seed, (prefix, suffix, truth) in enumerate(cases):
        fields = dict(uri="file:///task.py", prefix=prefix, suffix=suffix, language_id="python", seed=seed)
        insertion = protocol.Infill(id=str(seed), scope=protocol.cursor_scope(prefix), **fields)  # type: ignore[arg-type]
        for name, scored in _run(loaded, insertion, suggestion).items():
            shown[name].append((scored, truth))
        if truth.endswith("\n") and prefix.endswith("\n"):  # a whole line: rewrite it, as "Rewrite selection" does
            start = [protocol.StartSegment(text=truth)]
            rewrite = protocol.Infill(id=f"r{seed}", start=start, strength=REWRITE_STRENGTH, **fields)  # type: ignore[arg-type]
            for name, scored in _run(loaded, rewrite, replaced).items():
                rewrites[name].append((scored, truth))
    return {name: _figures(shown[name], rewrites[name]) for name in SIGNALS}


def _run(loaded: LoadedModel, request: protocol.Infill, shape: Scorer) -> dict[str, Scored]:
    """``request`` run once, traced; what the user would be shown, once per candidate signal."""
    with traced() as trace:
        try:
            answer = run_infill(loaded, request)
        except BadRequestError:  # a line longer than a canvas, refused as the editor's request would be
            return {}
    if not trace or not answer.text:
        return {}
    canvas = trace[-1][0].tolist()
    assert finish_row(loaded, canvas, None).text == answer.text, "the trace's last argmax is the answer"
    out = {}
    for name, values in signals(trace).items():
        scored = shape(request, canvas, values)
        if scored is not None:
            out[name] = scored
    return out


def _figures(shown: list[tuple[Scored, str]], rewrites: list[tuple[Scored, str]]) -> dict[str, object]:
    chars = [
        (p, alive)
        for scored, truth in shown
        for char, p, alive in zip(scored.text, scored.confidence or (), survivors(scored.text, truth), strict=True)
        if not char.isspace()
    ]
    whole = [(scored.lowest() or 0.0, scored.text.strip() == truth.strip()) for scored, truth in shown]
    replaced = [(scored.mean() or 0.0, scored.text.strip() == truth.strip()) for scored, truth in rewrites]
    return {
        "auroc_chars": auroc(chars),
        "auroc_suggestions": auroc(whole),
        "auroc_rewrites": auroc(replaced),
        "chars": len(chars),
        "chars_survive": sum(kept for _, kept in chars),
        "suggestions": len(whole),
        "suggestions_right": sum(right for _, right in whole),
        "rewrites": len(replaced),
        "rewrites_right": sum(right for _, right in replaced),
        "reliability": reliability(chars),
        "suggestion_gate": suggestion_gate(shown),
        "rewrite_gate": rewrite_gate(rewrites),
    }


def plot(path: Path, runs: list[dict[str, object]]) -> None:
    plt = pyplot()
    if plt is None:
        return
    figure, axes = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / max(len(runs), 1)
    for at, run in enumerate(runs):
        by_signal = run["signals"]
        assert isinstance(by_signal, dict)
        values = [by_signal[name]["auroc_chars"] or 0.5 for name in SIGNALS]
        axes.bar([n + at * width for n in range(len(SIGNALS))], values, width, label=str(run["label"]))
    axes.axhline(0.5, color="#999999", linestyle="--", linewidth=1)
    axes.set_xticks([n + 0.4 - width / 2 for n in range(len(SIGNALS))], SIGNALS, rotation=30, fontsize=7)
    axes.set_ylabel("AUROC: characters that survive vs not")
    axes.set_ylim(0.3, 1.0)
    axes.set_title("Confidence signals read off the denoising steps", fontsize=9)
    axes.legend(fontsize=6)
    save(figure, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, action="append", help="a checkpoint folder (repeat); default: shipped")
    parser.add_argument("--own-prompt", type=Path, action="append", default=[], help="a test checkpoint, with its own")
    parser.add_argument("--limit", type=int, default=100, help="HumanEval single-line tasks (each with its mid-line)")
    parser.add_argument("--repo", type=Path, help="a git repository nobody here wrote (its Python files at HEAD)")
    parser.add_argument("--lines", type=int, default=100, help="lines of --repo (each whole and cut mid-line)")
    parser.add_argument("--json", type=Path, default=RESULTS / "confidence_signals.json")
    args = parser.parse_args()
    machine = machine_report()
    humaneval = [(task["prompt"], task["suffix"], task["canonical_solution"]) for task in tasks(args.limit)]
    sets = [("humaneval", humaneval)] if humaneval else []
    if args.repo is not None:
        name = args.repo.resolve().name
        sets.append((args.repo.resolve().parent.name if name == "repo" else name, repo_cases(args.repo, args.lines)))
    runs = []
    models = [(path, False) for path in args.model or ([] if args.own_prompt else [DEFAULT_MODEL_DIR])]
    for path, own in [*models, *((p, True) for p in args.own_prompt)]:
        loaded = load_model(path)
        for name, cases in sets:
            cases = cases + [OWN_PROMPT] * 20 if own else cases
            label = f"{path.name}/{name}" + ("+own" if own else "")
            runs.append({"label": label, "model": str(path), "cases": len(cases), "signals": measure(loaded, cases)})
    write_report(args.json, {"limit": args.limit, "lines": args.lines, "runs": runs}, machine, lambda p: plot(p, runs))


if __name__ == "__main__":
    main()
