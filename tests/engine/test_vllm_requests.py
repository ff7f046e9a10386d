"""Issue 27: every request the engine would send vLLM, built by the engine's own code from real requests on real
checkpoints, admitted by vLLM 0.33's own code as ``vllm serve`` of that checkpoint admits it (``CompletionRequest``,
``to_sampling_params`` with its generation defaults, ``SamplingParams.verify`` with the served model's
``ModelConfig``, ``validate_diffusion_sampling_params``; in a venv of its own: tests/support/vllm_env.py), and a
reply built with vLLM's own response classes read back. A body vLLM would refuse fails here."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffgemma_engine.canvas.start import start_step
from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.loading.model import LoadedModel, load_facts, load_model
from diffgemma_engine.request.canvas_ask import canvas_ask
from diffgemma_engine.shared import protocol
from diffgemma_engine.vllm.completions import CanvasAsk, completion_body, read_reply
from diffgemma_engine.vllm.process import RECIPE_MAX_NUM_SEQS, serve_command
from tests.support.vllm_env import VllmChecker

RELEASE_VOCAB = 262144
"""The release's vocabulary (tests/data/release/config.json)."""


@pytest.fixture(scope="module")
def vllm(vllm_python: Path) -> Iterator[VllmChecker]:
    checker = VllmChecker(vllm_python)
    yield checker
    checker.close()


FOLDERS: dict[str, Path] = {"default": DEFAULT_MODEL_DIR}
"""Each loaded model's checkpoint folder, by its ``model_id``: what vLLM would serve."""


@pytest.fixture(scope="module")
def shipped() -> LoadedModel:
    """The shipped model: the FIM layout, with a line canvas (16) beside its own (32)."""
    return load_model(None)


@pytest.fixture(scope="module")
def release(release_random_dir: Path) -> LoadedModel:
    """The release's on-disk format: the chat layout, its canvas and 48-step schedule."""
    loaded = load_model(release_random_dir)
    FOLDERS[loaded.model_id] = release_random_dir
    return loaded


def _infill(**fields: object) -> protocol.Infill:
    values: dict[str, object] = {"id": "1", "uri": "file:///a.py", "prefix": "def add(a, b):\n    ", "suffix": "\n"}
    values.update(fields)
    return protocol.Infill(**values)  # type: ignore[arg-type]


def _case(loaded: LoadedModel, ask: CanvasAsk) -> dict[str, object]:
    body = completion_body(ask, model="google/diffusiongemma-26B-A4B-it", served_canvas=loaded.canvas_length)
    return {"body": body, "model_dir": str(FOLDERS[loaded.model_id]), "canvas_length": loaded.canvas_length}


def _checked(loaded: LoadedModel, ask: CanvasAsk, vllm: VllmChecker) -> dict:
    (verdict,) = vllm.requests([_case(loaded, ask)])
    assert verdict["ok"], verdict
    return verdict["params"]


def test_a_completion_is_the_engines_own_prompt_ids_and_schedule(
    shipped: LoadedModel, release: LoadedModel, vllm: VllmChecker
) -> None:
    for loaded in (shipped, release):
        ask, laid = canvas_ask(loaded, _infill(scope=protocol.Scope.BLOCK))
        params = _checked(loaded, ask, vllm)
        assert params["prompt"] == laid.prompt_ids and len(laid.prompt_ids) > 10
        assert params["extra_args"] == {"diffusion_max_steps": loaded.sampler.max_steps}  # the served canvas
        assert params["max_tokens"] == loaded.canvas_length and params["n"] == 1
        assert params["return_token_ids"] is True and params["skip_special_tokens"] is False
        assert params["logprobs"] == 0  # each emitted token's logprob: its confidence


def test_the_rest_of_a_line_asks_for_the_line_canvas(shipped: LoadedModel, vllm: VllmChecker) -> None:
    ask, laid = canvas_ask(shipped, _infill(prefix="def add(a, b):\n    return a", scope=protocol.Scope.LINE))
    params = _checked(shipped, ask, vllm)
    assert laid.canvas_length == shipped.line_canvas_length == 16
    assert params["extra_args"]["diffusion_canvas_length"] == 16 and params["max_tokens"] == 16
    assert params["extra_args"]["diffusion_max_steps"] == laid.steps < shipped.sampler.max_steps


def test_a_rewrite_is_a_seed_canvas_with_its_kept_text_pinned(release: LoadedModel, vllm: VllmChecker) -> None:
    segments = [
        protocol.StartSegment(text="    total = a + b\n", keep=True),
        protocol.StartSegment(text="    return totl\n"),
    ]
    request = _infill(start=segments, strength=0.5, seed=7)
    ask, laid = canvas_ask(release, request)
    params = _checked(release, ask, vllm)
    extra = params["extra_args"]
    assert laid.row is not None
    seed_canvas, pinned = extra["diffusion_seed_canvas"], extra["diffusion_pinned"]
    assert len(seed_canvas) == laid.canvas_length and pinned == [i for i, held in enumerate(laid.row.held) if held]
    assert pinned and all(seed_canvas[i] == laid.row.tokens[i] for i in pinned)  # kept text is never renoised
    free = [i for i in range(laid.canvas_length) if i not in pinned]
    renoised = sum(seed_canvas[i] != laid.row.tokens[i] for i in free)
    assert 0 < renoised <= len(free) // 2 + 1  # about half the rest, drawn with the request's seed
    assert extra["diffusion_max_steps"] == start_step(0.5, laid.steps) < laid.steps
    assert canvas_ask(release, request)[0] == ask  # the seed makes the renoised canvas the same every time


def test_candidates_deadlines_and_seeded_requests(
    shipped: LoadedModel, release: LoadedModel, vllm: VllmChecker
) -> None:
    """Issue 41: a seeded request (``doctor --probe`` sends seed 0) is admitted by vLLM for the served diffusion
    model: vLLM refuses ``seed`` for one (``SamplingParams._validate_diffusion``), so the engine sends none."""
    release.serving.clock.observe(release.canvas_length, 5.0, 480.0, 48)  # 10 ms a step, as vLLM's timings will say
    asks = [
        canvas_ask(release, _infill(candidates=3, seed=5))[0],
        canvas_ask(release, _infill(), time_left_ms=0.0)[0],  # no time left: the floor of the schedule
        canvas_ask(release, _infill(seed=(1 << 64) - 1))[0],
        canvas_ask(release, _infill(seed=0))[0],
    ]
    cases = [_case(release, ask) for ask in asks] + [_case(shipped, canvas_ask(shipped, _infill(seed=0))[0])]
    verdicts = vllm.requests(cases)
    assert all(verdict["ok"] for verdict in verdicts), verdicts
    candidates, deadline, *seeded = (verdict["params"] for verdict in verdicts)
    assert candidates["n"] == 3
    assert deadline["extra_args"]["diffusion_max_steps"] == release.step_floor(release.sampler.max_steps)
    assert all(params["seed"] is None for params in [candidates, *seeded])


def test_vllm_refuses_what_it_should(release: LoadedModel, vllm: VllmChecker) -> None:
    """The check can fail: a seed canvas one id short, an id past the vocabulary, a seed (any seed: vLLM takes
    none for a diffusion model)."""
    ask = canvas_ask(release, _infill(start=[protocol.StartSegment(text="x = 1\n")]))[0]
    assert ask.start_ids is not None
    short = _case(release, ask)
    short["body"]["vllm_xargs"]["diffusion_seed_canvas"] = ask.start_ids[:-1]  # type: ignore[index]
    past = _case(release, ask)
    past["body"]["vllm_xargs"]["diffusion_seed_canvas"] = [RELEASE_VOCAB, *ask.start_ids[1:]]  # type: ignore[index]
    seeded = _case(release, canvas_ask(release, _infill())[0])
    seeded["body"]["seed"] = 0  # type: ignore[index]
    verdicts = vllm.requests([short, past, seeded])
    assert [verdict["ok"] for verdict in verdicts] == [False, False, False], verdicts
    assert "must hold exactly" in verdicts[0]["error"] and "ids must be in" in verdicts[1]["error"]
    assert "seed" in verdicts[2]["error"] and "not yet supported with diffusion models" in verdicts[2]["error"]


def test_a_reply_built_by_vllm_is_read_in_order_with_its_cached_share(vllm: VllmChecker) -> None:
    spec = {
        "model": "m",
        "choices": [
            {"token_ids": [5, 6, 1], "text": "ab", "finish_reason": "stop"},
            {"token_ids": [7, 8], "text": "cd", "finish_reason": "length"},
        ],
        "prompt_tokens": 40,
        "cached_tokens": 32,
    }
    reply = read_reply(vllm.reply(spec), candidates=2)
    assert [choice.token_ids for choice in reply.choices] == [[5, 6, 1], [7, 8]]
    assert [choice.finished_by_length for choice in reply.choices] == [False, True]
    assert (reply.prompt_tokens, reply.cached_tokens) == (40, 32)
    unreported = read_reply(vllm.reply({**spec, "cached_tokens": None}), candidates=2)  # vLLM without the option
    assert (unreported.prompt_tokens, unreported.cached_tokens) == (40, None)  # not known: not 0


def test_each_tokens_confidence_is_read_from_vllms_logprobs(vllm: VllmChecker) -> None:
    """``logprobs: 0`` is asked for (vLLM admits it for a diffusion model) and each choice's ``token_logprobs``, the
    converging step's logprob of each emitted token, come back as probabilities; a reply without them, or with the
    wrong count, is read with the confidence unknown."""
    spec = {
        "model": "m",
        "choices": [
            {"token_ids": [5, 6, 1], "text": "ab", "finish_reason": "stop", "logprobs": [0.0, -0.5, -9999.0]},
            {"token_ids": [7, 8], "text": "cd", "finish_reason": "length", "logprobs": [-1.0]},
            {"token_ids": [9], "text": "e", "finish_reason": "length"},
        ],
        "prompt_tokens": 40,
        "cached_tokens": 32,
    }
    reply = read_reply(vllm.reply(spec), candidates=3)
    first = reply.choices[0].confidence
    assert first is not None and first[0] == 1.0 and first[1] == pytest.approx(math.exp(-0.5)) and first[2] < 1e-9
    assert reply.choices[1].confidence is None and reply.choices[2].confidence is None


def test_the_facts_alone_lay_out_the_same_requests(release: LoadedModel, release_random_dir: Path) -> None:
    """``serve --runtime vllm`` reads the checkpoint without its weights (``load_facts``: the model on the meta
    device) and asks vLLM exactly what the loaded model would have: a completion and a seeded rewrite."""
    facts = load_facts(release_random_dir)
    assert {parameter.device.type for parameter in facts.model.parameters()} == {"meta"}
    assert (facts.canvas_length, facts.sampler, facts.eos_ids, facts.layout.name) == (
        release.canvas_length,
        release.sampler,
        release.eos_ids,
        release.layout.name,
    )
    rewrite = _infill(start=[protocol.StartSegment(text="    return totl\n")], strength=0.5, seed=11)
    for request in (_infill(), rewrite):
        assert canvas_ask(facts, request)[0] == canvas_ask(release, request)[0]


def test_the_command_that_starts_vllm_is_read_by_vllms_own_parser(
    release: LoadedModel, release_random_dir: Path, vllm: VllmChecker
) -> None:
    """``serve --runtime vllm --vllm-command`` runs ``vllm serve`` with the recipe's options: vLLM 0.33's own
    parser reads the served canvas and schedule, the socket, the sequences, prefix caching and tensor parallelism
    from it; an option it does not know would be refused here."""
    folder, socket_path = release_random_dir, Path("/run/user/1000/diffgemma/engine.vllm.sock")
    for tensor_parallel in (1, 2):
        command = serve_command(
            Path("/opt/vllm/bin/vllm"),
            folder,
            socket_path,
            release.canvas_length,
            release.sampler.max_steps,
            tensor_parallel,
        )
        assert command[:2] == ["/opt/vllm/bin/vllm", "serve"]
        assert vllm.serve_args(command[2:]) == {
            "model": str(folder),
            "uds": str(socket_path),
            "canvas_length": release.canvas_length,
            "max_denoising_steps": 48,
            "max_num_seqs": RECIPE_MAX_NUM_SEQS,
            "tensor_parallel_size": tensor_parallel,
            "enable_prefix_caching": True,
            "enable_prompt_tokens_details": True,  # issue 41: else vLLM's replies say nothing of the cached share
        }
    assert "error" in vllm.serve_args([str(folder), "--diffusion-canvas", "256"])  # the checker can refuse
