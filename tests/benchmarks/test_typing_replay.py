"""``benchmarks.typing_replay``: the lines a commit adds are what is typed, and each keystroke is decided by the
language server's own code (reuse, refine, or a new completion), served by the engine on the memorized checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.typing_replay import Line, Replay, Tally, find_lines, replay_line
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_lsp.settings import Settings
from tests.support.commits import two_commits
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

BEFORE = "def area(width, height):\n    return width * height\n"
AFTER = 'def area(width, height):\n    """The area of a rectangle."""\n    return width * height\n'


def _repository(folder: Path) -> Path:
    return two_commits(folder, "area.py", BEFORE, AFTER)


def test_an_added_line_is_typed_from_its_indentation_in_the_file_the_commit_left(tmp_path: Path) -> None:
    (line,) = find_lines(_repository(tmp_path / "repo"), commits=10)
    assert line.path == "area.py"
    assert line.prefix == "def area(width, height):\n    "
    assert line.typed == '"""The area of a rectangle."""'
    assert line.suffix == "\n    return width * height\n"


@pytest.fixture(scope="module")
def memorized(memorized_model_dir: Path) -> LoadedModel:
    return load_model(memorized_model_dir)


def test_a_keystroke_into_the_suggestion_reuses_it_and_a_divergent_one_is_refined(memorized: LoadedModel) -> None:
    """The memorized middle is shown; the user types it up to ``a`` and then ``-`` where it shows ``+``."""
    typed = MEMORIZED_MIDDLE[: MEMORIZED_MIDDLE.index("+")] + "-"
    line = Line("c", "add.py", MEMORIZED_PREFIX, typed, MEMORIZED_SUFFIX)
    replay = Replay(memorized, Settings())
    first, _ = replay.complete(line.prefix, line.suffix, 0)
    assert first == MEMORIZED_MIDDLE
    refine, discard = Tally(), Tally()
    replay_line(replay, line, 2, first, 0, refine)
    replay_line(replay, line, 0, first, 0, discard)
    for tally in (refine, discard):
        assert tally.reused == len(typed) - 1 and tally.keystrokes == len(typed)  # on screen until the "-"
        assert tally.predicted == len(typed) - 1  # each character but the last was shown before it was typed
        assert tally.asked == 1 and tally.waits[:-1] == [0] * (len(typed) - 1)
    assert refine.refined + refine.empty == 1 and 1 <= refine.steps <= 2  # refineSteps, no more
    assert discard.refined == 0 and discard.steps >= 1  # a new completion from noise
