"""Run in the vLLM venv (tests/support/vllm_env.py): vLLM's own request and response code, one question a line on
stdin (``{"kind": "requests" | "reply", "data": ...}``), one answer a line on stdout (vLLM imports once: seconds).

``requests``: a list of ``{"body", "canvas_length", "vocab_size"}``; each body is parsed as ``vllm serve`` parses a
``/v1/completions`` request (``CompletionRequest``), turned into ``SamplingParams`` (``to_sampling_params``) and
checked by ``validate_diffusion_sampling_params`` at the served canvas and vocabulary. Prints a list of
``{"ok": true, "params": {...}}`` or ``{"ok": false, "error": "..."}``.

``serve_args``: a ``vllm serve`` command line (without ``vllm serve``) parsed and checked by vLLM's own parser
(``parse_vllm_serve``); prints what it would serve, or ``{"error": "..."}``.

``reply``: ``{"model", "choices": [{"token_ids", "text", "finish_reason"}], "prompt_tokens", "cached_tokens"}`` as a
``CompletionResponse`` built with vLLM's classes, printed as vLLM's server would send it.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM's serve parser asks the platform for its defaults


def parse_vllm_serve(argv: list[str]) -> dict:
    """``vllm serve``'s arguments parsed and checked as vLLM 0.33 parses them (``make_arg_parser``,
    ``validate_parsed_serve_args``, ``AsyncEngineArgs.from_cli_args(...).create_diffusion_config``): what it would
    serve. Raises what vLLM raises (``SystemExit`` from argparse for an unknown option)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    if parsed.model_tag is not None:  # as ``vllm serve`` (vllm/entrypoints/cli/serve.py) does
        parsed.model = parsed.model_tag
    validate_parsed_serve_args(parsed)
    diffusion = AsyncEngineArgs.from_cli_args(parsed).create_diffusion_config()
    return {
        "model": parsed.model,
        "uds": parsed.uds,
        "canvas_length": diffusion.canvas_length,
        "max_denoising_steps": diffusion.max_denoising_steps,
        "max_num_seqs": parsed.max_num_seqs,
        "tensor_parallel_size": parsed.tensor_parallel_size,
        "enable_prefix_caching": parsed.enable_prefix_caching,
    }


def check_serve_args(argv: list[str]) -> dict:
    try:
        return parse_vllm_serve(argv)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - every refusal is reported, whatever its class
        return {"error": f"{type(exc).__name__}: {exc}"}


def check_requests(cases: list[dict]) -> list[dict]:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.utils.diffusion import validate_diffusion_sampling_params

    out = []
    for case in cases:
        try:
            request = CompletionRequest.model_validate(case["body"])
            params = request.to_sampling_params(request.max_tokens, None)
            validate_diffusion_sampling_params(
                params, canvas_length=case["canvas_length"], vocab_size=case["vocab_size"]
            )
        except Exception as exc:  # noqa: BLE001 - every refusal is reported, whatever its class
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        prompt = request.prompt
        out.append(
            {
                "ok": True,
                "params": {
                    "prompt": prompt,
                    "n": params.n,
                    "seed": params.seed,
                    "max_tokens": params.max_tokens,
                    "extra_args": params.extra_args,
                    "skip_special_tokens": params.skip_special_tokens,
                    "return_token_ids": request.return_token_ids,
                },
            }
        )
    return out


def build_reply(spec: dict) -> dict:
    from vllm.entrypoints.openai.completion.protocol import CompletionResponse, CompletionResponseChoice
    from vllm.entrypoints.serve.engine.protocol import PromptTokenUsageInfo, UsageInfo

    choices = [
        CompletionResponseChoice(
            index=index, text=choice["text"], finish_reason=choice["finish_reason"], token_ids=choice["token_ids"]
        )
        for index, choice in enumerate(spec["choices"])
    ]
    completion = sum(len(choice["token_ids"]) for choice in spec["choices"])
    usage = UsageInfo(
        prompt_tokens=spec["prompt_tokens"],
        completion_tokens=completion,
        total_tokens=spec["prompt_tokens"] + completion,
        prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=spec["cached_tokens"]),
    )
    response = CompletionResponse(model=spec["model"], choices=list(reversed(choices)), usage=usage)
    return json.loads(response.model_dump_json(exclude_unset=False))


if __name__ == "__main__":
    import vllm.entrypoints.openai.completion.protocol  # noqa: F401 - imported once, before the first question

    for line in sys.stdin:
        question = json.loads(line)
        kinds = {"requests": check_requests, "serve_args": check_serve_args, "reply": build_reply}
        answer = kinds[question["kind"]](question["data"])
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
