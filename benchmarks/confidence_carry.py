"""What carrying the model's confidence through post-processing costs a suggestion.

    python -m benchmarks.confidence_carry [--limit 300] [--repeat 5] [--json PATH]

``postprocess`` hands one confidence per character through every step that cuts or rewrites the answer
(``postprocess.confidence.carry``: a ``difflib`` alignment wherever a step changed the text), and the language server
asks for it with every answer that has one, whatever ``minConfidence`` is. This times ``postprocess`` on the same
answers with and without the confidences, in-process, best of ``--repeat``: the answers are HumanEval-infilling
single-line tasks' canonical lines (evaluation only) followed by the first lines of their suffix (what an answer that
runs on looks like, so that the filters cut it and the carry has work to do), each also with its indentation off by
two spaces (the indentation fitted).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.confidence_signals import tasks
from benchmarks.machine import machine_report
from benchmarks.report import RESULTS, write_report
from diffgemma_lsp.postprocess import postprocess

Answer = tuple[str, str, str]
"""(prefix, suffix, the model's raw answer)."""


def answers(limit: int) -> list[Answer]:
    out = []
    for task in tasks(limit):
        prefix, suffix, line = task["prompt"], task["suffix"], task["canonical_solution"]
        runs_on = line + "".join(suffix.splitlines(keepends=True)[:3])
        out += [(prefix, suffix, runs_on), (prefix, suffix, "  " + runs_on.replace("\n", "\n  "))]
    return out


def per_call_us(run: Callable[[], object], calls: int, repeat: int) -> float:
    """The best of ``repeat`` timings of ``run``, per call of the ``calls`` it makes, in microseconds."""
    best = min(_timed(run) for _ in range(repeat))
    return round(best / calls * 1e6, 1)


def _timed(run: Callable[[], object]) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=300, help="single-line tasks (each with its mid-line variant)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=RESULTS / "confidence_carry.json")
    args = parser.parse_args()
    machine = machine_report()
    cases = answers(args.limit)
    scored = [(prefix, suffix, raw, tuple(0.5 for _ in raw)) for prefix, suffix, raw in cases]

    def without() -> None:
        for prefix, suffix, raw, _ in scored:
            postprocess(prefix, suffix, raw, "python")

    def carried() -> None:
        for prefix, suffix, raw, confidence in scored:
            postprocess(prefix, suffix, raw, "python", confidence=confidence)

    plain = per_call_us(without, len(cases), args.repeat)
    with_confidence = per_call_us(carried, len(cases), args.repeat)
    lengths = [len(raw) for _, _, raw in cases]
    figures = {
        "answers": len(cases),
        "answer_chars_median": statistics.median(lengths),
        "postprocess_us": plain,
        "postprocess_with_confidence_us": with_confidence,
        "carry_us": round(with_confidence - plain, 1),
        "carry_share": round((with_confidence - plain) / plain, 3),
    }
    write_report(args.json, figures, machine)


if __name__ == "__main__":
    main()
