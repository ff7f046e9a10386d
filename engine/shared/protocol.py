"""The wire protocol between the language server and the engine.

Both processes use it (with ``diffgemma_engine.shared.socket_paths``, where the socket is). It imports only the standard
library, attrs and cattrs, so that the language server never loads torch.

Transport: a Unix domain socket in a per-user runtime directory (``diffgemma_engine.shared.socket_paths``). Framing
(``diffgemma_engine.shared.frames``, which encodes and parses these messages): a 4-byte big-endian length, then that
many bytes of UTF-8 JSON. Every message is a JSON object with a ``type`` tag.

Conversation::

    client                                   engine
    Hello{protocol, client, pid}      ->
                                      <-     HelloOk{protocol, model_id, ready, ...}   (or Error + close)
                                      <-     Ready{...}            (once, if HelloOk.ready was false)
    Infill{id, uri, prefix, suffix}   ->
    Cancel{id}                        ->     (idempotent)
    GetStats{id}                      ->
                                      <-     Stats{id, model_id, ready, recent latencies, ...}
                                      <-     Result{id, text, stop, timings}  or  Error{id, code, message}

Every Infill gets exactly one Result or Error. A newer Infill on the same connection for the same ``uri``
supersedes the older one, which then ends with ``stop = "superseded"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs

from .wire_values import ErrorCode as ErrorCode
from .wire_values import Layout as Layout
from .wire_values import Scope as Scope
from .wire_values import StepReport as StepReport
from .wire_values import StepState as StepState
from .wire_values import StopReason as StopReason

PROTOCOL_VERSION = 1
REWRITE_FEATURE = "rewrite"
"""``HelloOk.features`` member: the engine starts a canvas from ``Infill.start``."""
WINDOWS_FEATURE = "windows"
"""``HelloOk.features`` member: the engine rewrites ``Infill.windows`` in the batch of the request's own window."""
MAX_WINDOWS = 8
"""The most ``Infill.windows`` one request may carry (more are refused with ``bad_request``)."""
MAX_CANVAS_LENGTH = 512
MAX_STEPS = 256
"""The largest ``Infill.canvas_length`` and ``Infill.max_steps`` the engine accepts."""
MAX_START_CHARS_PER_TOKEN = 32
"""A rewrite's ``Infill.start`` holding more characters than this per token of its canvas cannot fit one canvas:
the engine refuses it before tokenizing it (``max_start_chars``), and the language server before sending it."""


QUANTIZATION_CHOICES: tuple[str, ...] = ("none", "int8", "fp8")
"""The quantizations an engine loads (``diffgemma-engine serve --quantization``), the one list of them: the
language server's ``quantization`` setting, the VS Code extension's choices and ``diffgemma-lsp openai`` offer
these, and "" for the checkpoint's own. An engine per quantization has its own socket."""


@attrs.frozen(kw_only=True)
class Chunk:
    """A piece of another file, given to the model as extra context."""

    filename: str
    text: str


@attrs.frozen(kw_only=True)
class StartSegment:
    """A piece of the text a rewrite's canvas starts from."""

    text: str
    keep: bool = False
    """Hold this text's tokens fixed through denoising: the model rewrites only the other segments."""


@attrs.frozen(kw_only=True)
class Timings:
    """Where a request's time went, measured by the engine."""

    queue_ms: float = 0.0
    """From arrival to the start of work."""
    tokenize_ms: float = 0.0
    """Prompt layout and tokenization."""
    encode_ms: float = 0.0
    """Prompt prefill into the cache."""
    denoise_ms: float = 0.0
    """All denoising steps, sampler included."""
    steps: int = 0
    """Denoising steps run (0: not known; vLLM does not report them)."""
    prompt_tokens: int = 0
    new_tokens: int = 0
    """Tokens in the completion, end-of-sequence excluded."""
    cached_tokens: int = 0
    """Prompt tokens whose encoding was reused from an earlier request."""

    @property
    def total_ms(self) -> float:
        """The engine's own time for the request: queue, tokenization, prefill and denoising."""
        return self.queue_ms + self.tokenize_ms + self.encode_ms + self.denoise_ms


@attrs.frozen(kw_only=True)
class Hello:
    """First message from a client."""

    TYPE: ClassVar[str] = "hello"
    protocol: int
    client: str = ""
    pid: int = 0


@attrs.frozen(kw_only=True)
class HelloOk:
    """The engine accepts the client."""

    TYPE: ClassVar[str] = "hello_ok"
    protocol: int
    model_id: str
    ready: bool
    """False while the model is still loading; a ``Ready`` follows."""
    device: str = ""
    canvas_length: int = 0
    max_prompt_tokens: int = 0
    layout: Layout = attrs.field(default=Layout.NOT_KNOWN, converter=Layout)
    """How the model is prompted."""
    features: list[str] = attrs.field(factory=list)
    """What this engine does beyond plain infills: ``REWRITE_FEATURE`` (``Infill.start``). An engine that predates
    a feature ignores its fields, so a client checks here first."""

    @property
    def instruct(self) -> bool:
        """Whether answers are an instruction model's, to unwrap before post-processing."""
        return self.layout is Layout.CHAT


@attrs.frozen(kw_only=True)
class Ready:
    """The model finished loading (sent to clients that connected before)."""

    TYPE: ClassVar[str] = "ready"
    model_id: str
    device: str = ""
    load_ms: float = 0.0
    canvas_length: int = 0
    max_prompt_tokens: int = 0
    layout: Layout = attrs.field(default=Layout.NOT_KNOWN, converter=Layout)
    """How the model is prompted."""


def max_start_chars(canvas_length: int) -> int:
    """The most characters a rewrite's ``Infill.start`` may hold for a canvas of ``canvas_length`` tokens (more are
    refused whatever the tokenizer makes of them)."""
    return canvas_length * MAX_START_CHARS_PER_TOKEN


MAX_DEADLINE_MS = 3_600_000
"""The longest ``Infill.deadline_ms`` accepted: an hour (a completion's is seconds; none is 0)."""
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
"""The ``Infill.seed`` values ``torch.Generator.manual_seed`` takes (a 64-bit integer, signed or not)."""


def _within(low: int, high: int) -> Callable[[object, attrs.Attribute[Any], int | None], None]:
    """An attrs validator: the value (if not None) from ``low`` to ``high``; ``ValueError`` naming the field."""

    def check(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
        if value is not None and not low <= value <= high:
            raise ValueError(f"{attribute.name} must be from {low} to {high}, got {value}")

    return check


MAX_INSTRUCTION_CHARS = 2_000
"""The longest ``Infill.instruction`` the engine accepts (a longer one is refused with ``bad_request``)."""


BLOCK_OPENERS = (":", "{", "(", "[")
"""A line that ends with one of these before the cursor is most likely followed by a block, not more line."""


def cursor_scope(prefix: str) -> Scope:
    """``Scope.LINE`` when code precedes the cursor on its line (the answer is the rest of it), else
    ``Scope.BLOCK``. The language server sends it; training draws its canvases by the same rule."""
    before = prefix[prefix.rfind("\n") + 1 :].rstrip()
    return Scope.LINE if before.strip() and not before.endswith(BLOCK_OPENERS) else Scope.BLOCK


@attrs.frozen(kw_only=True)
class Window:
    """Another place of a rewrite's document (``Infill.windows``): the text before it, after it, and its own."""

    prefix: str
    suffix: str = ""
    start: list[StartSegment] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class Infill:
    """Fill the middle between ``prefix`` and ``suffix``."""

    TYPE: ClassVar[str] = "infill"
    id: str
    uri: str
    prefix: str
    suffix: str = ""
    language_id: str = ""
    extra: list[Chunk] = attrs.field(factory=list)
    doc_version: int = 0
    canvas_length: int = 0
    """0: the model's default for ``scope``."""
    max_steps: int = 0
    """0: the model's default, scaled down with a canvas shorter than the model's own."""
    candidates: int = 1
    """Canvases to denoise in one batch for this prompt (1 to 4); the distinct answers come back as ``text``
    and ``alternatives``, for the editor to cycle through."""
    scope: Scope = attrs.field(default=Scope.MODEL, converter=Scope)
    """``Scope.LINE``: the cursor is inside a line and the answer is most likely the rest of it, so a model with a
    ``line_canvas_length`` hint uses that shorter canvas; otherwise the model's canvas. An unknown value is refused
    with ``bad_request`` when the frame is read."""
    deadline_ms: int = attrs.field(default=0, validator=_within(0, MAX_DEADLINE_MS))
    """0: no deadline. Otherwise the engine stops denoising this long after arrival."""
    seed: int | None = attrs.field(default=None, validator=_within(*SEED_RANGE))
    """Fixes the sampler's random stream, for reproducible results."""
    echo: bool = False
    """Return the prompt as the model saw it in ``Result.prompt`` (for debugging a layout)."""
    start: list[StartSegment] = attrs.field(factory=list)
    """A rewrite: the canvas starts from this text (the segments in order, tokenized one by one) instead of noise,
    and the answer replaces it. Empty: an insertion, denoised from noise."""
    strength: float = 1.0
    """With ``start``: the share of the canvas positions renoised at the start, in (0, 1]. The loop starts at the
    step of its schedule that matches it, so a light touch costs few steps; 1 denoises the same span from noise."""
    instruction: str = ""
    """With ``start``, for a chat-layout checkpoint: what to do with the text (it goes into the prompt). FIM
    checkpoints ignore it and re-fill the span."""
    refine: bool = False
    """With ``start``: the start is a shown suggestion the user typed into (refine as you type), not a selection to
    rewrite. The prompt is the insertion's at the cursor (the chat layout marks no selection and asks nothing), so
    it is the one the suggestion was computed with and its cached prefix serves again; the start only seeds the
    canvas."""
    windows: list[Window] = attrs.field(factory=list)
    """With ``start``: more places of the same document, each rewritten as this request's own window is (the same
    instruction, strength, extra chunks and candidates) and denoised in the same batch; answered in
    ``Result.windows``, in order (at most ``MAX_WINDOWS``; an engine without ``WINDOWS_FEATURE`` ignores them).
    A next edit's chain: the other places an edit implies, computed before the user jumps there."""


@attrs.frozen(kw_only=True)
class Cancel:
    """Stop request ``id`` at the next denoising step. Unknown or finished ids are ignored."""

    TYPE: ClassVar[str] = "cancel"
    id: str


@attrs.frozen(kw_only=True)
class GetStats:
    """Ask for the engine's health and recent figures (``diffgemma-lsp doctor``)."""

    TYPE: ClassVar[str] = "get_stats"
    id: str


RUNTIME_HEALTHY = "healthy"
"""``Stats.runtime_state`` of a vLLM that answers ``/health``."""


@attrs.frozen(kw_only=True)
class Stats:
    """The engine's health and recent figures."""

    TYPE: ClassVar[str] = "stats"
    id: str
    model_id: str
    device: str
    ready: bool
    uptime_s: float
    connections: int
    queued: int
    in_flight: int = 0
    """Requests held and not yet answered: the queued ones and those on the model thread."""
    replies: dict[str, int] = attrs.field(factory=dict)
    """Replies sent, by stop reason or error code."""
    recent_ms_p50: float = 0.0
    recent_ms_p95: float = 0.0
    """Engine time (queue + encode + denoise) over the last completed requests."""
    recent_count: int = 0
    last_error: str = ""
    rss_mb: float = 0.0
    compiled: StepReport = StepReport(StepState.NOT_LOADED)
    """How the denoising step runs."""
    step_ms_p50: float = 0.0
    """Denoising time per step over the last completed requests (0: none yet)."""
    max_steps: int = 0
    """The model's schedule: steps per completion at its own canvas."""
    min_steps: int = 0
    """The fewest of those a deadline leaves a completion (its answer means little below)."""
    load_ms: float = 0.0
    """How long loading the model took."""
    idle_exit_s: float = 0.0
    """The engine exits after this long without clients (0: never; -1: decided once the model has loaded)."""
    runtime_state: str = ""
    """With vLLM running the canvases: ``healthy``, or what it is doing instead (starting: its last output line;
    restarting: why it exited); "" for the engine's own loop."""
    seeds_reproduce: bool = True
    """Whether a request's seed reproduces its answer and candidates (False with vLLM running the canvases: it takes
    no seed for a diffusion model)."""
    runtime_notes: list[str] = attrs.field(factory=list)
    """What vLLM's replies leave out of the figures (the steps it ran, cached prompt tokens), once each."""


@attrs.frozen(kw_only=True)
class WindowResult:
    """The answer for one of ``Infill.windows``: as ``Result``'s ``text``, ``stop`` and ``alternatives``."""

    text: str
    stop: StopReason
    alternatives: list[str] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class Confident:
    """A run of an answer's characters and how sure the model was of them: for each canvas position that wrote them,
    the share of its denoising steps, counted back from the last, that its token has been the model's choice (the
    argmax; ``canvas.sampler.stable_steps``; 1 for a held token; the lowest, for characters made by several
    tokens). Conditioned on the text on both sides of the cursor, unlike a left-to-right model's probabilities.
    Through vLLM it is the token's probability at the last step instead (the one vLLM's reply gives: about 1
    wherever a canvas settled, right or wrong). benchmarks/README.md, "Which confidence", measures both."""

    chars: int
    """How many characters of the text, after the runs before it."""
    p: float
    """From 0 to 1."""


@attrs.frozen(kw_only=True)
class Result:
    """The completion for request ``id``."""

    TYPE: ClassVar[str] = "result"
    id: str
    text: str
    stop: StopReason
    timings: Timings = attrs.field(factory=Timings)
    alternatives: list[str] = attrs.field(factory=list)
    """With ``candidates`` > 1: the other distinct, non-empty answers."""
    prompt: str = ""
    """With ``echo``: the encoder's input decoded, control tokens included."""
    windows: list[WindowResult] = attrs.field(factory=list)
    """The answers for ``Infill.windows``, in order."""
    confidence: list[Confident] = attrs.field(factory=list)
    """``text``'s characters in runs, with the model's confidence in each (their ``chars`` add up to ``len(text)``).
    Empty: not known (an engine that predates it, or a runtime that did not report it)."""
    alternative_confidence: list[list[Confident]] = attrs.field(factory=list)
    """The same for each of ``alternatives``, in order (empty: not known)."""


@attrs.frozen(kw_only=True)
class Error:
    """A refused request (``id`` set) or a refused frame (``id`` None)."""

    TYPE: ClassVar[str] = "error"
    code: ErrorCode
    message: str
    id: str | None = None


Message = Hello | HelloOk | Ready | Infill | Cancel | GetStats | Stats | Result | Error
MESSAGE_TYPES: dict[str, type] = {
    cls.TYPE: cls for cls in (Hello, HelloOk, Ready, Infill, Cancel, GetStats, Stats, Result, Error)
}
