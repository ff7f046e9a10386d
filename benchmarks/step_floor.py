"""Where a checkpoint's answers fall apart as its schedule shortens: the release-format checkpoint that memorized one
answer (``tests/support/release_format.py``), asked for it with each step count over several seeds, through the
engine's own infill (the deadline's step budget picks a shorter schedule the same way).

``python -m tests.support.release_format /tmp/release-memorized --memorized`` builds the checkpoint, then
``python -m benchmarks.step_floor --model /tmp/release-memorized --steps 1 2 4 6 8 12 16 24 48 --seeds 8``. The
shipped model's side of the same question is ``benchmarks/infill_eval.py --steps ...`` (pass@1 and the share of
completions that parse). ``engine/canvas/clock.py`` ``default_min_steps`` is set from these figures
(``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.machine import machine_report
from benchmarks.report import RESULTS, write_report
from diffgemma_engine.loading.model import load_model
from diffgemma_engine.request.infill import run_infill
from diffgemma_engine.shared import protocol
from tests.support.release_format import ANSWERED_PREFIX, ANSWERED_SUFFIX, RAW_ANSWER


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the memorized release-format checkpoint")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8, 16, 48])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--json", type=Path, default=RESULTS / "step_floor.json")
    args = parser.parse_args()
    machine = machine_report()
    loaded = load_model(args.model)
    rows = []
    for steps in args.steps:
        kept, ran = 0, 0
        for seed in range(args.seeds):
            request = protocol.Infill(
                id=f"{steps}-{seed}",
                uri="file:///add.py",
                prefix=ANSWERED_PREFIX,
                suffix=ANSWERED_SUFFIX,
                language_id="python",
                max_steps=steps,
                seed=seed,
            )
            text, _, timings = run_infill(loaded, request)
            kept += text == RAW_ANSWER
            ran += timings.steps
        rows.append({"max_steps": steps, "answer_kept": kept, "seeds": args.seeds, "mean_steps_run": ran / args.seeds})
        print(rows[-1], flush=True)
    figures: dict[str, object] = {
        "model": str(args.model),
        "schedule": loaded.sampler.max_steps,
        "expected": RAW_ANSWER,
        "rows": rows,
    }
    write_report(args.json, figures, machine)


if __name__ == "__main__":
    main()
