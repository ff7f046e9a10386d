"""The language server on stdin and stdout, with stdin read by the event loop.

pygls 2.1 reads stdin on a worker thread, one hand-off per header line and per body: three thread round trips for
every message, most of the server's time for a ``didChange`` (a keystroke took about 0.7 ms, 0.17 ms of it in the
handlers). Here stdin is an asyncio pipe (``loop.connect_read_pipe``) and pygls' own message loop
(``pygls.io_.run_async``) reads from it; where stdin is no pipe (a regular file, a platform without pipe transports)
pygls' threaded reader serves as before.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import BinaryIO

from pygls.io_ import StdinAsyncReader, StdoutWriter, run_async
from pygls.server import JsonRPCServer

logger = logging.getLogger(__name__)
SWITCH_INTERVAL_S = 0.001
"""How long a thread holds the interpreter's lock before another may take it (Python's default: 5 ms). The
workspace index is built on a worker thread: while it works, each time the event loop waits for the lock back (a
request read, the engine's answer, the reply written) it waited up to 5 ms; a completion while a workspace of
100,000 files was walked took 34 ms (p50) instead of 6 (``benchmarks/hostile_workspace.py``)."""
MAX_LINE_BYTES = 2**20
"""A header line longer than this is not a header: skipped."""


class PipeReader:
    """An asyncio stream as pygls' ``AsyncReader``: a header line, then the body; empty bytes at the end."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream

    async def readline(self) -> bytes:
        """The next header line; one longer than ``MAX_LINE_BYTES`` is logged and skipped whole (the stream's
        limit raised out of pygls' message loop, which then answered nothing more and exited at the end of stdin)."""
        while True:
            try:
                return await self.stream.readline()
            except ValueError:
                logger.error("a header line of more than %d bytes from the client: skipped", MAX_LINE_BYTES)
                await self._skip_line()

    async def _skip_line(self) -> None:
        """Drop what is left of an over-long line (up to its line break)."""
        while True:
            try:
                await self.stream.readline()
                return
            except ValueError:
                continue

    async def readexactly(self, n: int) -> bytes:
        try:
            return await self.stream.readexactly(n)
        except asyncio.IncompleteReadError:
            return b""  # the client went away mid-message


async def pipe_reader(stdin: BinaryIO) -> PipeReader | None:
    """``stdin`` read by the running event loop; None where it cannot be (not a pipe, socket or terminal)."""
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader(limit=MAX_LINE_BYTES, loop=loop)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream, loop=loop), stdin)
    except (NotImplementedError, ValueError, OSError) as error:
        logger.debug("stdin is read on a thread: %s", error)
        return None
    return PipeReader(stream)


def serve(server: JsonRPCServer, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """pygls' ``start_io`` (its ``_start_io_async``) with stdin read by the event loop where it can be."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server._stop_event = stop_event = threading.Event()  # what pygls' shutdown() sets to end the message loop
    server.protocol.set_writer(StdoutWriter(stdout))

    async def messages() -> None:
        reader = await pipe_reader(stdin) or StdinAsyncReader(stdin, server.thread_pool)
        await run_async(
            stop_event=stop_event,
            reader=reader,
            protocol=server.protocol,
            logger=logger,
            error_handler=server.report_server_error,
        )

    try:
        asyncio.run(messages())
    except BrokenPipeError:
        logger.error("the connection to the client is lost: shutting down")
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.shutdown()  # type: ignore[no-untyped-call]  # pygls leaves it untyped
