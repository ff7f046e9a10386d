"""``benchmarks.next_edit_signals``: the next-edit checkpoint's real edit against the shipped model's noise, on a
repository made here; the run writes each set's share of edits, their entropy, and what two agreeing draws keep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.benchmarks.test_next_edit_eval import REPO, _repository


def test_the_figures_set_the_checkpoints_real_edit_beside_the_shipped_models_noise(
    tmp_path: Path, next_edit_model_dir: Path
) -> None:
    out = tmp_path / "signals.json"
    command = [sys.executable, "-m", "benchmarks.next_edit_signals", "--checkpoint", str(next_edit_model_dir)]
    command += ["--repo", str(_repository(tmp_path / "repo")), "--n", "1", "--seeds", "2", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    real, noise = figures["real"], figures["noise"]
    assert real["answers"] == 4 and noise["answers"] == 1  # two requests, two seeds; one case
    assert real["edit_share"] == 1.0  # its seeded draws are the ones its build checked
    assert 0 < real["edit_entropy_max"] < 0.01
    assert [row["edit"] for row in figures["real_rows"]] == [True] * 4
    assert set(figures["noise_rows"][0]) == {"edit", "entropy", "settled", "kept_by_two"}
    assert 0.0 <= figures["noise_edits_within_real_entropy"] <= 1.0
    assert out.with_suffix(".png").is_file()
