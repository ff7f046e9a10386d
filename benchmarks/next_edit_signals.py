"""Which signal of the model's own tells a real next edit from noise: the canvas's entropy, or the draws' agreement?

    python -m benchmarks.next_edit_signals --checkpoint DIR [--model DIR] [--repo PATH] [--n 40] [--seeds 8]
                                           [--json PATH]

Two sets of answers, each case asked as the language server asks (``next_edit_request``):

- **real edits**: ``--checkpoint``, a model that makes a known next edit (the tests' next-edit checkpoint,
  ``tests/support/models.py`` ``build_next_edit``: after ``width`` is renamed ``size``, its use follows), asked its
  own requests (with the rename in the edit history and without) over ``--seeds`` draws;
- **noise**: ``--model`` (default: the shipped model, trained to fill in code, never to edit it: every edit it
  suggests is noise, ``benchmarks/next_edit_eval.py`` finds none exact) asked ``--n`` cases of
  ``next_edit_eval`` (the commits of ``--repo``, default this checkout).

For each answer, one draw (seeded) gives its suggestion, the mean entropy of its canvas at the last step it ran
(the quantity the sampler's stopping rule reads) and whether the canvas settled (stable and sure by that rule)
before its schedule ended; a batch of two draws gives whether both write the same edit (``nextEditDraws`` 2).
Reported: for each set, the share of draws that suggest an edit, the entropy of those and the share that settled,
the share of cases that two agreeing draws keep; and for noise, the share that an entropy bound at the real edits'
highest would let through. Two small models: the figures say which signal to build on, not the release's rates.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

import attrs
import torch

from benchmarks.machine import machine_report
from benchmarks.next_edit_eval import ROOT, Asked, ask, draws, find_cases, git, suggestion_of
from benchmarks.report import RESULTS, write_report
from diffgemma_engine.canvas.compiled import DecoderStep
from diffgemma_engine.canvas.sampler import Scores
from diffgemma_engine.canvas.start import start_step
from diffgemma_engine.errors import EngineError
from diffgemma_engine.loading.model import DEFAULT_MODEL_DIR, LoadedModel, load_model
from diffgemma_engine.request.infill import check_request
from diffgemma_lsp.settings import Settings


class EntropyLog(DecoderStep):
    """The engine's eager step, keeping the mean entropy over the canvas of the last step it ran (row 0)."""

    last = float("nan")

    def eager(self, *args: torch.Tensor, **kwargs: object) -> Scores:  # type: ignore[override]
        scores = super().eager(*args, **kwargs)  # type: ignore[arg-type]
        self.last = float(scores.entropy[0].mean())
        return scores


def measure(loaded: LoadedModel, asked: Asked, seed: int) -> dict[str, object] | None:
    """One seeded draw's suggestion and last-step entropy, and whether two draws agree on an edit; None: refused."""
    log = EntropyLog(loaded.model)
    loaded.serving.step = log
    try:
        (one,) = draws(loaded, attrs.evolve(asked.request, candidates=1), seed)
        entropy = log.last  # the one draw's (the batch below runs the step again)
        two = draws(loaded, attrs.evolve(asked.request, candidates=2), seed)
    except EngineError:
        return None
    suggestion = suggestion_of(loaded, asked.window, [one])
    agreed = suggestion_of(loaded, asked.window, two)
    schedule = start_step(asked.request.strength, check_request(loaded, asked.request)[1])
    return {
        "edit": suggestion is not None,
        "entropy": entropy,
        "settled": one.timings.steps < schedule,
        "kept_by_two": agreed is not None,
    }


def checkpoint_requests(uri: str) -> list[Asked]:
    """The next-edit checkpoint's own requests (tests/support/next_edits.py), with their windows."""
    from diffgemma_lsp.document import LineDocument
    from diffgemma_lsp.features.next_edit import next_edit_request
    from tests.support.next_edits import FOLLOWED, RENAMED, next_edit_requests

    document = LineDocument(uri, RENAMED, version=2, language_id="python")
    asked = []
    for request in next_edit_requests(uri):
        built = next_edit_request(document, 0, Settings(), 0, request.extra, request.id)
        assert built is not None
        asked.append(Asked(window=built[0], request=request, expected=FOLLOWED))
    return asked


def summary(rows: list[dict[str, object]]) -> dict[str, object]:
    edits = [row for row in rows if row["edit"]]
    entropies = sorted(float(row["entropy"]) for row in edits)  # type: ignore[arg-type]
    return {
        "answers": len(rows),
        "edit_share": round(len(edits) / max(len(rows), 1), 3),
        "edit_entropy_median": statistics.median(entropies) if entropies else None,
        "edit_entropy_max": entropies[-1] if entropies else None,
        "edit_settled_share": round(sum(bool(row["settled"]) for row in edits) / max(len(edits), 1), 3),
        "kept_by_two_share": round(sum(bool(row["kept_by_two"]) for row in rows) / max(len(rows), 1), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a model that makes a known next edit")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="the model whose edits are noise")
    parser.add_argument("--repo", type=Path, default=ROOT, help="a git checkout (default: this one)")
    parser.add_argument("--n", type=int, default=40, help="noise cases")
    parser.add_argument("--seeds", type=int, default=8, help="draws of each real-edit request")
    parser.add_argument("--json", type=Path, default=RESULTS / "next_edit_signals.json")
    args = parser.parse_args()
    machine = machine_report()
    settings = Settings(next_edit_draws=1)

    real_model = load_model(args.checkpoint, "cpu", "float32")
    real = [
        row
        for asked in checkpoint_requests("file:///work/area.py")
        for seed in range(args.seeds)
        if (row := measure(real_model, asked, seed)) is not None
    ]
    noise_model = load_model(args.model, "cpu", "float32")
    found = find_cases(args.repo, 400)
    cases = random.Random(0).sample(found, min(args.n, len(found)))
    noise = [
        row
        for number, case in enumerate(cases)
        if (row := measure(noise_model, ask(case, settings, noise_model.canvas_length, number), number)) is not None
    ]
    real_summary, noise_summary = summary(real), summary(noise)
    bound = real_summary["edit_entropy_max"]
    noise_edits = [row for row in noise if row["edit"]]
    passing = [row for row in noise_edits if bound is not None and float(row["entropy"]) <= float(bound)]  # type: ignore[arg-type]
    figures: dict[str, object] = {
        "checkpoint": str(args.checkpoint),
        "model": str(args.model),
        "repo_head": git(args.repo, "rev-parse", "--short", "HEAD").strip(),
        "real": real_summary,
        "noise": noise_summary,
        "noise_edits_within_real_entropy": round(len(passing) / max(len(noise_edits), 1), 3),
        "real_rows": real,
        "noise_rows": noise,
    }

    def plot(path: Path) -> None:
        from benchmarks.plots import grouped_bars

        shares = {
            name: [100 * float(part["edit_share"]), 100 * float(part["kept_by_two_share"])]  # type: ignore[arg-type]
            for name, part in (("real edits", real_summary), ("noise", noise_summary))
        }
        grouped_bars(
            path, "Next edits: suggested by one draw, and by two that agree", ["one draw", "two agree"], shares, "%"
        )

    write_report(args.json, figures, machine, plot, unprinted=("real_rows", "noise_rows"))


if __name__ == "__main__":
    main()
