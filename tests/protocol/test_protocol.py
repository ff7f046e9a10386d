"""Wire messages round-trip, frames are checked, and the language server never imports torch."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diffgemma_engine.shared import frames, protocol

MESSAGES = [
    protocol.Hello(protocol=1, client="test", pid=42),
    protocol.HelloOk(protocol=1, model_id="m", ready=False, device="cpu", canvas_length=32, max_prompt_tokens=1024),
    protocol.Ready(model_id="m", device="cuda:0", load_ms=12.5),
    protocol.Infill(
        id="7",
        uri="file:///a.py",
        prefix="def f(",
        suffix=")\n",
        language_id="python",
        extra=[protocol.Chunk(filename="b.py", text="x = 1")],
        doc_version=3,
        canvas_length=64,
        max_steps=8,
        deadline_ms=500,
        seed=1,
    ),
    protocol.Cancel(id="7"),
    protocol.Result(
        id="7",
        text="a, b",
        stop=protocol.StopReason.EOS,
        timings=protocol.Timings(
            queue_ms=1.0,
            encode_ms=2.0,
            denoise_ms=3.0,
            steps=4,
            prompt_tokens=5,
            new_tokens=6,
            cached_tokens=7,
        ),
    ),
    protocol.Error(code=protocol.ErrorCode.BUSY, message="full", id="7"),
    protocol.Error(code=protocol.ErrorCode.BAD_REQUEST, message="bad frame"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message: protocol.Message) -> None:
    frame = frames.encode(message)
    (length,) = frames.HEADER.unpack(frame[:4])
    assert length == len(frame) - 4
    assert json.loads(frame[4:])["type"] == message.TYPE
    assert frames.decode(frame[4:]) == message


async def _read(data: bytes) -> protocol.Message:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return await frames.read_message(reader)


async def test_read_message_reads_one_frame_at_a_time() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"".join(frames.encode(m) for m in MESSAGES[:3]))
    reader.feed_eof()
    assert [await frames.read_message(reader) for _ in range(3)] == MESSAGES[:3]
    with pytest.raises(asyncio.IncompleteReadError):
        await frames.read_message(reader)


async def test_oversized_frame_is_skipped_and_the_next_frame_read() -> None:
    size = frames.MAX_FRAME_BYTES + 10
    reader = asyncio.StreamReader(limit=2**26)
    reader.feed_data(frames.HEADER.pack(size) + b"z" * size + frames.encode(MESSAGES[4]))
    reader.feed_eof()
    with pytest.raises(frames.ProtocolError) as caught:
        await frames.read_message(reader)
    assert caught.value.code is protocol.ErrorCode.TOO_LARGE and not caught.value.fatal
    assert await frames.read_message(reader) == MESSAGES[4]


async def test_absurd_frame_length_is_fatal() -> None:
    with pytest.raises(frames.ProtocolError) as caught:
        await _read(frames.HEADER.pack(2**32 - 1))
    assert caught.value.fatal


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        (b"\xff\xfe\xfd", protocol.ErrorCode.BAD_REQUEST, "UTF-8"),
        (b"{", protocol.ErrorCode.BAD_REQUEST, "JSON"),
        (b'"hello"', protocol.ErrorCode.BAD_REQUEST, "object"),
        (b"[" * 100_000, protocol.ErrorCode.BAD_REQUEST, "nested too deeply"),
        (b'{"type": "nope"}', protocol.ErrorCode.UNKNOWN_TYPE, "unknown message type"),
        (b'{"type": "cancel"}', protocol.ErrorCode.BAD_REQUEST, "$.id"),
        (
            b'{"type": "infill", "id": "1", "uri": "u", "prefix": 3}',
            protocol.ErrorCode.BAD_REQUEST,
            "$.prefix",
        ),
        (
            b'{"type": "infill", "id": "1", "uri": "u", "prefix": "", "max_steps": "8"}',
            protocol.ErrorCode.BAD_REQUEST,
            "$.max_steps",
        ),
        (
            b'{"type": "infill", "id": "1", "uri": "u", "prefix": "", "seed": true}',
            protocol.ErrorCode.BAD_REQUEST,
            "$.seed",
        ),
        (  # beyond what torch.Generator.manual_seed takes: an internal error before, bad_request now
            b'{"type": "infill", "id": "1", "uri": "u", "prefix": "", "seed": 18446744073709551616}',
            protocol.ErrorCode.BAD_REQUEST,
            "seed must be from",
        ),
        (
            b'{"type": "infill", "id": "1", "uri": "u", "prefix": "", "deadline_ms": 1000000000000000000000000}',
            protocol.ErrorCode.BAD_REQUEST,
            "deadline_ms must be from 0 to 3600000",
        ),
        (
            b'{"type": "infill", "id": "1", "uri": "u", "prefix": "", "deadline_ms": -1}',
            protocol.ErrorCode.BAD_REQUEST,
            "deadline_ms must be from 0",
        ),
    ],
)
def test_bad_frames_say_what_is_wrong(body: bytes, code: protocol.ErrorCode, words: str) -> None:
    with pytest.raises(frames.ProtocolError) as caught:
        frames.decode(body)
    assert caught.value.code is code
    assert words in str(caught.value)


def test_request_id_is_kept_on_errors_when_readable() -> None:
    with pytest.raises(frames.ProtocolError) as caught:
        frames.decode(b'{"type": "infill", "id": "abc"}')
    assert caught.value.to_error().id == "abc"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_decode_never_fails_any_other_way(body: bytes) -> None:
    try:
        frames.decode(body)
    except frames.ProtocolError as exc:
        assert exc.code in protocol.ErrorCode


@settings(max_examples=100, deadline=None)
@given(st.text(), st.text(), st.integers(min_value=0, max_value=2**31))
def test_any_text_round_trips(prefix: str, suffix: str, version: int) -> None:
    message = protocol.Infill(id="1", uri="file:///x", prefix=prefix, suffix=suffix, doc_version=version)
    assert frames.decode(frames.encode(message)[4:]) == message


def test_language_server_does_not_import_torch() -> None:
    code = (
        "import sys, diffgemma_lsp.server, diffgemma_lsp.__main__, diffgemma_engine.shared.protocol; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("state", list(protocol.StepState))
def test_a_step_report_is_typed_and_spelled_as_before(state: protocol.StepState) -> None:
    """Issue 28: ``Stats.compiled`` is a :class:`StepState` with its reason, spelled on the wire as the one string
    the engine sent before it was typed (``loop failed: RuntimeError: ...``), so the wire stays compatible."""
    reason = "RuntimeError: no C++ compiler found" if state.value.endswith("failed") else ""
    report = protocol.StepReport(state, reason)
    stats = protocol.Stats(id="s", model_id="m", device="cpu", ready=True, uptime_s=1, connections=1, queued=0)
    frame = frames.encode(attrs.evolve(stats, compiled=report))
    assert json.loads(frame[frames.HEADER.size :])["compiled"] == (
        f"{state.value}: {reason}" if reason else state.value
    )
    decoded = frames.decode(frame[frames.HEADER.size :])
    assert isinstance(decoded, protocol.Stats) and decoded.compiled == report


def test_unknown_enum_values_are_refused_when_read() -> None:
    """A scope, a layout or a step state the wire does not know is a ``bad_request`` naming the field."""
    for tag, field, extra in (
        ("infill", "scope", {"id": "1", "uri": "u", "prefix": ""}),
        ("hello_ok", "layout", {"protocol": 1, "model_id": "m", "ready": True}),
        (
            "stats",
            "compiled",
            {
                "id": "s",
                "model_id": "m",
                "device": "cpu",
                "ready": True,
                "uptime_s": 1.0,
                "connections": 0,
                "queued": 0,
            },
        ),
    ):
        body = json.dumps({"type": tag, **extra, field: "turbo"}).encode()
        with pytest.raises(frames.ProtocolError, match=field) as refused:
            frames.decode(body)
        assert refused.value.code is protocol.ErrorCode.BAD_REQUEST
