"""Typing into shown suggestions, replayed from real commits: refine-as-you-type against discard-and-ask-again.

    python -m benchmarks.typing_replay --repo PATH [--lines 20] [--commits 300] [--seed 0] [--model DIR]
                                       [--refine-steps 1,2,4] [--device cpu] [--json PATH]

The typing is the lines real commits add to Python files of a git repository (``--repo``; the figures in
benchmarks/README.md use one nobody here wrote): a line of 12 to 80 characters, in the file as the commit left it,
typed character by character from its indentation on. Before the first character the user asks for a completion;
after each keystroke the language server's own code decides what is on screen:

- the rest of the shown suggestion when the user typed what it starts with (``diffgemma_lsp.reuse``, no model call);
- otherwise, with ``discard``, a new completion at the cursor from noise (the whole schedule);
- otherwise, with ``refine-N``, the shown suggestion refined (``diffgemma_lsp.refine``: the canvas starts from it
  where it was offered, the typed characters held, ``N`` steps run); a refine that leaves nothing after the typed
  text (``refine_empty``) is followed at once by a new completion at the cursor, as the server does, its steps
  added to the keystroke's wait.

Each request is served in-process by the engine's ``run_infill`` (seeded), its answer post-processed as the server
does. Per policy, over the keystrokes typed while a suggestion was on screen:

- ``in_time``: the share after which a suggestion consistent with the typed text (the reused rest, or an answer
  computed for it) is on screen within 50 ms of the model's step time: the steps it took, at ``step_ms`` each, at
  most ``step_ms + 50`` ms (a reuse takes none). ``step_ms`` is ``--step-ms``, by default the median time per step
  of this run's completions; the wait is counted in steps, not in the milliseconds measured, so that a machine
  shared with other work gives the same share (the prompt's encoding, mostly reused from the keystroke before by
  the engine's prefix cache, is left out);
- ``steps_per_keystroke``: engine steps spent, refines included;
- ``chars_before_typed``: the share of the typed lines' characters the suggestion on screen showed, at their place,
  before they were typed.

Writes ``benchmarks/results/typing_replay.json`` and a bar chart beside it.
"""

from __future__ import annotations

import argparse
import difflib
import random
import statistics
import zlib
from collections.abc import Callable
from pathlib import Path

import attrs

from benchmarks.keystroke_replay import percentile
from benchmarks.machine import machine_report
from benchmarks.next_edit_eval import changed_python_files, git
from benchmarks.report import RESULTS, add_commit_walk_arguments, write_report
from diffgemma_engine.errors import EngineError
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.infill import Answer, run_infill
from diffgemma_engine.shared import protocol
from diffgemma_lsp.postprocess import postprocess
from diffgemma_lsp.refine import diverged, refine_request, refined_answer
from diffgemma_lsp.reuse import ShownCompletions
from diffgemma_lsp.settings import Settings

URI = "file:///repo/typed.py"
LINE_CHARS = (12, 80)
BUDGET_MS = 50.0
"""What ``in_time`` allows beyond one model step."""
OTHER_STEP_MS = (8.2, 80.0)
"""``in_time`` is also given at these step times: the shipped model's step on 2 quiet CPU cores (benchmarks/README.md,
session 3) and the release's on an H100 (70-90 ms, ``gpu_shape.py``)."""


@attrs.frozen
class Line:
    """A line a commit added: the file as the commit left it, around the line's typed part."""

    commit: str
    path: str
    prefix: str
    """The file up to the line, and the line's indentation."""
    typed: str
    """What the user types: the line after its indentation."""
    suffix: str
    """The line's end and the rest of the file."""


def find_lines(repo: Path, commits: int) -> list[Line]:
    """Every added line of 12 to 80 characters (comments aside) in the Python files of the last ``commits`` commits
    (merges left out)."""
    found = []
    for commit, path, before, after in changed_python_files(repo, commits):
        matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
        for tag, _, _, j1, j2 in matcher.get_opcodes():
            for index in range(j1, j2) if tag in ("insert", "replace") else ():
                line = after[index].rstrip("\n")
                content = line.lstrip()
                if LINE_CHARS[0] <= len(content) <= LINE_CHARS[1] and not content.startswith("#"):
                    indent = line[: len(line) - len(content)]
                    prefix = "".join(after[:index]) + indent
                    suffix = after[index][len(line) :] + "".join(after[index + 1 :])
                    found.append(Line(commit[:12], path, prefix, content, suffix))
    return found


@attrs.define
class Tally:
    """One policy's figures over the keystrokes typed while a suggestion was on screen."""

    keystrokes: int = 0
    in_time: int = 0
    steps: int = 0
    predicted: int = 0
    typed: int = 0
    reused: int = 0
    refined: int = 0
    empty: int = 0
    asked: int = 0
    ms: list[float] = attrs.field(factory=list)
    """The engine's time for each suggestion asked (refine or completion), for ``in_time``."""
    waits: list[int] = attrs.field(factory=list)
    """Per keystroke inside a suggestion: the steps until a consistent suggestion was on screen (0: reused; -1:
    none)."""


def engine_ms(answer: Answer) -> float:
    timings = answer.timings
    return timings.tokenize_ms + timings.encode_ms + timings.denoise_ms


class Replay:
    """The engine in-process, asked as the language server asks it."""

    def __init__(self, loaded: LoadedModel, settings: Settings) -> None:
        self.loaded = loaded
        self.settings = settings
        self.step_ms: list[float] = []

    def run(self, request: protocol.Infill, number: int) -> Answer | None:
        try:
            answer = run_infill(self.loaded, attrs.evolve(request, seed=number))
        except EngineError:
            return None
        if answer.timings.steps and not request.start:
            self.step_ms.append(answer.timings.denoise_ms / answer.timings.steps)
        return answer

    def insertion(self, prefix: str, suffix: str) -> protocol.Infill:
        return protocol.Infill(
            id="t",
            uri=URI,
            prefix=prefix,
            suffix=suffix,
            language_id="python",
            max_steps=self.settings.steps,
            scope=protocol.cursor_scope(prefix),
        )

    def complete(self, prefix: str, suffix: str, number: int) -> tuple[str | None, Answer | None]:
        """A new completion at the cursor: what it shows after post-processing, and the engine's answer."""
        request = self.insertion(prefix, suffix)
        answer = self.run(request, number)
        if answer is None or not answer.text:
            return None, answer
        edit = postprocess(prefix, suffix, answer.text, "python")
        return (edit.text if edit is not None else None), answer


def replay_line(replay: Replay, line: Line, refine_steps: int, first: str | None, number: int, tally: Tally) -> None:
    """Type ``line`` with ``first`` shown before its first character; ``refine_steps`` 0 is discard-and-ask."""
    shown = ShownCompletions()
    if first:
        shown.remember(URI, line.prefix + line.suffix, len(line.prefix), first)
    on_screen = first
    for count in range(1, len(line.typed) + 1):
        tally.typed += 1
        if on_screen and on_screen[0] == line.typed[count - 1]:
            tally.predicted += 1
        inside = bool(on_screen)
        source = line.prefix + line.typed[:count] + line.suffix
        cursor = len(line.prefix) + count
        seed = zlib.crc32(f"{number}:{count}".encode())
        steps, rest = keystroke(replay, shown, source, cursor, refine_steps, seed, tally)
        if inside:
            tally.keystrokes += 1
            tally.steps += steps
            tally.waits.append(steps if rest else -1)
        if rest:
            shown.remember(URI, source, cursor, rest)
        else:
            shown.forget(URI)
        on_screen = rest


def keystroke(
    replay: Replay, shown: ShownCompletions, source: str, cursor: int, refine_steps: int, seed: int, tally: Tally
) -> tuple[int, str | None]:
    """(steps spent, the suggestion after the cursor) after one keystroke."""
    if (kept := shown.lookup(URI, source, cursor)) is not None:
        tally.reused += 1
        return 0, kept.text
    prefix, suffix = source[:cursor], source[cursor:]
    last = shown.last(URI)
    spent = 0
    if refine_steps and last is not None:
        divergence = diverged(last, source, cursor)
        if divergence is not None:
            request = refine_request(replay.insertion(prefix, suffix), divergence, refine_steps)
            answer = replay.run(request, seed)
            if answer is None:
                return 0, None
            tally.asked += 1
            tally.ms.append(engine_ms(answer))
            rest = refined_answer(divergence, request, answer.text) if answer.text else None
            tally.refined += rest is not None
            tally.empty += rest is None
            if rest is not None:
                return answer.timings.steps, rest
            spent = answer.timings.steps  # the refine kept nothing: the server asks a completion at once
    rest, answer = replay.complete(prefix, suffix, seed)
    if answer is None:
        return 0, None
    tally.asked += 1
    tally.ms.append(engine_ms(answer))
    return spent + answer.timings.steps, rest


def in_time(tally: Tally, step_ms: float) -> float:
    """The share of keystrokes inside a suggestion after which one consistent with the typed text was on screen
    within ``step_ms + BUDGET_MS``, its steps at ``step_ms`` each."""
    limit = step_ms + BUDGET_MS
    return round(sum(1 for steps in tally.waits if 0 <= steps * step_ms <= limit) / max(tally.keystrokes, 1), 3)


def summarize(tally: Tally, step_ms: float) -> dict[str, object]:
    inside = max(tally.keystrokes, 1)
    return {
        "keystrokes_inside_a_suggestion": tally.keystrokes,
        "in_time": in_time(tally, step_ms),
        "in_time_at_step_ms": {str(other): in_time(tally, other) for other in OTHER_STEP_MS},
        "waits_in_steps": {str(steps): tally.waits.count(steps) for steps in sorted(set(tally.waits))},
        "steps_per_keystroke": round(tally.steps / inside, 2),
        "chars_before_typed": round(tally.predicted / max(tally.typed, 1), 3),
        "reused": tally.reused,
        "refined": tally.refined,
        "refine_empty": tally.empty,
        "requests": tally.asked,
        "request_ms_p50": round(percentile(tally.ms, 0.5), 1) if tally.ms else 0.0,
        "request_ms_p95": round(percentile(tally.ms, 0.95), 1) if tally.ms else 0.0,
    }


def policy_name(steps: int) -> str:
    return f"refine-{steps}" if steps else "discard"


def run_policies(
    replay: Replay, lines: list[Line], policies: list[int], step_ms: float | None, progress: Callable[[str], None]
) -> dict[str, object]:
    """Each policy over ``lines``, from the same first suggestion per line; ``step_ms`` None: this run's median."""
    tallies = {steps: Tally() for steps in policies}
    for number, line in enumerate(lines):
        first, _ = replay.complete(line.prefix, line.suffix, number)
        for steps in policies:
            replay_line(replay, line, steps, first, number, tallies[steps])
        progress(f"line {number + 1}/{len(lines)}: {line.path}@{line.commit}")
    if step_ms is None:
        step_ms = statistics.median(replay.step_ms) if replay.step_ms else 0.0
    return {
        "step_ms": round(step_ms, 2),
        "policies": {policy_name(steps): summarize(tallies[steps], step_ms) for steps in policies},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    add_commit_walk_arguments(parser, None, commits=300)
    parser.add_argument("--lines", type=int, default=20, help="added lines typed")
    parser.add_argument("--refine-steps", default="1,2,4", help="the refine step counts compared with discard")
    parser.add_argument("--step-ms", type=float, default=None, help="a step's time (default: this run's median)")
    parser.add_argument("--json", type=Path, default=RESULTS / "typing_replay.json")
    args = parser.parse_args()
    machine = machine_report()
    found = find_lines(args.repo, args.commits)
    lines = random.Random(args.seed).sample(found, min(args.lines, len(found)))
    loaded = load_model(args.model, args.device, "float32" if args.device == "cpu" else None)
    policies = [0, *(int(steps) for steps in args.refine_steps.split(","))]
    replay = Replay(loaded, Settings())
    measured = run_policies(replay, lines, policies, args.step_ms, lambda text: print(text, flush=True))
    figures: dict[str, object] = {
        "model": str(args.model),
        "repo": str(args.repo),
        "repo_head": git(args.repo, "rev-parse", "--short", "HEAD").strip(),
        "lines_found": len(found),
        "lines": len(lines),
        "typed_chars": sum(len(line.typed) for line in lines),
        "seed": args.seed,
        "budget": f"step_ms + {BUDGET_MS:.0f} ms",
        **measured,
    }

    def plot(path: Path) -> None:
        from benchmarks.plots import grouped_bars

        policies_figures = measured["policies"]
        names = list(policies_figures)
        grouped_bars(
            path,
            "Typing into suggestions: refine against discard-and-ask",
            names,
            {
                "in time (share)": [policies_figures[name]["in_time"] for name in names],
                "steps per keystroke": [policies_figures[name]["steps_per_keystroke"] for name in names],
                "chars shown before typed (share)": [policies_figures[name]["chars_before_typed"] for name in names],
            },
            "",
        )

    write_report(args.json, figures, machine, plot)


if __name__ == "__main__":
    main()
