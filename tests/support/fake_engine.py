"""Small asyncio servers of this user's that speak the real engine wire protocol, to play broken or recording
engines in tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from diffgemma_engine import protocol

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
        await protocol.read_message(reader)  # the client's hello
        writer.write(protocol.encode(HELLO_OK))
        while True:
            message = await protocol.read_message(reader)
            if isinstance(message, protocol.Infill):
                if received is not None:
                    received.append(message)
                writer.write(protocol.encode(protocol.Result(id=message.id, text="", stop=protocol.StopReason.EOS)))
            await writer.drain()

    return handle
