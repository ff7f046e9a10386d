"""Fill-in-the-middle prompt formats of the OpenAI-compatible completions API, both ways.

Editors that speak ``/v1/completions`` put the text before and after the cursor in one ``prompt`` string, marked
with one model family's sentinels (Zed's ``prompt_format``: ``star_coder``, ``qwen``, ...), or send the text
before the cursor as ``prompt`` and the text after it as ``suffix`` (OpenAI's own infill API: ``suffix``).
The endpoint reads any of them back into prefix and suffix; the remote backend writes the one its server wants.
Pure: no I/O.
"""

from __future__ import annotations

import attrs

from diffgemma_engine.shared import vocab


@attrs.frozen
class FimFormat:
    """``before + prefix + between + suffix + after``, or with the suffix first when ``suffix_first``."""

    name: str
    before: str
    between: str
    after: str
    suffix_first: bool = False

    def build(self, prefix: str, suffix: str) -> str:
        """The prompt that carries ``prefix`` and ``suffix``."""
        first, second = (suffix, prefix) if self.suffix_first else (prefix, suffix)
        return f"{self.before}{first}{self.between}{second}{self.after}"

    def parse(self, prompt: str) -> tuple[str, str] | None:
        """``(prefix, suffix)`` if ``prompt`` has this format, else None (the first ``between`` splits)."""
        if not (prompt.startswith(self.before) and prompt.endswith(self.after)):
            return None
        body = prompt[len(self.before) : len(prompt) - len(self.after)]
        first, sep, second = body.partition(self.between)
        if not sep:
            return None
        return (second, first) if self.suffix_first else (first, second)


DIFFUSION_GEMMA = "diffusion_gemma"
"""The engine's own ``fim`` layout (``diffgemma_engine.shared.prompt``: ``<bos>``, the suffix, then the prefix; its
tokenizer adds no ``<bos>`` of its own), for a DiffusionGemma FIM checkpoint served by vLLM; the remote backend sends
it the diffusion controls too."""

SUFFIX_FIELD = "suffix"
"""Not a prompt format: the prefix is the prompt and the suffix travels in the request's ``suffix`` field."""

FORMATS: dict[str, FimFormat] = {
    fmt.name: fmt
    for fmt in (
        FimFormat("star_coder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
        FimFormat("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
        FimFormat("code_llama", "<PRE> ", " <SUF>", " <MID>"),
        FimFormat("deepseek_coder", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
        FimFormat("codestral", "[SUFFIX]", "[PREFIX]", "", suffix_first=True),
        FimFormat("glm", "<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),
        FimFormat(DIFFUSION_GEMMA, vocab.BOS + vocab.FIM_SUFFIX, vocab.FIM_PREFIX, vocab.FIM_MIDDLE, suffix_first=True),
    )
}
"""Named as in Zed's ``edit_predictions.open_ai_compatible_api.prompt_format`` (``code_gemma`` = ``qwen``), and
``diffusion_gemma``."""

ALIASES = {"code_gemma": "qwen", "starcoder": "star_coder", "codellama": "code_llama"}

CHAT = "chat"
"""Not a completions prompt either: an instruction model (the released DiffusionGemma-IT served by vLLM) asked
through ``/v1/chat/completions`` with the engine's own chat instruction
(``diffgemma_engine.shared.prompt.chat_user_text``)."""

PROMPT_FORMATS = (SUFFIX_FIELD, CHAT, *FORMATS, *ALIASES)
"""Every name a user may configure."""


def format_named(name: str) -> FimFormat | None:
    """The format called ``name``; None for ``suffix`` and ``chat`` (no sentinels)."""
    if name in (SUFFIX_FIELD, CHAT):
        return None
    return FORMATS[ALIASES.get(name, name)]


def split_prompt(prompt: str, suffix: str | None) -> tuple[str, str]:
    """Prefix and suffix of a completions request: from the ``suffix`` field, or the prompt's sentinels.

    A prompt with no known sentinels and no ``suffix`` is plain continuation (empty suffix).
    """
    if suffix is not None:
        return prompt, suffix
    for fmt in FORMATS.values():
        if (found := fmt.parse(prompt)) is not None:
            return found
    return prompt, ""
