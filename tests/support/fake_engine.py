"""Small asyncio servers of this user's that speak the real engine wire protocol, to play broken or recording
engines in tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import attrs

from diffgemma_engine.shared import frames, protocol

HELLO_OK = protocol.HelloOk(protocol=protocol.PROTOCOL_VERSION, model_id="fake", ready=True, layout="fim")
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], object]


@contextlib.asynccontextmanager
async def serving(path: Path, handler: Handler) -> AsyncIterator[list[int]]:
    """A Unix socket server running ``handler`` per connection; yields the list of connections made."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)  # type: ignore[misc]
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(handle, str(path))
    try:
        yield connections
    finally:
        server.close()


def answering_empty(received: list[protocol.Infill] | None = None) -> Handler:
    """A handler that shakes hands and answers every infill with an empty result, recording it in ``received``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await frames.read_message(reader)  # the client's hello
        writer.write(frames.encode(HELLO_OK))
        while True:
            message = await frames.read_message(reader)
            if isinstance(message, protocol.Infill):
                if received is not None:
                    received.append(message)
                writer.write(frames.encode(protocol.Result(id=message.id, text="", stop=protocol.StopReason.EOS)))
            await writer.drain()

    return handle


class Rewrites:
    """What a fake engine that rewrites was sent, and the hold on its answers to rewrites."""

    def __init__(self, answer: str, features: tuple[str, ...] = (protocol.REWRITE_FEATURE,)) -> None:
        self.answer = answer
        """The text every rewrite is answered with (completions get "")."""
        self.alternatives: list[str] = []
        """The other draws' texts that differ from ``answer``, as the engine answers a request of several
        candidates (as many as the request has other candidates; none: every draw wrote ``answer``)."""
        self.features = list(features)
        """What the handshake lists (none: an engine that predates rewrites)."""
        self.received: list[protocol.Infill] = []
        self.cancelled: list[str] = []
        """Ids of the requests the client sent a ``Cancel`` for."""
        self.release = asyncio.Event()
        """Rewrites are answered once this is set (set it at once for no hold)."""
        self.arrived = asyncio.Event()
        """Set when a rewrite arrives."""
        self.connections = 0
        """Clients that shook hands (a language server connects once it is initialized)."""
        self.superseded: set[int] = set()
        """Which rewrites (0 the first) are answered as superseded, with no text, as the engine answers a request
        that a newer one for the same document replaced."""
        self.completion_answer: str | None = None
        """None: completions are answered at once with ""; else they are held with the rewrites (until ``release``)
        and answered with this text."""
        self.stopped: list[tuple[str, protocol.StopReason]] = []
        """(id, why) of each request answered as cancelled or superseded before its answer."""

    def rewrites(self) -> list[protocol.Infill]:
        """The rewrites received (infills with ``start``), in order."""
        return [request for request in self.received if request.start]

    def handler(self, current: Callable[[], Rewrites] | None = None) -> Handler:
        """A connection handler: shakes hands, answers completions at once with "", and each rewrite, once
        ``release`` is set, with ``answer``; a ``Cancel`` answers its request as cancelled, and a request for a
        document supersedes the one held for it, as the engine does (it keeps one request per document and
        connection). ``current``: the ``Rewrites`` whose settings and records each message uses, when not this one
        (one fake engine, one connection, shared by a module's tests: each test's own ``Rewrites``)."""
        now = current or (lambda: self)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await frames.read_message(reader)
            writer.write(frames.encode(attrs.evolve(HELLO_OK, features=now().features)))
            now().connections += 1
            held: dict[str, asyncio.Task[None]] = {}
            held_for: dict[str, str] = {}
            """Per document uri, the id of the request held for it."""

            def stop(engine: Rewrites, request_id: str, why: protocol.StopReason) -> None:
                if (task := held.pop(request_id, None)) is not None and not task.done():
                    task.cancel()
                    engine.stopped.append((request_id, why))
                    writer.write(frames.encode(protocol.Result(id=request_id, text="", stop=why)))

            async def answer_later(engine: Rewrites, request: protocol.Infill) -> None:
                await engine.release.wait()
                if not request.start:
                    assert engine.completion_answer is not None
                    result = protocol.Result(id=request.id, text=engine.completion_answer, stop=protocol.StopReason.EOS)
                elif engine.rewrites().index(request) in engine.superseded:
                    result = protocol.Result(id=request.id, text="", stop=protocol.StopReason.SUPERSEDED)
                else:
                    result = protocol.Result(
                        id=request.id,
                        text=engine.answer,
                        stop=protocol.StopReason.EOS,
                        alternatives=engine.alternatives[: request.candidates - 1],
                    )
                writer.write(frames.encode(result))

            try:
                while True:
                    message = await frames.read_message(reader)
                    engine = now()
                    if isinstance(message, protocol.Cancel):
                        engine.cancelled.append(message.id)
                        stop(engine, message.id, protocol.StopReason.CANCELLED)
                    elif isinstance(message, protocol.Infill):
                        engine.received.append(message)
                        if (previous := held_for.get(message.uri)) is not None:
                            stop(engine, previous, protocol.StopReason.SUPERSEDED)
                        if message.start or engine.completion_answer is not None:
                            held[message.id] = asyncio.ensure_future(answer_later(engine, message))
                            held_for[message.uri] = message.id
                            engine.arrived.set()
                        else:
                            result = protocol.Result(id=message.id, text="", stop=protocol.StopReason.EOS)
                            writer.write(frames.encode(result))
                    await writer.drain()
            finally:
                for task in held.values():
                    task.cancel()

        return handle


def relaying(target: Path, sent: list[protocol.Message]) -> Handler:
    """A handler that passes every message on to the engine listening on ``target``, and its answers back,
    recording in ``sent`` each message the client sent (a tap on a real engine's socket)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        engine_reader, engine_writer = await asyncio.open_unix_connection(str(target), limit=frames.MAX_FRAME_BYTES)

        async def answers() -> None:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    writer.write(frames.encode(await frames.read_message(engine_reader)))
                    await writer.drain()

        back = asyncio.ensure_future(answers())
        try:
            while True:
                message = await frames.read_message(reader)
                sent.append(message)
                engine_writer.write(frames.encode(message))
                await engine_writer.drain()
        finally:
            back.cancel()
            engine_writer.close()

    return handle
