"""``diffgemma-lsp openai``: an OpenAI-compatible ``/v1/completions`` endpoint in front of the engine.

For editors that take an OpenAI-compatible completion provider rather than an LSP server for inline completions
(Zed's edit predictions), and for teams that point their language servers at one shared machine
(``backend = "openai"``). It talks to the same resident engine as the language servers (starting it when none
runs), so one model serves both. Requests carry ``Authorization: Bearer <key>``; the key comes from
``$DIFFGEMMA_API_KEY`` or, when that is unset, from a private key file created on first start. It listens on
loopback unless told otherwise. Never imports torch.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import secrets
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_urldispatcher import _default_expect_handler

from diffgemma_engine.shared import frames, protocol
from diffgemma_engine.shared.logfile import setup_logging
from diffgemma_lsp import __version__
from diffgemma_lsp.backends.base import BackendState, EngineRequestError, EngineUnavailable
from diffgemma_lsp.backends.connect import EngineSettings, local_backend
from diffgemma_lsp.backends.local import EngineClient
from diffgemma_lsp.endpoint.http_guard import (
    ConnectionGuard,
    GuardedSite,
    HttpLimits,
    RepeatLimitedErrors,
    RepeatLimitedLog,
)
from diffgemma_lsp.endpoint.wire import (
    ApiError,
    CompletionRequest,
    completion_body,
    cut_at_stop,
    cut_to_tokens,
    models_body,
    new_completion_id,
    parse_completion_request,
)
from diffgemma_lsp.fim_formats import split_prompt
from diffgemma_lsp.postprocess import infill_edits
from diffgemma_lsp.settings import QUANTIZATIONS

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8790
API_KEY_ENV = "DIFFGEMMA_API_KEY"
MAX_BODY_BYTES = frames.MAX_FRAME_BYTES
ENGINE = web.AppKey("engine", EngineClient)
API_KEY = web.AppKey("api_key", str)
DEADLINE_MS = web.AppKey("deadline_ms", int)
MAX_STEPS = web.AppKey("max_steps", int)
READ_TIMEOUT_S = web.AppKey("read_timeout_s", float)


def api_key_file() -> Path:
    """Where the generated key is kept (0600) when ``$DIFFGEMMA_API_KEY`` is unset."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "diffgemma" / "api-key"


def load_api_key() -> tuple[str, str]:
    """The key and where it came from: the environment, or the key file (created on first use)."""
    if key := os.environ.get(API_KEY_ENV, "").strip():
        return key, f"${API_KEY_ENV}"
    path = api_key_file()
    if path.is_file() and (key := path.read_text().strip()):
        return key, str(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_urlsafe(24)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(key + "\n")
    return key, str(path)


def _json_error(error: ApiError) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    response = web.json_response(error.body(), status=error.status, headers=headers)
    if error.status == 408:  # the rest of the body may still come: this connection cannot carry another request
        response.force_close()
    return response


def _check_key(request: web.Request) -> None:
    """ApiError 401 unless the request carries the key."""
    given = request.headers.get("Authorization", "")
    scheme, _, token = given.partition(" ")
    wanted = request.app[API_KEY].encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(errors="replace"), wanted):
        raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", kind="auth_error")


async def keyed_expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` on a keyed route: aiohttp's answer once the key is checked (aiohttp calls this before
    the middlewares); a client without it is refused before it sends its body."""
    try:
        _check_key(request)
    except ApiError as exc:
        response = _json_error(exc)
        response.force_close()  # the body it announced is not wanted
        return response
    await _default_expect_handler(request)
    return None


@web.middleware
async def errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal is an OpenAI-style JSON error; every route but ``/health`` needs the key."""
    try:
        if request.path != "/health":
            _check_key(request)
        return await handler(request)
    except ApiError as exc:
        return _json_error(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _json_error(ApiError(exc.status, exc.reason))


async def health(request: web.Request) -> web.Response:
    """Liveness and the engine's state (no key needed; says nothing about requests)."""
    engine = request.app[ENGINE]
    return web.json_response({"status": "ok", "engine": engine.state.value})


def model_name(engine: EngineClient) -> str:
    """The model's name for clients: its folder's name, not the server's path to it."""
    return Path(engine.model_id).name or "diffgemma"


async def models(request: web.Request) -> web.Response:
    return web.json_response(models_body(model_name(request.app[ENGINE])))


def canvas_for(max_tokens: int | None, model_canvas: int, layout: protocol.Layout = protocol.Layout.FIM) -> int:
    """The canvas for a request (0: the model's own): a FIM checkpoint's is shorter when the client wants fewer
    tokens. A chat checkpoint's is always its own: its answer comes wrapped (a code fence, a line of prose) in tokens
    a FIM client's ``max_tokens`` does not count (Zed asks for 64 where the release's canvas is 256), and a shorter
    canvas is not what it was trained to answer in; ``max_tokens`` then bounds what is returned instead
    (``cut_to_tokens``)."""
    if max_tokens is None or layout is protocol.Layout.CHAT or (model_canvas and max_tokens >= model_canvas):
        return 0
    return max_tokens


async def _read_json(request: web.Request) -> object:
    """The request's body as JSON, read within the app's time limit; an ``ApiError`` that says what is wrong."""
    try:
        async with asyncio.timeout(request.app[READ_TIMEOUT_S]):
            raw = await request.read()
    except TimeoutError:
        raise ApiError(408, f"the request body took over {request.app[READ_TIMEOUT_S]:g} s to arrive") from None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply to be a completion request") from None


async def _infill(engine: EngineClient, infill: protocol.Infill) -> protocol.Result:
    """The engine's answer to ``infill``, or the ``ApiError`` its failure or refusal is to a client."""
    try:
        return await engine.infill(infill)
    except EngineUnavailable as exc:
        raise ApiError(503, f"the engine is unavailable: {exc}; retry shortly", kind="server_error") from None
    except EngineRequestError as exc:
        if exc.error.code is protocol.ErrorCode.TOO_LARGE:
            raise ApiError(
                413,
                f"the prompt and suffix are too large for one request ({exc.error.message}): send less context",
            ) from None
        status = 429 if exc.error.code is protocol.ErrorCode.BUSY else 400
        raise ApiError(status, f"the engine refused the request: {exc.error.message}") from None


def _choices(
    layout: protocol.Layout, infill: protocol.Infill, result: protocol.Result, suffix: str, wanted: CompletionRequest
) -> list[tuple[str, str]]:
    """Each distinct candidate of ``result`` as the text to insert at the cursor (this API cannot replace text),
    with its finish reason."""
    choices: list[tuple[str, str]] = []
    for edit in infill_edits(layout, infill, result, ""):
        text, stopped = cut_at_stop(edit.insertion(suffix) if edit is not None else "", wanted.stop)
        text, shortened = cut_to_tokens(text, wanted.max_tokens if layout is protocol.Layout.CHAT else None)
        if choices and (not text or any(text == seen for seen, _ in choices)):
            continue  # candidates that came out the same (or empty) after post-processing
        finished = not shortened and (stopped or result.stop is protocol.StopReason.EOS)
        choices.append((text, "stop" if finished else "length"))
    return choices


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``: one fill-in-the-middle completion."""
    wanted = parse_completion_request(await _read_json(request))
    prefix, suffix = split_prompt(wanted.prompt, wanted.suffix)
    engine = request.app[ENGINE]
    if engine.state is not BackendState.READY or engine.hello is None:
        engine.start()
        raise ApiError(503, f"the model is not ready (engine {engine.state.value}); retry shortly", kind="server_error")
    completion_id = new_completion_id()
    infill = protocol.Infill(
        id=engine.new_id(),
        uri=f"openai:{completion_id}",
        prefix=frames.valid_text(prefix),
        suffix=frames.valid_text(suffix),
        canvas_length=canvas_for(wanted.max_tokens, engine.hello.canvas_length, engine.layout),
        deadline_ms=request.app[DEADLINE_MS],
        max_steps=request.app[MAX_STEPS],
        scope=protocol.cursor_scope(prefix),
        candidates=wanted.n,
    )
    result = await _infill(engine, infill)
    choices = _choices(engine.layout, infill, result, suffix, wanted)
    answer = completion_body(
        completion_id, model_name(engine), choices, result.timings.prompt_tokens, result.timings.new_tokens
    )
    logger.info(
        "%s: %d choice(s), %d chars, %s, %d steps, %.0f ms in the engine",
        completion_id,
        len(choices),
        len(choices[0][0]),
        choices[0][1],
        result.timings.steps,
        result.timings.total_ms,
    )
    if not wanted.stream:
        return web.json_response(answer)
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await stream.prepare(request)
    await stream.write(f"data: {json.dumps(answer)}\n\n".encode())
    await stream.write(b"data: [DONE]\n\n")
    await stream.write_eof()
    return stream


def make_app(
    engine: EngineClient,
    api_key: str,
    deadline_ms: int = 2000,
    max_steps: int = 0,
    guard: ConnectionGuard | None = None,
) -> web.Application:
    """The endpoint's routes around a started engine client; every request gets ``deadline_ms`` and ``max_steps``;
    ``guard`` (when the app is served by a ``GuardedSite``) sees which connections are busy."""
    limits = guard.limits if guard is not None else HttpLimits()
    middlewares = [errors_and_auth] if guard is None else [guard.middleware, errors_and_auth]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[ENGINE] = engine
    app[READ_TIMEOUT_S] = limits.read_timeout_s
    app[API_KEY] = api_key
    app[DEADLINE_MS] = deadline_ms
    app[MAX_STEPS] = max_steps
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models, expect_handler=keyed_expect)
    app.router.add_post("/v1/completions", completions, expect_handler=keyed_expect)
    return app


async def serve(args: argparse.Namespace) -> None:
    """Run until cancelled."""
    api_key, key_source = load_api_key()
    engine = local_backend(
        args.engine_socket,
        EngineSettings(model=args.model, device=args.device, quantization=args.quantization),
        lambda state, detail: logger.info("engine %s%s", state.value, f": {detail}" if detail else ""),
        client_name="diffgemma-openai",
    )
    asyncio.get_running_loop().set_exception_handler(RepeatLimitedErrors())
    logging.getLogger("aiohttp.server").addFilter(RepeatLimitedLog())
    guard = ConnectionGuard(
        HttpLimits(
            read_timeout_s=args.read_timeout_s, idle_timeout_s=args.idle_timeout_s, max_connections=args.max_connections
        )
    )
    # A client that hangs up (the user typed on) cancels its request, and with it the engine's work.
    runner = web.AppRunner(
        make_app(engine, api_key, args.deadline_ms, args.steps, guard),
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=args.idle_timeout_s,
        lingering_time=args.read_timeout_s,  # how long the unread rest of a refused request's body is drained
    )
    await runner.setup()
    site = GuardedSite(runner, args.host, args.port, guard)
    await site.start()
    if guard.max_connections < args.max_connections:
        logger.warning("at most %d connections at once (the file limit allows no more)", guard.max_connections)
    if args.host not in ("127.0.0.1", "::1", "localhost"):
        logger.warning("listening on %s: every machine that can reach it and has the key can use it", args.host)
    host, port = runner.addresses[0][:2]
    logger.info("diffgemma %s: http://%s:%d/v1/completions (API key from %s)", __version__, host, port, key_source)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await engine.close()


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``diffgemma-lsp openai``."""
    parser = argparse.ArgumentParser(prog="diffgemma-lsp openai", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any)")
    parser.add_argument("--engine-socket", type=Path, default=None, help="default: the engine for --model/--device")
    parser.add_argument("--model", default=None, help="checkpoint folder or hub id for an engine this command starts")
    parser.add_argument("--device", default="auto", help="device for an engine this command starts")
    parser.add_argument("--quantization", default="", choices=QUANTIZATIONS, help="for an engine this command starts")
    parser.add_argument("--deadline-ms", type=int, default=2000, help="denoising time limit per request (0: none)")
    parser.add_argument("--steps", type=int, default=0, help="most denoising steps per request (0: the model's)")
    defaults = HttpLimits()
    parser.add_argument(
        "--read-timeout-s",
        type=float,
        default=defaults.read_timeout_s,
        help=f"longest a client may take to send a request's head, and its body (default {defaults.read_timeout_s:g})",
    )
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=defaults.idle_timeout_s,
        help=f"an idle connection is closed after this long (default {defaults.idle_timeout_s:g})",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=defaults.max_connections,
        help=f"open connections at once; the oldest idle one makes room (default {defaults.max_connections})",
    )
    parser.add_argument("--log-file", type=Path, default=None)
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv: list[str]) -> int:
    """``diffgemma-lsp openai``: serve until interrupted."""
    args = build_parser().parse_args(argv)
    setup_logging("debug" if args.verbose else "info", args.log_file)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", args.host, args.port, exc)
        return 1
    return 0
