"""A request laid out for a runtime that runs its canvas elsewhere (vLLM, ``diffgemma_engine.vllm``): the prompt
ids, canvas and schedule the engine's own loop would run (``infill.lay_out``), and a rewrite's first canvas
renoised here with the request's seed (``diffgemma_engine.canvas.start.renoise_start``, the one statement of it),
its held positions pinned and its steps the part of the schedule its strength runs."""

from __future__ import annotations

from ..canvas.runtime import text_config_of
from ..canvas.start import renoise_start, start_step
from ..loading.model import LoadedModel
from ..shared import protocol
from ..vllm.completions import CanvasAsk
from .infill import LaidOut, lay_out, seeded, start_canvas


def canvas_ask(
    loaded: LoadedModel, request: protocol.Infill, time_left_ms: float | None = None
) -> tuple[CanvasAsk, LaidOut]:
    """What to ask the runtime for ``request``, and how it was laid out (``BadRequestError`` as ``lay_out``)."""
    laid = lay_out(loaded, request, time_left_ms)
    start = start_canvas(loaded, [request], [laid.row])
    if start is None or laid.row is None:
        ask = CanvasAsk(
            prompt_ids=laid.prompt_ids,
            canvas_length=laid.canvas_length,
            steps=laid.steps,
            candidates=request.candidates,
        )
        return ask, laid
    vocab_size = text_config_of(loaded.model.config).vocab_size
    first = renoise_start(start, vocab_size, seeded(loaded, request))
    ask = CanvasAsk(
        prompt_ids=laid.prompt_ids,
        canvas_length=laid.canvas_length,
        steps=start_step(request.strength, laid.steps),
        candidates=request.candidates,
        start_ids=first[0].tolist(),
        held=[position for position, held in enumerate(laid.row.held) if held],
    )
    return ask, laid
