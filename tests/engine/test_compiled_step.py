"""The compiled denoising step: the eager step's scores, for every shape the engine serves, without compiling on
the model thread; a compile that fails leaves the engine serving eagerly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from diffgemma_engine.canvas.warmup import trace_serving_shapes
from diffgemma_engine.loading.model import LoadedModel, load_model
from diffgemma_engine.request.batch import run_batch
from diffgemma_engine.request.infill import run_infill
from diffgemma_engine.runtimes.own_loop import batch_row
from diffgemma_engine.service.jobs import Job
from diffgemma_engine.shared import protocol
from tests.support.engine import EngineProcess, RawClient
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX

COMPILE_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def compiled(memorized_model_dir: Path) -> LoadedModel:
    """The memorized model with its step compiled; any call outside the warmed-up graphs raises."""
    loaded = load_model(memorized_model_dir)
    loaded.serving.step.start_compiling(warm_up=trace_serving_shapes)
    assert loaded.serving.step.wait(COMPILE_TIMEOUT_S), "compiling did not finish"
    assert loaded.serving.step.state == "compiled", loaded.serving.step.state
    loaded.serving.step = loaded.serving.step.without_fallback()
    return loaded


def _request(prefix: str = MEMORIZED_PREFIX, **fields: object) -> protocol.Infill:
    return protocol.Infill(id="t", uri="file:///t.py", prefix=prefix, suffix=MEMORIZED_SUFFIX, seed=0, **fields)


def test_compiled_scores_equal_the_eager_ones(compiled: LoadedModel) -> None:
    model = compiled.model
    cache = compiled.serving.prefix_cache.prepare("scores", torch.randint(20, 8000, (300,)).tolist())[0]
    with torch.inference_mode():  # as in denoise_canvas: the graphs are traced for inference tensors
        canvas = torch.randint(0, model.config.text_config.vocab_size, (1, 32))
        positions = torch.arange(300, 332, dtype=torch.int32)[None]
        mask = model.model.decoder.create_diffusion_decoder_attention_mask(
            config=model.config,
            inputs_embeds=canvas.unsqueeze(-1),
            cache=cache,
            decoder_attention_mask=torch.ones((1, 332), dtype=torch.bool),
        )
        temperature = torch.tensor(0.55)
        previous = compiled.serving.step.eager(canvas, None, mask, cache, positions, temperature).logits
        eager = compiled.serving.step.eager(canvas, previous, mask, cache, positions, temperature)
        fused = compiled.serving.step(canvas, previous, mask, cache, positions, temperature)
    assert torch.allclose(fused.logits, eager.logits, atol=1e-4)
    assert torch.allclose(fused.probs, eager.probs, atol=1e-5)
    assert torch.allclose(fused.entropy, eager.entropy, atol=1e-4)
    assert torch.equal(fused.best, eager.best)


def test_serving_shapes_need_no_new_graph(compiled: LoadedModel) -> None:
    run_infill(compiled, _request(MEMORIZED_PREFIX[:-3]), cache_key="a")
    text, _, timings = run_infill(compiled, _request(), cache_key="a")  # the next keystrokes: the prefix reused
    assert text == MEMORIZED_MIDDLE and timings.cached_tokens > 0
    longer_than_the_window = "x = 1\n" * 400 + MEMORIZED_PREFIX  # over 512 tokens: the sliding layers crop
    text, stop, timings = run_infill(compiled, _request(longer_than_the_window), cache_key="b")
    assert timings.prompt_tokens > 512 and timings.steps > 1
    text, stop, timings = run_infill(compiled, _request(canvas_length=16), cache_key="c")
    assert timings.steps > 1 and stop in (protocol.StopReason.EOS, protocol.StopReason.LENGTH)


async def test_a_batch_needs_no_new_graph(compiled: LoadedModel) -> None:
    loop = asyncio.get_running_loop()
    prefixes = [MEMORIZED_PREFIX, "# another file\n" * 5 + MEMORIZED_PREFIX]  # 2 rows: the warm-up traced 3
    jobs = [
        Job(request=_request(prefix), key=(row, "file:///t.py"), loop=loop, future=loop.create_future())
        for row, prefix in enumerate(prefixes)
    ]
    rows = [batch_row(job) for job in jobs]
    results = run_batch(compiled, rows)  # rows with different prompt lengths: a padded cache
    assert results[0][0] == MEMORIZED_MIDDLE  # row 1 is not the memorized prompt
    assert all(timings.steps > 1 for _, _, timings in results)
    candidates = run_batch(compiled, [rows[0]] * 2)  # one prompt twice, as for candidates: no padding at all
    assert [text for text, _, _ in candidates] == [MEMORIZED_MIDDLE] * 2


def test_a_failed_compile_keeps_serving_eagerly(memorized_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compiler(*args: object, **kwargs: object) -> object:
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    loaded = load_model(memorized_model_dir)
    loaded.serving.step.start_compiling(warm_up=trace_serving_shapes)
    assert loaded.serving.step.wait(60)
    assert loaded.serving.step.state == "failed: RuntimeError: no C++ compiler found"
    assert run_infill(loaded, _request())[0] == MEMORIZED_MIDDLE


async def test_the_engine_compiles_in_the_background_and_says_so(memorized_model_dir: Path, short_tmp: Path) -> None:
    engine = EngineProcess(memorized_model_dir, short_tmp / "e.sock", short_tmp / "e.log", ["--step", "compiled"])
    try:
        client = await RawClient.connect(engine.socket_path)
        await client.send(protocol.GetStats(id="s"))
        stats = await client.receive()
        assert isinstance(stats, protocol.Stats) and str(stats.compiled) in ("compiling", "compiled")
        await client.send(_request())  # served (eagerly, or compiled if already done) while compiling
        first = await client.receive()
        assert isinstance(first, protocol.Result) and first.text == MEMORIZED_MIDDLE
        assert await client.wait_compiled(COMPILE_TIMEOUT_S) == "compiled", engine.log()
        await client.send(_request())
        second = await client.receive()
        assert isinstance(second, protocol.Result) and second.text == MEMORIZED_MIDDLE
        assert "decoder compiled in" in engine.log()
        await client.close()
    finally:
        engine.stop()
