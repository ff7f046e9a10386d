"""How a benchmark writes its figures: the JSON file (with the machine report beside the figures), the figures
printed, the plot; the ``--step`` argument of the scripts that drive the engine, and the arguments of those that
replay a repository's commits."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Collection
from pathlib import Path

from diffgemma_engine.shared.serve_options import STEP_MODES, StepMode

RESULTS = Path(__file__).resolve().parent / "results"
"""Where a benchmark writes by default (``--out``)."""
STEP_HELP = "the engine's serve --step (default eager); the measurement starts once compiling has ended"


def add_step_argument(
    parser: argparse.ArgumentParser, help_text: str = STEP_HELP, choices: tuple[str, ...] = STEP_MODES
) -> None:
    """``--step`` (the engine's ``serve --step`` choices, or those of them given; default eager): how the engine's
    step runs for the measurement."""
    parser.add_argument("--step", choices=choices, default=StepMode.EAGER.value, help=help_text)


def add_commit_walk_arguments(parser: argparse.ArgumentParser, repo: Path | None, commits: int) -> None:
    """The arguments of a benchmark that replays the last commits of a repository on a model: ``--repo`` (``repo``
    by default; None: required), ``--commits`` (``commits`` by default), ``--seed``, ``--model``, ``--device``."""
    from diffgemma_engine.loading.model import DEFAULT_MODEL_DIR

    if repo is None:
        parser.add_argument("--repo", type=Path, required=True, help="a git checkout or bare repository")
    else:
        parser.add_argument("--repo", type=Path, default=repo, help="a git checkout (default: %(default)s)")
    parser.add_argument("--commits", type=int, default=commits, help="the newest commits read")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--device", default="cpu")


def write_json(path: Path, figures: dict[str, object]) -> None:
    """``figures`` as indented JSON at ``path``, its folder made if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2) + "\n")


def write_report(
    path: Path,
    figures: dict[str, object],
    machine: dict[str, object],
    plot: Callable[[Path], None] | None = None,
    unprinted: Collection[str] = (),
) -> None:
    """Write ``figures`` to ``path`` with ``machine`` (``benchmarks.machine.machine_report``, best taken before the run)
    under ``"machine"``, print them (less the ``unprinted`` keys: long sample lists), then ``plot`` the PNG beside
    the JSON (``path`` with ``.png``)."""
    figures["machine"] = machine
    write_json(path, figures)
    print(json.dumps({key: value for key, value in figures.items() if key not in unprinted}, indent=2))
    if plot is not None:
        plot(path.with_suffix(".png"))
