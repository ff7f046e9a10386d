"""User settings, from ``initializationOptions`` and ``workspace/didChangeConfiguration``.

Keys are camelCase on the wire (``canvasLength``). A setting with a bad value is reported and replaced by
its default; the other settings keep their values. Every key is documented in README.md (a test keeps the
two in sync).
"""

from __future__ import annotations

import os
import typing
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from diffgemma_engine.shared import protocol, serve_options, socket_paths
from diffgemma_lsp.fim_formats import PROMPT_FORMATS

KEY_ENV_PATTERN = r"([A-Z][A-Z0-9_]*API_KEY)?"
"""An API key's environment variable: empty (no key), or an upper-case name ending in API_KEY."""

SECTION = "diffgemma"
"""Settings may arrive nested under this key (``{"diffgemma": {...}}``) or flat."""


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be 0 or more, got {value}")


def _at_most(limit: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    """0 or more and at most ``limit`` (the engine's own limit, or what fits in one wire frame)."""

    def check(_: object, attribute: attrs.Attribute[int], value: int) -> None:
        _positive(_, attribute, value)
        if value > limit:
            raise ValueError(f"{attribute.name} must be at most {limit}, got {value}")

    return check


def _share(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    """Above 0 and at most 1 (NaN is neither)."""
    if not 0 < value <= 1:
        raise ValueError(f"{attribute.name} must be above 0 and at most 1, got {value}")


def _probability(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    """From 0 to 1 (NaN is neither)."""
    if not 0 <= value <= 1:
        raise ValueError(f"{attribute.name} must be from 0 to 1, got {value}")


RUNTIMES = serve_options.RUNTIMES
"""The engine's --runtime choices, as the engine declares them (``diffgemma_engine.shared.serve_options``)."""
STEP_MODES = serve_options.STEP_MODES
"""The engine's --step choices, as the engine declares them."""
QUANTIZATIONS = ("", *protocol.QUANTIZATION_CHOICES)
"""The engine's --quantization choices ("": not given, the checkpoint's own)."""
MAX_IDLE_EXIT_MINUTES = 527_040
"""A year: an engine kept longer is one kept for good (0)."""
MAX_DEBOUNCE_MS = 10_000
"""An automatic completion waits at most 10 s for the user to pause (beyond, it is never answered)."""
MAX_CONTEXT_TOKENS = 262_144
"""The released model's context; at four characters a token, 1 MiB of text, well within one 8 MiB frame."""


@attrs.frozen(kw_only=True)
class Settings:
    """What a user can configure."""

    enable: bool = True
    """Answer completion requests at all."""
    model: str | None = attrs.field(default=None, validator=lambda _, __, value: _check_model(value))
    """Checkpoint folder, or hub id (``owner/name``, pulled into huggingface_hub's cache), for an engine this
    server starts (default: the shipped model)."""
    device: str = "auto"
    """Device for an engine this server starts: auto, cpu, mps, cuda, cuda:N, cuda:0,1 (cpu or disk after the
    GPUs offload the rest)."""
    quantization: str = attrs.field(default="", validator=attrs.validators.in_(QUANTIZATIONS))
    """Weights of an engine this server starts: "" (the checkpoint's own), none, int8 (torchao) or fp8 (CUDA 8.9+)."""
    runtime: str = attrs.field(default="auto", validator=attrs.validators.in_(RUNTIMES))
    """What runs the canvases in an engine this server starts: auto (vLLM where there is a CUDA device and a
    ``vllm`` to run, else the engine's own loop), transformers (the engine's own loop), vllm."""
    vllm_command: str = attrs.field(default="", validator=lambda _, __, value: _check_executable(value))
    """With runtime auto or vllm: the ``vllm`` executable of a vLLM installation, as an absolute path ("": ``vllm``
    on PATH)."""
    step_mode: str = attrs.field(default="auto", validator=attrs.validators.in_(STEP_MODES))
    """How an engine this server starts runs its denoising step with its own loop: auto (captured on a CUDA device,
    eager elsewhere), eager, compiled, captured."""
    engine_idle_exit_minutes: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_at_most(MAX_IDLE_EXIT_MINUTES))
    )
    """An engine this server starts exits after this many minutes without clients; 0: never; None (null): by what
    reloading costs, 15 minutes for a model that loads in 10 s or less, 8 hours for a slower one."""
    canvas_length: int = attrs.field(default=0, validator=_at_most(protocol.MAX_CANVAS_LENGTH))
    """Tokens in the canvas (the longest completion); 0: the model's own."""
    steps: int = attrs.field(default=0, validator=_at_most(protocol.MAX_STEPS))
    """Most denoising steps per completion; 0: the model's own."""
    refine_steps: int = attrs.field(default=1, validator=_at_most(protocol.MAX_STEPS // 2))
    """When the user types into a shown suggestion something it does not start with, the steps that refine it (the
    canvas starts from the suggestion, the typed characters held); 0: off, a new completion from noise instead.
    The default is measured (``benchmarks/typing_replay.py``): 1 step keeps as much of the typed text on screen
    before it is typed as a new completion does, at a quarter of its steps."""
    context_tokens: int = attrs.field(default=1024, validator=_at_most(MAX_CONTEXT_TOKENS))
    """Prompt budget in tokens for the text around the cursor."""
    extra_context_tokens: int = attrs.field(default=256, validator=_at_most(MAX_CONTEXT_TOKENS))
    """Prompt budget in tokens for chunks of other recently opened, edited or saved files; 0: none."""
    edit_history_tokens: int = attrs.field(default=256, validator=_at_most(MAX_CONTEXT_TOKENS))
    """Prompt budget in tokens for the recent edits of the open documents (unified-diff hunks, newest kept); 0:
    none."""
    repo_context_tokens: int = attrs.field(default=512, validator=_at_most(MAX_CONTEXT_TOKENS))
    """Prompt budget in tokens for context from the workspace index: the definitions of the names the code around
    the cursor uses (found in the workspace's other files with tree-sitter), then code like the lines before the
    cursor, and last the definition of the name at the cursor; 0: none, and no index is built."""
    debounce_ms: int = attrs.field(default=75, validator=_at_most(MAX_DEBOUNCE_MS))
    """Wait this long after an automatic request before asking the model; a newer request replaces it."""
    deadline_ms: int = attrs.field(default=2000, validator=_at_most(protocol.MAX_DEADLINE_MS))
    """The engine stops denoising after this long and returns its best canvas; 0: no deadline."""
    candidates: int = attrs.field(default=3, validator=[attrs.validators.ge(1), attrs.validators.le(4)])
    """Completions computed in one batch for an explicitly invoked inline completion, to cycle through (1 to 4);
    typing and the completion menu compute one."""
    min_confidence: float = attrs.field(default=0.0, validator=_probability)
    """How sure the model must be of what it suggests (0 to 1; 0: show everything): a suggestion is cut before its
    first character under it and withheld when its start is under it; a rewrite whose replacement is under it on
    average is not applied, and the user is told why. The model's confidence (``Result.confidence``) is, per canvas
    position, the share of the denoising steps its token has been the model's choice (through vLLM: its probability
    at the last step); an answer without one is never gated. Off by default, from the measurement: on the shipped model
    0.5 refuses wrong rewrites and no right one, but any threshold withholds right suggestions with the wrong ones
    (benchmarks/README.md, "Which confidence")."""
    backend: str = attrs.field(default="engine", validator=attrs.validators.in_(("engine", "openai")))
    """engine: the local engine (started when none runs); openai: an OpenAI-compatible server at openaiUrl."""
    openai_url: str = attrs.field(default="", validator=lambda _, __, value: _check_url(value))
    """With backend openai: the server's completions URL, e.g. https://gpu-box:8000/v1/completions."""
    openai_model: str = ""
    """With backend openai: the model name the server expects (vLLM: the served model name)."""
    openai_api_key_env: str = attrs.field(
        default="DIFFGEMMA_API_KEY", validator=attrs.validators.matches_re(KEY_ENV_PATTERN)
    )
    """With backend openai: the environment variable that holds the API key (the key never goes in settings); its
    name must end in ``API_KEY``, so that settings cannot send another secret (``AWS_SECRET_ACCESS_KEY``) as the
    key."""
    openai_prompt_format: str = attrs.field(default="suffix", validator=attrs.validators.in_(PROMPT_FORMATS))
    """With backend openai: suffix (prompt plus suffix field), or a FIM format: star_coder, qwen, code_llama, ..."""
    rewrite_enabled: bool = True
    """Offer the "Rewrite selection" code action on a non-empty selection, and run its command."""
    rewrite_strength: float = attrs.field(default=0.6, validator=_share)
    """Share of the selection's canvas renoised at the start of a rewrite, above 0 and at most 1 (1: written anew
    from noise, as an insertion of the same span would be)."""
    next_edit_enabled: bool = True
    """Answer ``diffgemma/nextEdit`` and offer "Apply suggested edit"."""
    next_edit_lines: int = attrs.field(default=10, validator=_at_most(50))
    """Lines above and below the cursor in a next edit's editable window."""
    next_edit_on_pause: bool = False
    """Also compute a next edit when a burst of editing ends (2 s without a change), for editors that never ask
    (Helix, Zed): offered as the code action "Apply suggested edit"."""
    next_edit_strength: float = attrs.field(default=0.3, validator=_share)
    """Share of a next edit's window renoised at the start (small: most of the window is kept)."""
    next_edit_draws: int = attrs.field(default=2, validator=[attrs.validators.ge(1), attrs.validators.le(4)])
    """How sure the model must be of a next edit: the draws (canvas rows of one batch, 1 to 4) that must all write
    the same edit for it to be suggested; 1 suggests whatever one draw writes (eager)."""
    rewrite_steps: int = attrs.field(default=0, validator=_at_most(protocol.MAX_STEPS))
    """Most denoising steps per rewrite (of which about ``rewrite_strength`` run); 0: the model's own."""
    private_files: tuple[str, ...] = attrs.field(default=(), validator=lambda _, __, value: _check_patterns(value))
    """More files that never go into a prompt, as gitignore patterns (``*.sql``, ``secrets/``), besides those git
    ignores, hidden ones, files outside the workspace folders and secrets (``.env*``, keys, credential stores)."""

    def backend_key(self) -> tuple[str, ...]:
        """What identifies the backend: when it changes, the server connects anew (to another engine, when the
        model or device changed: each (model, device) has its own engine)."""
        if self.backend == "engine":
            engine = (self.model or "", self.device, self.quantization, self.runtime, self.vllm_command, self.step_mode)
            return (self.backend, *engine)
        return (self.backend, self.openai_url, self.openai_model, self.openai_api_key_env, self.openai_prompt_format)


def _check_model(value: str | None) -> None:
    """A folder (one that is here, or an absolute or ``~`` path: the engine says what is wrong with it) or a hub
    id; anything else is a typo the engine could only fail on."""
    if value is None or socket_paths.is_hub_id(value) or os.path.isdir(value) or value.startswith(("/", "~")):
        return
    raise ValueError(
        f"expected a checkpoint folder or a hub id (owner/name, e.g. google/diffusiongemma-26B-A4B-it), got {value!r}"
    )


def _check_executable(value: str) -> None:
    """An absolute path (or ``~``): a relative one would be found from wherever the editor started the server."""
    if value and not os.path.isabs(os.path.expanduser(value)):
        raise ValueError(f"expected the absolute path of the vllm executable, got {value!r}")


MAX_PATTERNS = 1_000
MAX_PATTERN_CHARS = 1_000


def _check_patterns(value: tuple[str, ...]) -> None:
    if len(value) > MAX_PATTERNS or any(len(pattern) > MAX_PATTERN_CHARS for pattern in value):
        raise ValueError(f"expected at most {MAX_PATTERNS} patterns of at most {MAX_PATTERN_CHARS} characters each")


def _check_url(value: str) -> None:
    if value and urllib.parse.urlsplit(value).scheme not in ("http", "https"):
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


WIRE_KEYS: dict[str, str] = {_camel(field.name): field.name for field in attrs.fields(Settings)}
"""camelCase key -> attribute name."""


def _check_type(value: Any, kind: type) -> Any:
    if kind is bool and not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"expected an integer, got {value!r}")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)
    if kind is str and not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def parse_settings(raw: object) -> tuple[Settings, list[str]]:
    """Settings from a client payload (missing keys take defaults); returns them with one message per bad key."""
    base = Settings()
    if isinstance(raw, Mapping) and isinstance(raw.get(SECTION), Mapping | list):
        raw = raw[SECTION]
    if raw is None or raw == []:  # an empty Lua table ({}, Neovim's `settings = {}`) goes as a JSON array
        return base, []
    if not isinstance(raw, Mapping):
        return base, [f"settings must be an object, got {type(raw).__name__}"]
    problems: list[str] = []
    values: dict[str, Any] = {}
    types = typing.get_type_hints(Settings)  # the fields' annotations as types (this module's are strings)
    for key, value in raw.items():
        name = WIRE_KEYS.get(key)
        if name is None:
            problems.append(f"unknown setting {key!r} (known: {', '.join(sorted(WIRE_KEYS))})")
            continue
        kind = types[name]
        try:
            if kind == str | None:
                values[name] = None if value is None else _check_type(value, str)
            elif kind == int | None:
                values[name] = None if value is None else _check_type(value, int)
            elif kind == tuple[str, ...]:
                if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                    raise TypeError(f"expected a list of strings, got {value!r}"[:300])
                values[name] = tuple(value)
            else:
                values[name] = _check_type(value, kind)
            attrs.evolve(base, **{name: values[name]})  # runs the field's validator
        except (TypeError, ValueError) as exc:
            values.pop(name, None)
            problems.append(f"setting {key!r}: {exc}; using the default {getattr(Settings(), name)!r}")
    return attrs.evolve(base, **values), problems
