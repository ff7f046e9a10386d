"""A stand-in for ``vllm serve`` of DiffusionGemma, for vLLM's GPU execution only, which cannot run here: run in the
vLLM venv (tests/support/vllm_env.py), it listens on a Unix socket as ``vllm serve --uds`` does, admits every
``/v1/completions`` request with vLLM 0.33's own code as ``vllm serve`` of ``--model`` at ``--canvas`` would
(``vllm_check.admit``: ``CompletionRequest``, ``to_sampling_params`` with the checkpoint's generation defaults,
``SamplingParams.verify`` with the served model's ``ModelConfig``, ``validate_diffusion_sampling_params``), refuses
what vLLM refuses in vLLM's error shape, and answers with vLLM's own ``CompletionResponse``: each choice's ids are the
request's seed canvas (a rewrite, unless ``--no-seed-echo``) or ``--answer-ids``, after ``--delay-s``
(``POST /standin/delay`` changes it).
``POST /standin/misbehave {"modes": [...]}`` makes the next requests (each admitted first) get what a broken or
hostile server sends instead, one mode each: ``drip`` (a head, then a byte every 0.2 s), ``huge`` (12 million token
ids), ``garbage`` (HTML), ``shape`` (JSON of the wrong shape), ``huge_error`` (a 5 MB error message).
Every request is logged to ``--log`` (JSON lines) when it arrives valid, then with its verdict and whether its
client went away before the answer (vLLM then aborts it).

    python vllm_standin.py --socket PATH --model DIR --canvas 256 --log FILE [--answer-ids 5,6,1] [--delay-s S]

Or run as ``vllm`` itself (``vllm_standin.py serve MODEL_DIR --uds PATH ...``, what the engine runs with
``--vllm-command``): the command line is parsed and checked by vLLM 0.33's own ``vllm serve`` parser
(``make_arg_parser``, ``validate_parsed_serve_args``, ``AsyncEngineArgs.from_cli_args``), the canvas is its
``--diffusion-config``'s; the log is ``$DIFFGEMMA_STANDIN_LOG`` (each start
logged with its pid and what it parsed), ``$DIFFGEMMA_STANDIN_ANSWER_IDS`` the answer,
``$DIFFGEMMA_STANDIN_START_DELAY_S`` a wait before it listens (loading), ``$DIFFGEMMA_STANDIN_REFUSE`` a message it
prints before it exits 1 at once (a start that fails), and ``POST /standin/exit`` makes it exit 3 (a crash).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).parent))
from vllm_check import admit, parse_vllm_serve, served_model_config  # beside this file


def _log(path: Path, entry: dict) -> None:
    with path.open("a") as log:
        log.write(json.dumps(entry) + "\n")


def build_app(args: argparse.Namespace) -> web.Application:
    import vllm
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponse,
        CompletionResponseChoice,
    )
    from vllm.entrypoints.serve.engine.protocol import PromptTokenUsageInfo, UsageInfo

    served_model_config(str(args.model))  # built before it listens, as vLLM loads before it answers /health
    answer_ids = [int(token) for token in args.answer_ids.split(",")] if args.answer_ids else [1]

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            parsed, params = admit(body, str(args.model), args.canvas)
        except Exception as exc:  # noqa: BLE001 - refused as vLLM refuses: 400 with the message
            _log(args.log, {"body": body, "ok": False, "error": str(exc)})
            error = {"message": str(exc), "type": "BadRequestError", "param": None, "code": 400}
            return web.json_response({"error": error}, status=400)
        _log(args.log, {"arrived": True, "n": params.n, "session": request.headers.get("x-session-id")})
        if args.misbehave:  # the test's own knob: what a broken or hostile server sends instead of vLLM's reply
            return await misbehave(request, body, args.misbehave.pop(0))
        try:
            await asyncio.sleep(args.delay_s)
        except asyncio.CancelledError:
            _log(args.log, {"body": body, "ok": True, "aborted": True})
            raise
        seed_canvas = params.extra_args.get("diffusion_seed_canvas") if args.seed_echo else None
        ids = list(seed_canvas or answer_ids)
        choices = [
            CompletionResponseChoice(index=index, text="", finish_reason="stop", token_ids=ids)
            for index in range(params.n)
        ]
        prompt = len(parsed.prompt) if isinstance(parsed.prompt, list) else 0
        usage = UsageInfo(
            prompt_tokens=prompt,
            completion_tokens=len(ids) * params.n,
            total_tokens=prompt + len(ids) * params.n,
            # as vLLM: only with --enable-prompt-tokens-details (the stand-in has no cache: none read from it)
            prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=0) if args.prompt_tokens_details else None,
        )
        response = CompletionResponse(model=parsed.model or "", choices=choices, usage=usage)
        _log(args.log, {"body": body, "ok": True, "aborted": False, "extra_args": params.extra_args})
        return web.Response(text=response.model_dump_json(), content_type="application/json")

    async def misbehave(request: web.Request, body: dict, mode: str) -> web.StreamResponse:
        if mode == "garbage":
            return web.Response(status=200, text="<html>upstream gateway\nerror</html>", content_type="text/html")
        if mode == "shape":
            return web.json_response({"choices": [{"index": "a", "token_ids": [1]}, {"index": 0}], "usage": []})
        if mode == "huge_error":  # 5 MB of message, over many lines
            message = ("Traceback (most recent call last):\n" + "x" * 100 + "\n") * 50_000
            error = {"message": message, "type": "InternalServerError", "param": None, "code": 500}
            return web.json_response({"error": error}, status=500)
        stream = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        if mode == "drip":  # a reply that never ends: a byte every 0.2 s for up to a minute
            stream.content_length = 1000  # within any bound: it never comes whole
        await stream.prepare(request)
        try:
            if mode == "drip":
                for _ in range(300):
                    await stream.write(b" ")
                    await asyncio.sleep(0.2)
            else:  # "huge": 12 million token ids for any canvas
                await stream.write(b'{"choices": [{"index": 0, "finish_reason": "length", "token_ids": [')
                chunk = b"5," * 32768
                for _ in range(12_000_000 // 32768):
                    await stream.write(chunk)
                await stream.write(b"5]}]}")
        except (asyncio.CancelledError, ConnectionError):
            _log(args.log, {"body": body, "ok": True, "aborted": True, "mode": mode})
            raise
        _log(args.log, {"body": body, "ok": True, "aborted": False, "mode": mode})
        return stream

    async def set_misbehave(request: web.Request) -> web.Response:  # the test's own knob, not vLLM's
        args.misbehave.extend((await request.json())["modes"])
        return web.Response(status=204)

    async def set_delay(request: web.Request) -> web.Response:  # the test's own knob, not vLLM's
        args.delay_s = float((await request.json())["delay_s"])
        return web.Response(status=204)

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": vllm.__version__})

    async def crash(_: web.Request) -> web.Response:  # the test's own knob: vLLM dies
        print("standin: simulated crash (CUDA error: an illegal memory access was encountered)", file=sys.stderr)
        sys.stderr.flush()
        asyncio.get_running_loop().call_later(0.05, os._exit, 3)
        return web.Response(status=204)

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.get("/health", health), web.get("/version", version)])
    app.add_routes([web.post("/standin/delay", set_delay), web.post("/standin/exit", crash)])
    app.add_routes([web.post("/standin/misbehave", set_misbehave)])
    return app


def bind(path: Path) -> socket.socket:
    """The socket bound as ``vllm serve --uds`` binds it, with vLLM's own ``create_server_unix_socket``: before the
    model loads, failing on a file already there ("Address already in use"), and never removed."""
    from vllm.entrypoints.launchers.launcher import create_server_unix_socket

    return create_server_unix_socket(str(path))


async def serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(build_app(args), handler_cancellation=True)
    await runner.setup()
    if args.port:  # vllm serve --port: HTTP on the loopback (a team's server, as --vllm-url reaches it)
        await web.TCPSite(runner, "127.0.0.1", args.port).start()
    else:
        await web.SockSite(runner, args.bound or bind(args.socket)).start()
    print(f"standin: listening on {args.socket}", flush=True)
    await asyncio.Event().wait()


def as_vllm_serve(argv: list[str]) -> argparse.Namespace:
    """``vllm serve MODEL [options]`` parsed and checked by vLLM's own parser (``vllm_check.parse_vllm_serve``); the
    stand-in's settings from it."""
    served = parse_vllm_serve(argv)
    log = Path(os.environ["DIFFGEMMA_STANDIN_LOG"])
    served["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    _log(log, {"started": os.getpid(), "served": served})
    bound = bind(Path(served["uds"]))
    print(f"standin: loading {served['model']}", flush=True)
    if refusal := os.environ.get("DIFFGEMMA_STANDIN_REFUSE"):
        print(f"standin: {refusal}", file=sys.stderr, flush=True)
        sys.exit(1)
    time.sleep(float(os.environ.get("DIFFGEMMA_STANDIN_START_DELAY_S", "0")))
    return argparse.Namespace(
        socket=Path(served["uds"]),
        bound=bound,
        canvas=served["canvas_length"],
        model=Path(served["model"]),
        prompt_tokens_details=served["enable_prompt_tokens_details"],
        misbehave=[],
        port=0,
        log=log,
        answer_ids=os.environ.get("DIFFGEMMA_STANDIN_ANSWER_IDS", ""),
        delay_s=0.0,
        seed_echo=True,
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        asyncio.run(serve(as_vllm_serve(sys.argv[2:])))
        sys.exit(0)
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", type=Path, default=None)
    parser.add_argument("--port", type=int, default=0, help="listen on 127.0.0.1:PORT instead of --socket")
    parser.add_argument("--canvas", type=int, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--answer-ids", default="")
    parser.add_argument("--delay-s", type=float, default=0.0)
    parser.add_argument("--seed-echo", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--enable-prompt-tokens-details", dest="prompt_tokens_details", action="store_true")
    asyncio.run(serve(argparse.Namespace(**vars(parser.parse_args()), bound=None, misbehave=[])))
