"""Several requests in one decoder pass give what each would get alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch
from transformers import DiffusionGemmaForBlockDiffusion

from diffgemma_engine.canvas.caches import PrefixCache, stack_views
from diffgemma_engine.loading.model import load_model
from diffgemma_engine.request.batch import compatible, run_batch
from diffgemma_engine.runtimes.own_loop import batch_row
from diffgemma_engine.service.jobs import Job
from diffgemma_engine.shared import protocol
from diffgemma_engine.training.configs import build_config
from tests.support.models import MEMORIZED_MIDDLE, MEMORIZED_PREFIX, MEMORIZED_SUFFIX


def test_padded_batch_matches_single_rows() -> None:
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(build_config("test", 8192, canvas_length=16, sliding_window=64)).eval()
    cache = PrefixCache(model)
    lengths = [100, 40, 70]  # longer and shorter than the sliding window
    views = [cache.prepare(row, torch.randint(20, 8000, (n,)).tolist())[0] for row, n in enumerate(lengths)]
    canvas = torch.randint(0, 8192, (3, 16))
    batched, padding = stack_views(views, cache.text_config)
    positions = torch.stack([torch.arange(n, n + 16, dtype=torch.int32) for n in lengths])
    mask = model.model.decoder.create_diffusion_decoder_attention_mask(
        config=model.config,
        inputs_embeds=canvas.unsqueeze(-1),
        cache=batched,
        decoder_attention_mask=torch.cat([padding, torch.ones(3, 16, dtype=torch.bool)], dim=1),
    )
    with torch.inference_mode():
        together = model(
            decoder_input_ids=canvas, cache=batched, decoder_position_ids=positions, decoder_attention_mask=mask
        ).logits
        for row in range(len(lengths)):
            alone = model(
                decoder_input_ids=canvas[row : row + 1], cache=views[row], decoder_position_ids=positions[row : row + 1]
            ).logits
            assert (together[row : row + 1] - alone).abs().max() < 1e-4


async def test_run_batch_serves_each_row_and_stops_a_cancelled_one(memorized_model_dir: Path) -> None:
    loaded = load_model(memorized_model_dir)
    loop = asyncio.get_running_loop()

    def job(index: int, prefix: str = MEMORIZED_PREFIX) -> Job:
        request = protocol.Infill(id=str(index), uri=f"file:///{index}.py", prefix=prefix, suffix=MEMORIZED_SUFFIX)
        return Job(request=request, key=(1, request.uri), loop=loop, future=loop.create_future())

    jobs = [job(0), job(1, "# a longer prompt than the others\n" * 3 + MEMORIZED_PREFIX), job(2), job(3)]
    assert all(compatible(jobs[0].request, other.request, loaded) for other in jobs[1:])
    jobs[3].cancel(protocol.StopReason.CANCELLED)
    results = run_batch(loaded, [batch_row(job) for job in jobs])
    assert [results[row][0] for row in (0, 2)] == [MEMORIZED_MIDDLE, MEMORIZED_MIDDLE]
    assert results[0][1] is protocol.StopReason.EOS
    assert results[3][1] is protocol.StopReason.CANCELLED and results[3][0] == "" and results[3][2].steps == 0
    assert results[1][2].prompt_tokens > results[0][2].prompt_tokens
    assert all(timings.tokenize_ms > 0 for _, _, timings in results[:3])
    seeded = Job(
        request=protocol.Infill(id="s", uri="u", prefix="x", seed=1),
        key=(1, "u"),
        loop=loop,
        future=loop.create_future(),
    )
    assert not compatible(jobs[0].request, seeded.request, loaded)
