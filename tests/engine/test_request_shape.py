"""The canvas and step count a request gets: the model's own, a shorter canvas for the rest of a line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from diffgemma_engine.loading.model import DEFAULT_MODEL_DIR, HINTS_FILE
from diffgemma_engine.request.infill import check_request
from diffgemma_engine.shared import frames, protocol


def _model(line_canvas: int | None) -> SimpleNamespace:
    return SimpleNamespace(canvas_length=32, line_canvas_length=line_canvas, sampler=SimpleNamespace(max_steps=16))


def _request(**fields: object) -> protocol.Infill:
    return protocol.Infill(id="1", uri="u", prefix="x", **fields)


def test_the_rest_of_a_line_gets_the_short_canvas_and_proportionally_fewer_steps() -> None:
    model = _model(16)
    assert check_request(model, _request(scope="line")) == (16, 8)
    assert check_request(model, _request(scope="block")) == (32, 16)
    assert check_request(model, _request()) == (32, 16)


def test_explicit_values_win() -> None:
    model = _model(16)
    assert check_request(model, _request(scope="line", canvas_length=24)) == (24, 12)
    assert check_request(model, _request(scope="line", max_steps=3)) == (16, 3)
    assert check_request(model, _request(canvas_length=64)) == (64, 16)  # longer: the model's step count


def test_a_model_without_the_hint_keeps_its_canvas() -> None:
    assert check_request(_model(None), _request(scope="line")) == (32, 16)
    assert check_request(_model(64), _request(scope="line")) == (32, 16)  # never longer than the model's


def test_unknown_scope_is_refused() -> None:
    """``Infill.scope`` is an enum: an unknown value is refused with ``bad_request`` naming the field when the frame
    is read, before any request reaches the model."""
    frame = frames.encode(_request())[frames.HEADER.size :]
    body = json.loads(frame)
    body["scope"] = "file"
    with pytest.raises(frames.ProtocolError, match="scope") as refused:
        frames.decode(json.dumps(body).encode())
    assert refused.value.code is protocol.ErrorCode.BAD_REQUEST
    with pytest.raises(ValueError, match="file"):
        _request(scope="file")


def test_the_shipped_model_has_the_hint() -> None:
    hints = json.loads((DEFAULT_MODEL_DIR / HINTS_FILE).read_text())
    assert hints["line_canvas_length"] == 16


def test_every_seed_the_wire_accepts_is_one_torch_takes() -> None:
    """``protocol.SEED_RANGE`` is ``torch.Generator.manual_seed``'s: its ends seed a generator, one past them fails
    there (so the wire refuses it as ``bad_request`` rather than the model thread as ``internal``)."""
    import torch

    low, high = protocol.SEED_RANGE
    for seed in (low, -1, 0, high):
        torch.Generator().manual_seed(_request(seed=seed).seed or 0)
    for seed in (low - 1, high + 1):
        with pytest.raises((RuntimeError, ValueError)):
            torch.Generator().manual_seed(seed)
        with pytest.raises(ValueError, match="seed must be from"):
            _request(seed=seed)
