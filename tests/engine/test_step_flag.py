"""``serve --step eager|compiled|captured``: one flag chooses how the denoising step runs (issue 28); the two
flags it replaced, and their variable, are retired and refused (issue 44)."""

from __future__ import annotations

import pytest

from diffgemma_engine.__main__ import build_parser, default_step, step_mode_of
from diffgemma_engine.shared.serve_options import STEP_MODES, StepMode


def _step(argv: list[str]) -> str:
    parser = build_parser()
    return step_mode_of(parser.parse_args(["serve", *argv]), parser)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "auto"),
        (["--step", "eager"], "eager"),
        (["--step", "compiled"], "compiled"),
        (["--step", "captured"], "captured"),
    ],
)
def test_the_step_flag(argv: list[str], expected: str, monkeypatch) -> None:
    monkeypatch.delenv("DIFFGEMMA_STEP", raising=False)
    monkeypatch.delenv("DIFFGEMMA_COMPILE", raising=False)
    assert _step(argv) == expected
    assert StepMode(expected).value in STEP_MODES


@pytest.mark.parametrize(
    "argv",
    [["--step", "fast"]],
)
def test_a_step_that_cannot_be_meant_is_refused_with_the_choices(argv: list[str], monkeypatch, capsys) -> None:
    monkeypatch.delenv("DIFFGEMMA_STEP", raising=False)
    with pytest.raises(SystemExit) as exited:
        _step(argv)
    assert exited.value.code == 2
    assert "--step" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["--compile", "on"], ["--compile", "off"], ["--loop", "captured"], ["--step", "compiled", "--compile", "on"]],
)
def test_the_retired_flags_are_refused(argv: list[str], monkeypatch, capsys) -> None:
    """Issue 44: ``--compile`` and ``--loop`` are gone (``--step`` says both), refused with the flag named."""
    monkeypatch.delenv("DIFFGEMMA_STEP", raising=False)
    with pytest.raises(SystemExit) as exited:
        _step(argv)
    assert exited.value.code == 2
    assert f"unrecognized arguments: {' '.join(argv[-2:])}" in capsys.readouterr().err


def test_the_retired_variable_is_refused_with_what_replaced_it(monkeypatch, capsys) -> None:
    monkeypatch.delenv("DIFFGEMMA_STEP", raising=False)
    monkeypatch.setenv("DIFFGEMMA_COMPILE", "on")
    assert default_step() == "auto"
    with pytest.raises(SystemExit) as exited:
        _step([])
    assert exited.value.code == 2
    assert "$DIFFGEMMA_COMPILE is retired: use $DIFFGEMMA_STEP=compiled" in capsys.readouterr().err


def test_the_environment_gives_the_default(monkeypatch, capsys) -> None:
    monkeypatch.delenv("DIFFGEMMA_STEP", raising=False)
    monkeypatch.delenv("DIFFGEMMA_COMPILE", raising=False)
    assert default_step() == "auto"
    assert _step([]) == "auto"
    monkeypatch.setenv("DIFFGEMMA_STEP", "captured")
    assert _step([]) == "captured"
    assert _step(["--step", "eager"]) == "eager"
    monkeypatch.setenv("DIFFGEMMA_STEP", "turbo")
    with pytest.raises(SystemExit):
        _step([])
    assert "must be one of auto, eager, compiled, captured, not 'turbo'" in capsys.readouterr().err


def test_auto_is_the_captured_step_on_a_gpu_and_the_eager_one_elsewhere() -> None:
    """The default (issue 27): CUDA graphs where they take the host out of the step; the eager loop serves until
    they are captured (or for good, when they cannot be: the worker reports why)."""
    assert StepMode.AUTO.on("cuda") is StepMode.CAPTURED
    assert StepMode.AUTO.on("cpu") is StepMode.EAGER
    assert StepMode.AUTO.on("mps") is StepMode.EAGER
    assert StepMode.COMPILED.on("cuda") is StepMode.COMPILED  # an explicit choice stays
    assert StepMode.EAGER.on("cuda") is StepMode.EAGER
