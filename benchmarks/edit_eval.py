"""Repairs on HumanEval: one line of a correct program corrupted, the engine asked to rewrite that line.

    python -m benchmarks.edit_eval [--model DIR] [--data FILE] [--n 82] [--strengths S [S ...]] [--steps N]
                                   [--seed 0] [--timeout 5] [--device cpu] [--instruction TEXT] [--raw | --also-raw]
                                   [--json PATH] [--plot PATH] [--corrupt-only]

The programs are HumanEval's canonical solutions as the single-line infilling tasks hold them
(``benchmarks.humaneval``): each task is a whole program split around one line of its solution. For each of ``--n``
problems spread evenly over the file (82: every other one), one line is corrupted in one of three ways, the kind
taking turns from problem to problem and the seed picking the line and the place: ``operator`` swaps an operator
(``<`` for ``>``, ``+`` for ``-``, ``and`` for ``or``, ...), ``name`` puts another name of the program in place of
one, ``drop`` removes one token. Only a corruption that makes the task's tests fail counts (failing, not running past
the timeout: a hang would cost the timeout at every strength), and only lines the engine takes as a selection (the
line and its corruption fit the model's canvas with an end-of-sequence token: the engine refuses a longer one, as it
would the language server's request). A kind with no such corruption among its first ``--tries`` candidates gives way
to the next kind, and a problem with none at all is left out (counted in the JSON).

The repair is the request the language server sends for "Rewrite selection" on that line: ``protocol.Infill`` with
``prefix`` the program before the line, ``start`` the corrupted line (its indentation included, its line break not),
``suffix`` the line break and everything after, and ``strength`` S, on the model's canvas and steps, served
in-process by the engine's own ``run_infill`` on the loaded model (seeded per edit, the same seed at every strength).
The engine's text then goes through the language server's post-processing for a replacement
(``diffgemma_lsp.postprocess.postprocess_replacement``, as ``diffgemma.rewriteSelection`` applies it: the indentation
fitted to the selection, the cuts, the selection's blank space at both ends); an answer it leaves nothing of makes no
edit (``suppressed``), so the line stays corrupted. ``--raw`` scores the engine's text as it is, ``--also-raw`` both
on the same answers (``raw_pass_at_1``, and the edits only one of them repairs). The program then runs with the
task's tests.

Reported for each strength: pass@1 of the repaired programs (also by kind), steps per edit (``Timings.steps``), ms
per edit (the wall time of ``run_infill``; the engine's own ``total_ms`` beside it), the share of edits that leave
the corrupted line (``unchanged``) or put back the original one (``restored``), blank space at both ends aside, and
the share of the engine's texts that start with the corrupted line (``starts_with_corrupted``). Strength 1 is a
from-noise infill of the same span: the baseline every lighter strength is measured against. Beside them: the
do-nothing floor (the corrupted program as is, which fails by construction: 0) and the "keep the line" check, the
corrupted line sent with ``keep=True`` at strength 1: its tokens are held, so every answer must start with it
(``starts_with_corrupted`` 1); what follows them is the model's (the end-of-sequence after a selection is not held),
so ``unchanged`` and pass@1 say what it wrote there. ``--corrupt-only`` chooses the corruptions and stops, without a
model (and without the canvas check): what the edits are, and that each breaks its task. ``--instruction`` goes into
a chat-layout checkpoint's prompt (FIM ones ignore it). Data: ``benchmarks.humaneval``. Never train on it.
"""

from __future__ import annotations

import argparse
import io
import json
import keyword
import random
import statistics
import time
import tokenize
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.humaneval import DEFAULT_DATA, FAIL, PASS, SPLITS, TIMEOUT, compiles, load_tasks, pick, run_outcome
from benchmarks.report import RESULTS, write_report
from diffgemma_lsp.postprocess import postprocess_replacement

KINDS = ("operator", "name", "drop")
"""The corruptions, in the order the problems take them in turn."""
OPERATOR_SWAPS = {
    "<": ">",
    ">": "<",
    "<=": ">=",
    ">=": "<=",
    "==": "!=",
    "!=": "==",
    "+": "-",
    "-": "+",
    "*": "+",
    "/": "*",
    "//": "%",
    "%": "//",
    "+=": "-=",
    "-=": "+=",
    "and": "or",
    "or": "and",
}
"""What each operator becomes under ``operator``."""
DROPPABLE = (tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING)
"""The tokens ``drop`` may remove (not comments)."""
LAYOUT_TOKENS = (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
DEFAULT_STRENGTHS = (0.2, 0.4, 0.6, 0.8)
BASELINE_STRENGTH = 1.0
"""From noise: the same span infilled as if nothing were there."""
POSTPROCESSED = "diffgemma_lsp.postprocess.postprocess_replacement, as diffgemma.rewriteSelection applies it"
RAW = "none (--raw): the engine's text replaces the line as it is"
UNPRINTED = ("samples", "passed_task_ids", "passed_only_processed", "passed_only_raw")
SAMPLES_KEPT = 6
"""Answers kept in the JSON per strength, to read what the model wrote."""


@dataclass(frozen=True)
class Edit:
    """One corrupted line of one task's program: what to repair and how to test it."""

    task_id: str
    kind: str
    line_number: int
    """1-based, in the program."""
    line: str
    """The correct line (indentation included, line break not)."""
    corrupted: str
    prefix: str
    """The program before the line (ends with its line break)."""
    suffix: str
    """The line break after the line, and the rest of the program."""
    test: str
    entry_point: str

    def program(self, middle: str) -> str:
        """The program with ``middle`` in place of the line, then the task's tests."""
        return f"{self.prefix}{middle}{self.suffix}\n\n{self.test}\n\ncheck({self.entry_point})\n"


def split_task(task: dict) -> tuple[str, str, str]:
    """(prefix, line, suffix) of a single-line task: the gap's line without its line break, which starts the
    suffix."""
    line = task["canonical_solution"]
    if line.endswith("\n"):
        return task["prompt"], line[:-1], "\n" + task["suffix"]
    return task["prompt"], line, task["suffix"]


def line_tokens(prefix: str, line: str, suffix: str) -> list[tokenize.TokenInfo]:
    """The tokens that lie wholly on the line (its indentation and line break aside), columns within it; [] if the
    program does not tokenize."""
    row = prefix.count("\n") + 1
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(prefix + line + suffix).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    return [t for t in tokens if t.start[0] == row and t.end[0] == row and t.type not in LAYOUT_TOKENS]


def program_names(prefix: str, line: str, suffix: str) -> list[str]:
    """The names the program's code uses (keywords aside), sorted: what ``name`` may put in place of another."""
    try:
        tokens = tokenize.generate_tokens(io.StringIO(prefix + line + suffix).readline)
        return sorted({t.string for t in tokens if t.type == tokenize.NAME and not keyword.iskeyword(t.string)})
    except (tokenize.TokenError, SyntaxError):
        return []


def replace_span(line: str, start: int, end: int, text: str) -> str:
    """``line`` with columns ``start:end`` replaced by ``text``; a removal between two spaces takes one with it."""
    if not text and 0 < start and end < len(line) and line[start - 1] == " " and line[end] == " ":
        end += 1
    return line[:start] + text + line[end:]


def candidates(kind: str, line: str, tokens: list[tokenize.TokenInfo], names: list[str]) -> list[str]:
    """Every corrupted line of ``kind`` the line allows, in a fixed order (distinct, changed, not blank)."""
    out: list[str] = []
    for token in tokens:
        start, end = token.start[1], token.end[1]
        if kind == "operator" and token.type in (tokenize.OP, tokenize.NAME) and token.string in OPERATOR_SWAPS:
            out.append(replace_span(line, start, end, OPERATOR_SWAPS[token.string]))
        elif kind == "name" and token.type == tokenize.NAME and not keyword.iskeyword(token.string):
            out.extend(replace_span(line, start, end, name) for name in names if name != token.string)
        elif kind == "drop" and token.type in DROPPABLE:
            out.append(replace_span(line, start, end, ""))
    seen: set[str] = set()
    return [c for c in out if c != line and c.strip() and not (c in seen or seen.add(c))]


def problem_of(task: dict) -> str:
    """``HumanEval/12`` for ``SingleLineInfilling/HumanEval/12/L3``."""
    parts = task["task_id"].split("/")
    return "/".join(parts[1:3]) if len(parts) >= 3 else task["task_id"]


def problems(tasks: list[dict]) -> list[list[dict]]:
    """The tasks grouped by HumanEval problem (each task one line of its program), in the file's order."""
    grouped: dict[str, list[dict]] = {}
    for task in tasks:
        grouped.setdefault(problem_of(task), []).append(task)
    return list(grouped.values())


@dataclass
class Tally:
    """What choosing the corruptions cost and threw away."""

    test_runs: int = 0
    passed_anyway: int = 0
    """Corruptions whose program still passed its tests (not counted)."""
    timed_out: int = 0
    """Corruptions whose program ran past the timeout (not counted)."""
    fell_back: int = 0
    """Problems whose turn's kind had no breaking corruption, so another kind's was taken."""
    left_out: int = 0
    """Problems without any breaking corruption (or whose correct program fails)."""
    too_long: int = 0
    """Candidates passed over because the line or its corruption does not fit the model's canvas."""


Fits = Callable[[str], bool]
"""Whether the engine takes a text as a rewrite's selection (it fits the canvas)."""


def corrupt(
    lines: list[dict], index: int, seed: int, tries: int, timeout: float, tally: Tally, fits: Fits | None = None
) -> Edit | None:
    """One breaking corruption of one of the problem's lines: the kind ``KINDS[index % 3]`` first, the seed picking
    among its candidates (at most ``tries`` tested), then the other kinds; None if none breaks the tests. With
    ``fits``, a candidate whose line or corruption the engine would refuse is passed over untested."""
    rng = random.Random(f"{seed}:{problem_of(lines[0])}")
    correct: dict[str, bool] = {}
    turn = index % len(KINDS)
    for kind in KINDS[turn:] + KINDS[:turn]:
        pool = []
        for task in lines:
            prefix, line, suffix = split_task(task)
            tokens = line_tokens(prefix, line, suffix)
            names = program_names(prefix, line, suffix) if kind == "name" else []
            pool.extend((task, bad) for bad in candidates(kind, line, tokens, names))
        rng.shuffle(pool)
        tested = 0
        for task, bad in pool:
            if tested == tries:
                break
            prefix, line, suffix = split_task(task)
            if fits is not None and not (fits(line) and fits(bad)):
                tally.too_long += 1
                continue
            tested += 1
            edit = Edit(
                task["task_id"],
                kind,
                prefix.count("\n") + 1,
                line,
                bad,
                prefix,
                suffix,
                task["test"],
                task["entry_point"],
            )
            if task["task_id"] not in correct:
                tally.test_runs += 1
                correct[task["task_id"]] = run_outcome(edit.program(line), timeout) == PASS
            if not correct[task["task_id"]]:
                continue
            tally.test_runs += 1
            outcome = run_outcome(edit.program(bad), timeout)
            if outcome == FAIL:
                tally.fell_back += kind != KINDS[turn]
                return edit
            tally.passed_anyway += outcome == PASS
            tally.timed_out += outcome == TIMEOUT
    tally.left_out += 1
    return None


def choose_edits(
    tasks: list[dict], n: int | None, seed: int, tries: int, timeout: float, fits: Fits | None = None
) -> tuple[list[Edit], Tally]:
    """The corrupted lines of ``n`` problems spread evenly over ``tasks`` (all with None), and what it took."""
    tally = Tally()
    chosen = pick(problems(tasks), n, None)
    edits = [corrupt(lines, i, seed, tries, timeout, tally, fits) for i, lines in enumerate(chosen)]
    return [edit for edit in edits if edit is not None], tally


Rewrite = Callable[[Edit, float, int, bool], tuple[str, int, float, float]]
"""(edit, strength, seed, keep) -> (the engine's text, steps run, wall ms, the engine's own ms)."""


@dataclass(frozen=True)
class Engine:
    """The loaded engine, as the benchmark uses it."""

    rewrite: Rewrite
    fits: Fits
    instruct: bool
    """A chat-layout model: its answers are unwrapped before post-processing."""
    about: dict[str, object]
    """What the JSON says about the model."""


def load_engine(model_dir: Path, device: str, steps: int, threads: int, instruction: str) -> Engine:
    """The engine's ``run_infill`` on the model loaded on ``device`` (float32 on a CPU, else the engine's dtype),
    with the rewrite request the language server would send (the model's canvas, ``steps`` 0: its own), and the
    engine's own check that a selection fits that canvas."""
    import torch

    from diffgemma_engine.errors import BadRequestError
    from diffgemma_engine.loading.model import load_model
    from diffgemma_engine.request.infill import check_request, run_infill, start_row
    from diffgemma_engine.shared import protocol

    torch.set_num_threads(threads)
    loaded = load_model(model_dir, device, "float32" if device == "cpu" else None)
    run_infill(loaded, protocol.Infill(id="warm-up", uri="", prefix="def f():\n", max_steps=2))

    def request(edit: Edit, strength: float, seed: int, keep: bool) -> protocol.Infill:
        return protocol.Infill(
            id=f"{edit.task_id}@{strength}",
            uri="file:///task.py",
            prefix=edit.prefix,
            suffix=edit.suffix,
            language_id="python",
            max_steps=steps,
            seed=seed,
            start=[protocol.StartSegment(text=edit.corrupted, keep=keep)],
            strength=strength,
            instruction=instruction,
        )

    def fits(text: str) -> bool:
        ask = protocol.Infill(id="fits", uri="", prefix="", start=[protocol.StartSegment(text=text)])
        try:
            start_row(loaded, ask, check_request(loaded, ask)[0])
        except BadRequestError:
            return False
        return True

    def rewrite(edit: Edit, strength: float, seed: int, keep: bool) -> tuple[str, int, float, float]:
        ask = request(edit, strength, seed, keep)
        started = time.perf_counter()
        text, _, timings = run_infill(loaded, ask)
        return text, timings.steps, (time.perf_counter() - started) * 1000, timings.total_ms

    about = {
        "model": str(model_dir.resolve()),
        "layout": loaded.layout.name.value,
        "device": str(loaded.device),
        "instruction": instruction,
        "canvas_length": loaded.canvas_length,
        "params": sum(p.numel() for p in loaded.model.parameters()),
    }
    return Engine(rewrite, fits, loaded.layout.name is protocol.Layout.CHAT, about)


@dataclass(frozen=True)
class Scoring:
    """How answers are scored: the test runs' timeout, and whether the engine's text is post-processed first."""

    timeout: float
    raw: bool = False
    """Score the engine's text as it is, no post-processing."""
    also_raw: bool = False
    """Also test the engine's text as it is, beside the post-processed edit (the paired measure)."""
    instruct: bool = False
    """The model answers in the chat layout: its answer is unwrapped first, as the language server does."""


def finish(edit: Edit, text: str, scoring: Scoring) -> str | None:
    """The text that replaces the line, as the language server's ``diffgemma.rewriteSelection`` computes it
    (``postprocess_replacement``), or the engine's text with ``raw``; None when nothing is left (the editor then
    gets no edit and the line stays as it was)."""
    if scoring.raw:
        return text
    return postprocess_replacement(edit.prefix, edit.corrupted, edit.suffix, text, "python", instruct=scoring.instruct)


def measure(edits: list[Edit], rewrite: Rewrite, strength: float, seed: int, scoring: Scoring, keep: bool = False):
    """One strength's figures over every edit (edit i seeded ``seed + i``)."""
    passed, raw_passed, unchanged, kept, restored, parses, suppressed = 0, 0, 0, 0, 0, 0, 0
    steps, wall, engine, samples, passed_ids = [], [], [], [], []
    only_processed: list[str] = []  # with also_raw: passes post-processed only, or raw only
    only_raw: list[str] = []
    by_kind: Counter[str] = Counter()
    for i, edit in enumerate(edits):
        text, ran, ms, engine_ms = rewrite(edit, strength, seed + i, keep)
        finished = finish(edit, text, scoring)
        suppressed += finished is None
        answer = edit.corrupted if finished is None else finished  # no edit: the line stays as it was
        program = edit.program(answer)
        ok = run_outcome(program, scoring.timeout) == PASS
        passed += ok
        by_kind[edit.kind] += ok
        if scoring.also_raw and not scoring.raw:
            raw_ok = run_outcome(edit.program(text), scoring.timeout) == PASS
            raw_passed += raw_ok
            if ok != raw_ok:
                (only_processed if ok else only_raw).append(edit.task_id)
        unchanged += finished is not None and answer.strip() == edit.corrupted.strip()
        kept += text.startswith(edit.corrupted)  # the engine's own text: what keep must hand back
        restored += answer.strip() == edit.line.strip()
        parses += compiles(program)
        steps.append(ran)
        wall.append(ms)
        engine.append(engine_ms)
        if ok:
            passed_ids.append(edit.task_id)
        if len(samples) < SAMPLES_KEPT:
            samples.append(
                {"task_id": edit.task_id, "corrupted": edit.corrupted, "text": text, "edit": finished, "passed": ok}
            )
    n = len(edits)
    kinds = Counter(edit.kind for edit in edits)
    return {
        "strength": strength,
        "keep": keep,
        "n_edits": n,
        "pass_at_1": passed / n,
        "passed": passed,
        "pass_at_1_by_kind": {kind: by_kind[kind] / kinds[kind] for kind in KINDS if kinds[kind]},
        "steps_per_edit": statistics.mean(steps),
        "ms_per_edit": statistics.mean(wall),
        "latency_ms_median": statistics.median(wall),
        "engine_ms_per_edit": statistics.mean(engine),
        "unchanged": unchanged / n,
        "starts_with_corrupted": kept / n,
        "restored": restored / n,
        "suppressed": suppressed / n,
        "parses": parses / n,
        "passed_task_ids": passed_ids,
        "samples": samples,
        **(
            {"raw_pass_at_1": raw_passed / n, "passed_only_processed": only_processed, "passed_only_raw": only_raw}
            if scoring.also_raw and not scoring.raw
            else {}
        ),
    }


def parse_args() -> argparse.Namespace:
    """The benchmark's command line."""
    from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA / SPLITS["single-line"], help="single-line tasks")
    parser.add_argument("--n", type=int, default=82, help="problems, spread evenly over the file (0: all)")
    parser.add_argument("--strengths", type=float, nargs="+", default=list(DEFAULT_STRENGTHS))
    parser.add_argument("--steps", type=int, default=0, help="max denoising steps (default: the model's)")
    parser.add_argument("--seed", type=int, default=0, help="picks the corruptions; edit i is rewritten with seed+i")
    parser.add_argument("--tries", type=int, default=8, help="candidates tested per kind before the next kind")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per test run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (float32 on a CPU, else the engine's dtype)")
    parser.add_argument("--instruction", default="", help="for a chat-layout checkpoint (FIM ones ignore it)")
    parser.add_argument("--raw", action="store_true", help="score the engine's text as is, no post-processing")
    parser.add_argument(
        "--also-raw", action="store_true", help="also test the engine's text as is: both pass@1 from the same answers"
    )
    parser.add_argument("--corrupt-only", action="store_true", help="choose and test the corruptions, no model")
    parser.add_argument("--json", type=Path, default=None, help="default: benchmarks/results/edit_eval.json")
    parser.add_argument("--plot", type=Path, default=None, help="default: the --json path with .png")
    return parser.parse_args()


def main() -> None:
    """Command-line entry point."""
    from benchmarks.machine import machine_report
    from benchmarks.plots import repair_by_strength

    args = parse_args()
    strengths = [s for s in args.strengths if s != BASELINE_STRENGTH] + [BASELINE_STRENGTH]
    if not all(0 < s <= 1 for s in strengths):
        raise SystemExit("--strengths must lie in (0, 1]")

    machine = machine_report()  # before the benchmark loads the machine
    started = time.perf_counter()
    engine = (
        None if args.corrupt_only else load_engine(args.model, args.device, args.steps, args.threads, args.instruction)
    )
    fits = engine.fits if engine is not None else None
    edits, tally = choose_edits(load_tasks(args.data), args.n or None, args.seed, args.tries, args.timeout, fits)
    if not edits:
        raise SystemExit(f"no corruption of {args.data} breaks its tests")
    figures: dict[str, object] = {
        "data": str(args.data),
        "seed": args.seed,
        "timeout_s": args.timeout,
        "n_edits": len(edits),
        "corruption": {"kinds": dict(Counter(e.kind for e in edits)), **asdict(tally)},
        "canvas_checked": fits is not None,
        "floor_pass_at_1": 0.0,  # the corrupted program as is: each failed its tests when it was chosen
        "edits": [
            {k: v for k, v in asdict(e).items() if k in ("task_id", "kind", "line_number", "line", "corrupted")}
            for e in edits
        ],
    }
    if engine is None:
        if args.json:
            write_report(args.json, figures, machine)
        else:
            print(json.dumps(figures, indent=2))
        return
    rewrite = engine.rewrite
    scoring = Scoring(args.timeout, raw=args.raw, also_raw=args.also_raw, instruct=engine.instruct)
    figures = {
        **engine.about,
        "threads": args.threads,
        "steps_asked": args.steps,
        "postprocessing": RAW if args.raw else POSTPROCESSED,
        **figures,
    }
    runs = []
    for strength in strengths:
        run = measure(edits, rewrite, strength, args.seed, scoring)
        runs.append(run)
        print(json.dumps({k: v for k, v in run.items() if k not in UNPRINTED}), flush=True)
    figures["runs"] = runs
    figures["baseline"] = runs[-1]["pass_at_1"]
    figures["keep_the_line"] = measure(edits, rewrite, BASELINE_STRENGTH, args.seed, scoring, keep=True)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    path = args.json or RESULTS / "edit_eval.json"
    plot_path = args.plot

    def plot(default: Path) -> None:
        repair_by_strength(plot_path or default, figures)

    write_report(path, figures, machine, plot, unprinted=("edits", "runs", "keep_the_line"))


if __name__ == "__main__":
    main()
