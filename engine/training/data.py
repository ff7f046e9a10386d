"""Training examples in the engine's fill-in-the-middle layout, drawn from the machine's source files.

Each example is one token sequence::

    <bos> <fim_suffix> SUFFIX <fim_prefix> PREFIX <fim_middle> | MIDDLE <eos> <pad> ... <pad>
    '--------------- prompt (diffgemma_engine.shared.prompt.build_fim_prompt) -----'  '------ canvas (C tokens) -----'

with a block layout for the full-sequence block-diffusion step: the canvas is one block that starts right after
``<fim_middle>`` (exactly where the engine's canvas starts), and the prompt is cut into canvas-sized blocks
counted backwards from there (the first block may be shorter). Every block is denoised against the clean tokens
before it, so the prompt teaches code and the canvas teaches the infill task, EOS and the padding after it.

Middles are what a completion fills (``MIDDLE_KINDS``): one whole line (as in HumanEval single-line infilling), a
few whole lines, plain continuation (empty suffix), the rest of a line from a cursor at any character inside it
(inside a word too), or a span from such a cursor to any character of the next lines. Each example's canvas is the
one the engine would take for its cursor (the line canvas for the rest of a line). A fifth of the examples use
the PSM order (prefix first) instead of the engine's SPM order.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..shared import protocol, vocab
from ..shared.prompt import PromptParts, build_fim_prompt, special_ids_from, text_encoder
from .corpus import EXTENSIONS, default_roots, is_held_out, iter_sources

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PAD = vocab.SPECIAL_IDS[vocab.PAD]
EOS = vocab.SPECIAL_IDS[vocab.EOS]
_EXCLUDE = re.compile(r"human_?eval", re.IGNORECASE)

# Share of examples per language group; HumanEval is Python, so Python dominates.
LANGUAGE_WEIGHTS = {"python": 0.85, "other": 0.15}


@dataclass
class FileEntry:
    path: str
    chars: int
    language: str
    held_out: bool
    text: str | None = None
    """The file's text when it comes from a packed corpus (``diffgemma_engine.training.pack``); else read from
    ``path``."""


def _usable(text: str) -> bool:
    """Skip generated / minified / data-like files."""
    if len(text) < 200:
        return False
    lines = text.splitlines()
    return max(map(len, lines)) <= 400 and len(text) / max(len(lines), 1) <= 80


def build_file_list(cache_file: Path) -> list[FileEntry]:
    """All usable source files of ``default_roots()`` (deduplicated), cached as JSON."""
    if cache_file.exists():
        return [FileEntry(**row) for row in json.loads(cache_file.read_text())]
    entries = []
    for path, text in iter_sources(default_roots()):
        if _EXCLUDE.search(str(path)) or not _usable(text):
            continue
        entries.append(FileEntry(str(path), len(text), EXTENSIONS[path.suffix], is_held_out(path)))
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text(json.dumps([e.__dict__ for e in entries]))
    return entries


def load_pack(path: Path) -> list[FileEntry]:
    """The entries of a packed corpus (``diffgemma_engine.training.pack``), texts included: for a machine without the
    sources this one has (a lent GPU machine)."""
    with gzip.open(path, "rt", encoding="utf-8") as rows:
        return [FileEntry(**json.loads(row)) for row in rows]


def corpus_summary(entries: list[FileEntry]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "files": len(entries),
        "chars": sum(e.chars for e in entries),
        "held_out_files": sum(e.held_out for e in entries),
        "held_out_chars": sum(e.chars for e in entries if e.held_out),
        "by_language": {},
    }
    for e in entries:
        row = out["by_language"].setdefault(e.language, {"files": 0, "chars": 0})
        row["files"] += 1
        row["chars"] += e.chars
    return out


@dataclass
class Example:
    ids: list[int]
    prompt_len: int  # the canvas block starts here
    middle_text: str
    kind: str
    prefix: str = ""
    """The text before the cursor that the prompt holds (before the budget's cut)."""
    suffix: str = ""
    """The text after the middle that the prompt holds (before the budget's cut)."""

    @property
    def canvas(self) -> int:
        """The canvas length: every id after the prompt is the canvas (middle, <eos>, <pad>...)."""
        return len(self.ids) - self.prompt_len


MIDDLE_KINDS = {"line": 0.30, "lines": 0.15, "continuation": 0.10, "rest_of_line": 0.30, "span": 0.15}
"""Share of examples per kind of middle (``ExampleMaker``). The cursor is at a line start for the first three
(block-level middles); at any character after the line's indentation, inside a word too, for the last two."""
SPAN_LINES = 2
"""A ``span`` middle ends at a character of its own line or of the next two."""


class ExampleMaker:
    """Turns source files into FIM examples; all randomness comes from the ``random.Random`` passed in.

    The cursor goes where typing puts it. Block-level middles start at a line start: one whole line, a few whole
    lines, or plain continuation (no suffix). The others start at any character inside a line, in the middle of a
    word too (character-level FIM, as StarCoder and SantaCoder train): ``rest_of_line`` fills up to the end of the
    line, ``span`` ends at any character of that line or the next two. Text is cut and encoded as the engine cuts
    and encodes a request's (``diffgemma_engine.shared.prompt``: the same encoder, line boundaries at the far ends), so
    the prompt's last token is the partial word the engine would see.

    Each example's canvas is the one the engine would denoise for it: ``line_canvas`` when the cursor's scope is
    the rest of a line (``protocol.cursor_scope``, the model's ``line_canvas_length``), else ``canvas``. A middle
    longer than its canvas is cut back: whole lines for block-level middles, characters for the others.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        canvas: int,
        min_ctx: int = 96,
        max_ctx: int = 320,
        line_canvas: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.canvas = canvas
        self.line_canvas = min(line_canvas or canvas, canvas)
        self.min_ctx, self.max_ctx = min_ctx, max_ctx
        # as the engine reads them (diffgemma_engine.shared.prompt.layout_for)
        special = special_ids_from(tokenizer.get_vocab().get)
        if special is None:
            raise ValueError(f"the tokenizer lacks {vocab.FIM_PREFIX}, {vocab.FIM_SUFFIX} or {vocab.FIM_MIDDLE}")
        self.special = special
        self._encode = text_encoder(tokenizer)  # the engine's: special tokens written in code stay text

    def encode(self, text: str) -> list[int]:
        return self._encode(text) if text else []

    def _choose_middle(self, text: str, rng: random.Random) -> tuple[int, int, str] | None:
        """(start, end, kind) character offsets of the middle."""
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        starts = [s for s in starts if s < len(text)]
        if len(starts) < 4:
            return None

        def line_end(s: int) -> int:
            """Where the line at ``s`` ends: after its newline, else at the end of the text."""
            return (text.find("\n", s) + 1) or len(text)

        def after_lines(start: int, count: int) -> int:
            """The end of the ``count`` lines from ``start`` (fewer at the end of the text)."""
            end = start
            for _ in range(count):
                if end >= len(text):
                    break
                end = line_end(end)
            return end

        kind = rng.choices(list(MIDDLE_KINDS), weights=list(MIDDLE_KINDS.values()))[0]
        # avoid blank lines as middles most of the time
        for _ in range(8):
            i = rng.randrange(1, len(starts))
            s = starts[i]
            if text[s : line_end(s)].strip():
                break
        if kind == "line":
            return s, line_end(s), kind
        if kind == "lines":
            return s, after_lines(s, rng.randint(2, 6)), kind
        if kind == "continuation":
            return s, after_lines(s, rng.randint(1, 3)), kind
        e = line_end(s)
        content = text[s:e].rstrip("\n")
        indent = len(content) - len(content.lstrip())
        if len(content) - indent < 2:
            return s, e, "line"
        cursor = rng.randint(s + indent + 1, s + len(content) - 1)  # after the line's first character of code
        if kind == "rest_of_line":
            return cursor, e, kind
        return cursor, rng.randint(cursor + 1, after_lines(s, 1 + rng.randint(0, SPAN_LINES))), kind

    def _fit(self, text: str, start: int, end: int, kind: str, room: int) -> tuple[str, list[int]]:
        """The middle ``text[start:end]`` and its ids, cut back to at most ``room`` tokens: whole lines from the
        end for block-level middles of several lines, characters for the others; ("", []) if it cannot fit."""
        middle = text[start:end]
        ids = self.encode(middle)
        while len(ids) > room and kind in ("lines", "continuation") and middle.count("\n") > 1:
            middle = middle[: middle.rstrip("\n").rfind("\n") + 1]
            ids = self.encode(middle)
        if len(ids) > room and kind in ("rest_of_line", "span"):
            low, high = 1, len(middle)  # the longest prefix of the middle that fits (binary search)
            while low < high:
                mid = (low + high + 1) // 2
                if len(self.encode(middle[:mid])) <= room:
                    low = mid
                else:
                    high = mid - 1
            middle = middle[:low]
            ids = self.encode(middle)
        return (middle, ids) if 0 < len(ids) <= room else ("", [])

    def make(self, text: str, rng: random.Random) -> Example | None:
        choice = self._choose_middle(text, rng)
        if choice is None:
            return None
        start, end, kind = choice
        line_start = text.rfind("\n", 0, start) + 1
        scope = protocol.cursor_scope(text[line_start:start])
        canvas = self.line_canvas if scope is protocol.Scope.LINE else self.canvas
        middle, middle_ids = self._fit(text, start, end, kind, canvas - 1)
        if not middle_ids:
            return None
        end = start + len(middle)
        ctx = rng.randint(self.min_ctx, self.max_ctx)
        # far ends on line boundaries, as the engine cuts a long document (diffgemma_engine.shared.budget)
        far = max(0, start - 6 * ctx)
        cut = text.find("\n", far - 1, start) if far else -1
        prefix = text[cut + 1 if cut >= 0 else (line_start if far else 0) : start]
        suffix = ""
        if kind != "continuation":
            # the suffix gets a quarter of the budget in build_fim_prompt; vary how much of it there is
            size = 3 * ctx if rng.random() >= 0.3 else rng.randint(0, 3 * ctx)
            stop = text.find("\n", end + size)
            suffix = text[end : stop + 1] if stop >= 0 else text[end:]
        prompt = build_fim_prompt(PromptParts(prefix=prefix, suffix=suffix), self.encode, self.special, ctx)
        ids = prompt.ids
        if rng.random() < 0.2:  # PSM order: <bos> <fim_prefix> PREFIX <fim_suffix> SUFFIX <fim_middle>
            head = 1 if self.special.bos is not None else 0
            sfx = ids[head + 1 : head + 1 + prompt.suffix_tokens]
            pfx = ids[head + 2 + prompt.suffix_tokens : -1]
            ids = ids[:head] + [self.special.fim_prefix, *pfx, self.special.fim_suffix, *sfx, self.special.fim_middle]
            kind += "/psm"
        canvas_ids = middle_ids + [EOS] + [PAD] * (canvas - 1 - len(middle_ids))
        return Example(
            ids=ids + canvas_ids, prompt_len=len(ids), middle_text=middle, kind=kind, prefix=prefix, suffix=suffix
        )


class ExampleStream:
    """Endless examples from the training (or held-out) files; its position is the RNG state."""

    def __init__(self, entries: list[FileEntry], maker: ExampleMaker, held_out: bool, seed: int) -> None:
        self.maker = maker
        self.groups = {
            "python": [e for e in entries if e.held_out == held_out and e.language == "python"],
            "other": [e for e in entries if e.held_out == held_out and e.language != "python"],
        }
        self.rng = random.Random(seed)

    def __iter__(self) -> ExampleStream:
        return self

    def __next__(self) -> Example:
        while True:
            group = "python" if self.rng.random() < LANGUAGE_WEIGHTS["python"] else "other"
            files = self.groups[group] or self.groups["python"]
            entry = files[self.rng.randrange(len(files))]
            try:
                text = entry.text if entry.text is not None else Path(entry.path).read_text(encoding="utf-8")
            except OSError:
                continue
            example = self.maker.make(text, self.rng)
            if example is not None:
                return example

    def state(self) -> tuple[Any, ...]:
        return self.rng.getstate()

    def set_state(self, state: tuple[Any, ...]) -> None:
        self.rng.setstate(state)
