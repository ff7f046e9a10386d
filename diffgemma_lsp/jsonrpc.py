"""The JSON-RPC side of the language server: pygls' ``LanguageServerProtocol`` with the mends this project needs
where pygls runs a handler (a cancel reaches the work, a handled message leaves nothing behind, a request with
unreadable params is answered) and documents kept as lists of lines."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Generator
from concurrent.futures import Future
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

from diffgemma_lsp.document import LineWorkspace

_STEPPED_BY: contextvars.ContextVar[Future[Any] | None] = contextvars.ContextVar("stepped_by", default=None)
"""While pygls steps a generator handler: the future of the request or notification it runs for."""


class DiffgemmaProtocol(LanguageServerProtocol):
    """pygls' protocol, except that a request whose params cannot be read still gets an error reply, that
    documents are kept as lists of lines (``LineWorkspace``), that a cancelled request stops its work, and that a
    handled message leaves nothing behind.

    pygls 2.1.1 runs the handlers of the methods it handles itself too (``workspace/executeCommand``, document
    sync) from a generator that yields the user's handler, which it then runs under a fresh id: a
    ``$/cancelRequest`` cancels the generator's future, answers "cancelled", and never reaches the user's task,
    whose work goes on to its end (a rewrite's edit was applied after its cancel). It also keeps the future of
    every message it runs under an id of its own, a notification's included, in ``_request_futures`` and never
    takes it out (about 2 KB per keystroke). Both are mended here, where pygls runs a handler; and its ``shutdown``
    no longer fails when a request is in flight (``lsp_shutdown``).
    """

    @property
    def workspace(self) -> LineWorkspace:
        """pygls' workspace, made a ``LineWorkspace`` the first time it is used.

        pygls builds a plain ``Workspace`` inside ``lsp_initialize`` and has no option to build another kind. Its
        first use comes after that, from pygls' own handlers (``didOpen`` puts the first document in it) or ours:
        swapping it here, for one in the same state, happens before any document exists and needs neither a copy
        of pygls' ``lsp_initialize`` nor a patch of its module's ``Workspace`` (global, and blind to a renamed
        import). It relies on pygls keeping the workspace in ``_workspace``; the protocol tests fail if not.
        """
        workspace = super().workspace
        if not isinstance(workspace, LineWorkspace):
            workspace = self._workspace = LineWorkspace.like(workspace)
        return workspace

    def _execute_handler(
        self,
        msg_id: Any,
        handler: Any,
        callback: Any,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        """pygls' ``_execute_handler``; then the message's future leaves ``_request_futures`` once done, and a handler
        run for a generator's step is cancelled with the request the generator answers."""
        parent = _STEPPED_BY.get()
        before = self._request_futures.get(msg_id)
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        future = self._request_futures.get(msg_id)
        if future is None or future is before:
            return  # a plain function: already done, nothing kept
        loop = asyncio.get_running_loop()  # a thread handler's future calls back in its thread
        future.add_done_callback(lambda done: loop.call_soon_threadsafe(self._forget, msg_id, done))
        if parent is not None:
            parent.add_done_callback(lambda request: request.cancelled() and future.cancel())

    def _forget(self, msg_id: Any, future: Any) -> None:
        """Take a done future out, later than its callbacks (pygls' shutdown cancels them while it iterates)."""
        if self._request_futures.get(msg_id) is future:
            del self._request_futures[msg_id]

    @lsp_method(types.SHUTDOWN)
    def lsp_shutdown(self, *args: Any) -> Generator[Any, Any, None]:
        """pygls' ``lsp_shutdown``, over a snapshot of ``_request_futures``: pygls iterates the dict itself while it
        cancels, and cancelling a generator's future (a rewrite's ``workspace/executeCommand``) runs pygls'
        ``_send_handler_result`` at once, which takes it out of the dict: "dictionary changed size during
        iteration", and the client's ``shutdown`` got an internal error (openlawlibrary/pygls#606, open)."""
        if (user_handler := self.fm.features.get(types.SHUTDOWN)) is not None:
            yield user_handler, args, None
        current_id = self.msg_id  # the shutdown request's own future is not cancelled
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current_id and not future.done():
                future.cancel()
        self._shutdown = True

    def _run_generator(
        self, future: Future[Any] | None, *, gen: Generator[Any, Any, Any], result_future: Future[Any]
    ) -> None:
        """pygls' ``_run_generator``, with ``result_future`` known to the handler it starts (``_execute_handler``)."""
        token = _STEPPED_BY.set(result_future)
        try:
            super()._run_generator(future, gen=gen, result_future=result_future)
        finally:
            _STEPPED_BY.reset(token)

    def structure_message(self, data: dict[str, Any]) -> Any:
        """Deserialize; on failure, answer the request (pygls would drop it and the client would wait forever)."""
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if isinstance(data, dict) and "method" in data and isinstance(data.get("id"), int | str):
                detail = f": {exc.__cause__}" if exc.__cause__ is not None else ""
                error = JsonRpcInvalidParams(f"invalid params for {data['method']}{detail}")
                self._send_response(data["id"], None, error.to_response_error())
            raise
