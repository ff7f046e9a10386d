"""An outage reported ends with the backend's next answer, and a refusal is an answer: the backend is back. The same
for each feature, since they ask the backend one way (``Session.reply``).

The real language server (a subprocess, bare JSON-RPC) on the OpenAI-compatible backend, played by a loopback HTTP
server: it fails (HTTP 500: the outage, reported once), then refuses every request (HTTP 400: a refusal). Before the
session asked for all three, a refused next edit did not end the outage (the completion's and the rewrite's copies
of the error handling did)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from diffgemma_lsp.features.rewrite import REWRITE_COMMAND
from diffgemma_lsp.params import NEXT_EDIT_METHOD
from tests.support.lsp import RawLsp, server_command
from tests.support.openai_endpoint import serving_route

pytestmark = pytest.mark.e2e
URI = "file:///work/area.py"
TEXT = "def area(width, height):\n    return width * height\n"
BACK = "diffgemma: engine is back"
REFUSAL = "the request names a model this server does not serve"


async def _complete(lsp: RawLsp, request_id: int) -> dict[str, object]:
    lsp.request(request_id, "textDocument/completion", {"textDocument": {"uri": URI}, "position": _at(1, 4)})
    return await lsp.reply(request_id)


async def _rewrite(lsp: RawLsp, request_id: int) -> dict[str, object]:
    argument = {"uri": URI, "range": {"start": _at(1, 0), "end": _at(1, 25)}, "version": 1}
    lsp.request(request_id, "workspace/executeCommand", {"command": REWRITE_COMMAND, "arguments": [argument]})
    return await lsp.reply(request_id)


async def _next_edit(lsp: RawLsp, request_id: int) -> dict[str, object]:
    change = {"range": {"start": _at(0, 9), "end": _at(0, 14)}, "text": "size"}  # width renamed: an edit to follow
    lsp.notify("textDocument/didChange", {"textDocument": {"uri": URI, "version": 2}, "contentChanges": [change]})
    lsp.request(request_id, NEXT_EDIT_METHOD, {"textDocument": {"uri": URI, "version": 2}, "position": _at(0, 13)})
    return await lsp.reply(request_id)


def _at(line: int, character: int) -> dict[str, int]:
    return {"line": line, "character": character}


FEATURES: dict[str, Callable[[RawLsp, int], Awaitable[dict[str, object]]]] = {
    "completion": _complete,
    "rewrite": _rewrite,
    "next edit": _next_edit,
}


async def test_a_refusal_ends_the_outage_for_every_feature(short_tmp: Path) -> None:
    """One server, one round per feature: the backend fails (an outage, reported), then refuses the feature's
    request (the outage is over: said once)."""
    failing = [True]

    async def backend(_: web.Request) -> web.Response:
        if failing[0]:
            return web.json_response({"error": {"message": "out of memory"}}, status=500)
        return web.json_response({"error": {"message": REFUSAL}}, status=400)

    async with serving_route("/v1/completions", backend) as url:
        lsp = await RawLsp.start(server_command(short_tmp / "unused.sock", None))
        try:
            settings = {
                "backend": "openai",
                "openaiUrl": url,
                "openaiApiKeyEnv": "UNSET_API_KEY",
                "debounceMs": 0,
                "nextEditOnPause": False,
            }
            capabilities = {"workspace": {"applyEdit": True, "workspaceEdit": {"documentChanges": True}}}
            await lsp.initialize({"diffgemma": settings}, capabilities)
            lsp.open(URI, TEXT)

            def said(method: str) -> list[str]:
                return [m["params"]["message"] for m in lsp.notifications if m["method"] == method]

            for round_number, (feature, ask) in enumerate(FEATURES.items(), start=1):
                failing[0] = True
                assert "result" in await _complete(lsp, 10 * round_number)
                outages = [message for message in said("window/showMessage") if "Completions are off" in message]
                assert len(outages) == round_number, (feature, said("window/showMessage"))  # reported, once
                assert said("window/logMessage").count(BACK) == round_number - 1, feature
                failing[0] = False
                reply = await ask(lsp, 10 * round_number + 1)
                assert "result" in reply, (feature, reply)  # the refusal is an answer, not an error
                if feature == "rewrite":
                    assert reply["result"] == {"applied": False, "reason": f"the engine refused the rewrite: {REFUSAL}"}
                assert said("window/logMessage").count(BACK) == round_number, (feature, said("window/logMessage"))
        finally:
            await lsp.stop()
