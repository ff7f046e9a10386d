"""Training examples in the engine's fill-in-the-middle layout, drawn from the machine's source files.

Each example is one token sequence::

    <bos> <fim_suffix> SUFFIX <fim_prefix> PREFIX <fim_middle> | MIDDLE <eos> <pad> ... <pad>
    '--------------- prompt (engine.prompt.build_fim_prompt) -----'  '------ canvas (C tokens) -----'

with a block layout for the full-sequence block-diffusion step: the canvas is one block that starts right after
``<fim_middle>`` (exactly where the engine's canvas starts), and the prompt is cut into canvas-sized blocks
counted backwards from there (the first block may be shorter). Every block is denoised against the clean tokens
before it, so the prompt teaches code and the canvas teaches the infill task, EOS and the padding after it.

Middles are what a completion fills: one whole line (as in HumanEval single-line infilling), a few whole lines,
the rest of a line from a cursor inside it, or plain continuation (empty suffix). A fifth of the examples use the
PSM order (prefix first) instead of the engine's SPM order.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import vocab
from ..prompt import PromptParts, build_fim_prompt, special_ids_from
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
    """The file's text when it comes from a packed corpus (``engine.training.pack``); else read from ``path``."""


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
    """The entries of a packed corpus (``engine.training.pack``), texts included: for a machine without the
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


class ExampleMaker:
    """Turns source files into FIM examples; all randomness comes from the ``random.Random`` passed in."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, canvas: int, min_ctx: int = 96, max_ctx: int = 320) -> None:
        self.tokenizer = tokenizer
        self.canvas = canvas
        self.min_ctx, self.max_ctx = min_ctx, max_ctx
        special = special_ids_from(tokenizer.get_vocab().get)  # as the engine reads them (engine.prompt.layout_for)
        if special is None:
            raise ValueError(f"the tokenizer lacks {vocab.FIM_PREFIX}, {vocab.FIM_SUFFIX} or {vocab.FIM_MIDDLE}")
        self.special = special

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

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

        r = rng.random()
        # avoid blank lines as single-line middles most of the time
        for _ in range(8):
            i = rng.randrange(1, len(starts))
            s = starts[i]
            if text[s : line_end(s)].strip():
                break
        if r < 0.50:
            return s, line_end(s), "line"
        if r < 0.75:
            return s, after_lines(s, rng.randint(2, 6)), "lines"
        if r < 0.88:
            e = line_end(s)
            line = text[s:e]
            indent = len(line) - len(line.lstrip())
            if e - s - indent < 4:
                return s, e, "line"
            return rng.randint(s + indent + 1, e - 2), e, "partial"
        return s, after_lines(s, rng.randint(1, 3)), "continuation"

    def make(self, text: str, rng: random.Random) -> Example | None:
        choice = self._choose_middle(text, rng)
        if choice is None:
            return None
        start, end, kind = choice
        middle = text[start:end]
        middle_ids = self.encode(middle)
        # multi-line middles: drop whole lines from the end until MIDDLE + <eos> fits the canvas
        while len(middle_ids) > self.canvas - 1 and kind in ("lines", "continuation") and middle.count("\n") > 1:
            middle = middle[: middle.rstrip("\n").rfind("\n") + 1]
            middle_ids = self.encode(middle)
        if len(middle_ids) > self.canvas - 1 or not middle_ids:
            return None
        end = start + len(middle)
        ctx = rng.randint(self.min_ctx, self.max_ctx)
        prefix = text[max(0, start - 6 * ctx) : start]
        suffix = "" if kind == "continuation" else text[end : end + 3 * ctx]
        # the suffix gets a quarter of the budget in build_fim_prompt; vary how much of it there is
        if suffix and rng.random() < 0.3:
            suffix = suffix[: rng.randint(0, len(suffix))]
        prompt = build_fim_prompt(PromptParts(prefix=prefix, suffix=suffix), self.encode, self.special, ctx)
        ids = prompt.ids
        if rng.random() < 0.2:  # PSM order: <bos> <fim_prefix> PREFIX <fim_suffix> SUFFIX <fim_middle>
            head = 1 if self.special.bos is not None else 0
            sfx = ids[head + 1 : head + 1 + prompt.suffix_tokens]
            pfx = ids[head + 2 + prompt.suffix_tokens : -1]
            ids = ids[:head] + [self.special.fim_prefix, *pfx, self.special.fim_suffix, *sfx, self.special.fim_middle]
            kind += "/psm"
        canvas = middle_ids + [EOS] + [PAD] * (self.canvas - 1 - len(middle_ids))
        return Example(ids=ids + canvas, prompt_len=len(ids), middle_text=middle, kind=kind)


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
