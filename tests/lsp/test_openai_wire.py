"""The /v1/completions request checks and the remote backend's request bodies (no I/O)."""

from __future__ import annotations

import pytest

from diffgemma_engine.shared import protocol
from diffgemma_lsp.backends.remote import DEFAULT_MAX_TOKENS, OpenAIBackend
from diffgemma_lsp.endpoint.server import canvas_for
from diffgemma_lsp.endpoint.wire import ApiError, CompletionRequest, cut_at_stop, parse_completion_request
from diffgemma_lsp.fim_formats import split_prompt
from diffgemma_lsp.postprocess import postprocess


def insertion_text(prefix: str, suffix: str, raw: str) -> str:
    """What the endpoint inserts for ``raw``: ``Edit.insertion`` of its post-processed edit ("" for none)."""
    edit = postprocess(prefix, suffix, raw, "")
    return edit.insertion(suffix) if edit is not None else ""


def test_a_full_request() -> None:
    got = parse_completion_request(
        {"model": "m", "prompt": ["p"], "suffix": "s", "max_tokens": 8, "stop": "\n", "stream": True, "top_p": 0.9}
    )
    assert got == CompletionRequest(model="m", prompt="p", suffix="s", max_tokens=8, stop=("\n",), stream=True)


def test_n_choices() -> None:
    assert parse_completion_request({"prompt": "p", "n": 3, "best_of": 3}).n == 3


def test_nulls_take_defaults() -> None:
    got = parse_completion_request({"prompt": "p", "temperature": None, "max_tokens": None, "stop": None})
    assert got == CompletionRequest(model="", prompt="p")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ("text", None),
        ({}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "p", "max_tokens": True}, "max_tokens"),
        ({"prompt": "p", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "p", "suffix": 1}, "suffix"),
        ({"prompt": "p", "stop": [""]}, "stop"),
        ({"prompt": "p", "stop": [1]}, "stop"),
        ({"prompt": "p", "stream": "yes"}, "stream"),
        ({"prompt": "p", "n": 5}, "n"),
        ({"prompt": "p", "n": 0}, "n"),
        ({"prompt": "p", "n": 2, "best_of": 3}, "best_of"),
    ],
)
def test_bad_requests_name_the_field(body: object, param: str | None) -> None:
    with pytest.raises(ApiError) as caught:
        parse_completion_request(body)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert caught.value.body()["error"]["message"]


def test_cut_at_the_first_stop_sequence() -> None:
    assert cut_at_stop("a\nb;c", ("\n", ";")) == ("a", True)
    assert cut_at_stop("abc", ("x",)) == ("abc", False)


def test_canvas_for() -> None:
    assert canvas_for(None, 32) == 0
    assert canvas_for(256, 32) == 0
    assert canvas_for(8, 32) == 8


def test_insertion_text_never_repeats_the_closers_after_the_cursor() -> None:
    # The rest of the line is ")": the edit would replace it, but this API can only insert.
    for raw in ("2))", "2)"):
        inserted = insertion_text("print(add(1, ", ")\n", raw)
        assert "print(add(1, " + inserted + ")\n" == "print(add(1, 2))\n"
    assert insertion_text("x = ", "\n", "") == ""


def _infill(**fields: object) -> protocol.Infill:
    return protocol.Infill(id="1", uri="file:///a.py", prefix="def f():\n", suffix="\nf()\n", **fields)


def test_a_diffusion_gemma_server_gets_the_engines_fim_layout_and_the_diffusion_controls() -> None:
    """vLLM serving a DiffusionGemma FIM checkpoint: the prompt the engine's ``fim`` layout writes (its ids, once
    vLLM has tokenized it: ``test_the_diffusion_gemma_prompt_is_the_engines_fim_layout``), and the canvas width and
    step cap as vLLM's ``vllm_xargs``; none when the settings leave both to the server."""
    backend = OpenAIBackend("http://x/v1/completions", prompt_format="diffusion_gemma")
    body = backend.request_body(_infill(canvas_length=16, max_steps=6))
    assert body["prompt"] == "<bos><fim_suffix>\nf()\n<fim_prefix>def f():\n<fim_middle>"
    assert body["vllm_xargs"] == {"diffusion_canvas_length": 16, "diffusion_max_steps": 6}
    assert body["max_tokens"] == 16
    assert "vllm_xargs" not in backend.request_body(_infill())
    assert split_prompt(body["prompt"], None) == ("def f():\n", "\nf()\n")  # the endpoint reads it back


def test_the_diffusion_gemma_prompt_is_the_engines_fim_layout() -> None:
    """Tokenized as vLLM tokenizes a text prompt (the tokenizer's own call, special tokens parsed), the prompt is the
    ids the engine lays out for the same code."""
    from transformers import AutoTokenizer

    from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
    from diffgemma_engine.shared.prompt import PromptParts, build_fim_prompt, special_ids_from, text_encoder

    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    special = special_ids_from(tokenizer.convert_tokens_to_ids)
    assert special is not None
    prefix, suffix = "def add(a, b):\n", "\n\nprint(add(1, 2))\n"
    engine = build_fim_prompt(PromptParts(prefix=prefix, suffix=suffix), text_encoder(tokenizer), special, 512).ids
    body = OpenAIBackend("http://x/v1/completions", prompt_format="diffusion_gemma").request_body(
        protocol.Infill(id="1", uri="file:///a.py", prefix=prefix, suffix=suffix)
    )
    assert tokenizer(body["prompt"])["input_ids"] == engine


def test_remote_request_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    body = OpenAIBackend("http://x/v1/completions", model="dg").request_body(_infill())
    assert body == {
        "model": "dg",
        "prompt": "def f():\n",
        "suffix": "\nf()\n",
        "max_tokens": DEFAULT_MAX_TOKENS,
        "stream": False,
    }
    body = OpenAIBackend("http://x", prompt_format="star_coder").request_body(_infill(canvas_length=16))
    assert body["prompt"] == "<fim_prefix>def f():\n<fim_suffix>\nf()\n<fim_middle>"
    assert body["max_tokens"] == 16 and "model" not in body and "suffix" not in body
    assert body["stop"] == ["<fim_prefix>", "<fim_suffix>"]
    assert OpenAIBackend("http://x").request_body(_infill(candidates=3))["n"] == 3
    assert "vllm_xargs" not in body and "vllm_xargs" not in OpenAIBackend("http://x").request_body(_infill(max_steps=4))
    monkeypatch.setenv("MY_KEY", "k1")
    assert OpenAIBackend("http://x", api_key_env="MY_KEY")._headers() == {"Authorization": "Bearer k1"}
    monkeypatch.delenv("MY_KEY")
    assert OpenAIBackend("http://x", api_key_env="MY_KEY")._headers() == {}


async def test_each_request_carries_a_stable_session_key_per_user_and_file() -> None:
    """Issue 41: ``backend: openai`` in front of a team's replicas: every request says which user's file it is
    (``x-session-id``, a hash naming neither), the same for each request of a file, so that a cache-aware router
    keeps its prompt head on one replica."""
    from aiohttp import web

    from diffgemma_engine.shared.session_key import SESSION_HEADER, session_key
    from tests.support.openai_endpoint import serving_route

    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get(SESSION_HEADER))
        return web.json_response({"model": "m", "choices": [{"index": 0, "text": "x", "finish_reason": "stop"}]})

    async with serving_route("/v1/completions", answer) as url:
        backend = OpenAIBackend(url)
        try:
            for uri in ("file:///w/a.py", "file:///w/a.py", "file:///w/b.py"):
                await backend.infill(protocol.Infill(id="1", uri=uri, prefix="def f():\n"))
        finally:
            await backend.close()
    assert seen[0] == seen[1] == session_key("file:///w/a.py") != seen[2] == session_key("file:///w/b.py")
    assert session_key("file:///w/a.py", user="someone-else") != seen[0] and "a.py" not in str(seen[0])
