"""A scaled-down checkpoint in the on-disk format of the released ``google/diffusiongemma-26B-A4B-it``.

Built with the real classes (transformers' ``GemmaTokenizer`` and ``DiffusionGemmaForBlockDiffusion``,
``tokenizers``' BPE trainer) from the release's own ``config.json`` and ``generation_config.json``
(``tests/data/release/``, copied from the facts the project keeps about the release):

* ``config.json``: the release's, with the text stack and the vision tower scaled down and the vocabulary cut to
  a small BPE trained here; the layer pattern (five sliding layers, then a full one with its own head size),
  the mixture of experts beside the dense MLP, the tied encoder and decoder, the 256-token canvas, the
  ``gemma4_vision`` tower and the end-of-sequence set [1, 106, 50] are the release's.
* ``generation_config.json``: the release's, unchanged (48 steps, temperature 0.8 to 0.4, entropy bound 0.1).
* weights: bfloat16, sharded (``model-0000N-of-0000M.safetensors``) with ``model.safetensors.index.json``.
* tokenizer: a Gemma-style BPE (``▁`` for spaces, byte fallback) whose control tokens sit at the release's
  ids (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<|tool_response>`` 50, ``<|channel>`` 100, ``<channel|>`` 101,
  ``<|turn>`` 105, ``<turn|>`` 106) and which has no FIM tokens; ``chat_template.jinja`` renders one user
  turn as the release does (``<bos><|turn>user\\n...<turn|>\\n<|turn>model\\n<|channel>thought\\n<channel|>``
  with thinking off); ``processor_config.json`` names the release's processor.

What it cannot reproduce: the real tokenizer's 262,144 entries (so its characters per token), and the real
model's answers. ``build_release_memorized`` trains one to answer a fixed prompt the way instruction models
often do, in a code fence, so that tests can check what reaches the editor.
"""

from __future__ import annotations

import importlib.util
import json
import sysconfig
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "tests" / "data" / "release"

CONTROL_TOKENS = {
    0: "<pad>",
    1: "<eos>",
    2: "<bos>",
    3: "<unk>",
    4: "<mask>",
    46: "<|tool>",
    47: "<tool|>",
    48: "<|tool_call>",
    49: "<tool_call|>",
    50: "<|tool_response>",
    51: "<tool_response|>",
    52: '<|"|>',
    98: "<|think|>",
    100: "<|channel>",
    101: "<channel|>",
    105: "<|turn>",
    106: "<turn|>",
}
"""The release's control tokens at the release's ids (the data folder gives 0-2, 50, 100, 101, 105, 106 and the
end-of-sequence set; the other tool tokens' and ``<|think|>``'s ids are placeholders in the same range)."""
RESERVED = 256
"""Ids below this are control tokens or ``<unusedN>``, as in Gemma's vocabulary."""
IMAGE_TOKENS = ("<|image>", "<|image|>", "<image|>")
"""Begin-of-image, image soft token and end-of-image (the release's 255999, 258880, 258882), at the vocabulary's
end; the vision tower is never run for code."""
VOCAB_SIZE = 2048
CORPUS = ("textwrap.py", "json/encoder.py", "json/decoder.py", "shlex.py", "string.py", "glob.py", "fnmatch.py")

CHAT_TEMPLATE = """{{- bos_token -}}
{%- set first = messages[0] if messages else none -%}
{%- if enable_thinking is defined and enable_thinking -%}
{{- '<|turn>system\\n<|think|>\\n' -}}
{%- if first and first['role'] == 'system' -%}{{- first['content'] | trim -}}{%- endif -%}
{{- '<turn|>\\n' -}}
{%- elif first and first['role'] == 'system' -%}
{{- '<|turn>system\\n' + first['content'] | trim + '<turn|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message['role'] != 'system' -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{- '<|turn>' + role + '\\n' + message['content'] + '<turn|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|turn>model\\n' -}}
{%- if not (enable_thinking is defined and enable_thinking) -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}
{%- endif -%}
"""
"""Renders what the release's template renders for a conversation without tools or images (the data folder)."""


def build_tokenizer():
    """A Gemma-style BPE tokenizer trained on a few standard-library files, control tokens at the release's ids."""
    from tokenizers import Tokenizer, models, normalizers, trainers
    from transformers import GemmaTokenizer

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lines = [line for name in CORPUS for line in (stdlib / name).read_text().splitlines(keepends=True)]
    scratch = Tokenizer(models.BPE(unk_token="<unk>"))
    scratch.normalizer = normalizers.Replace(" ", "▁")
    learned = VOCAB_SIZE - RESERVED - 256 - len(IMAGE_TOKENS)
    trainer = trainers.BpeTrainer(vocab_size=learned, show_progress=False, limit_alphabet=200)
    scratch.train_from_iterator(lines, trainer)
    trained = json.loads(scratch.to_str())["model"]
    vocab = {CONTROL_TOKENS.get(i, f"<unused{i}>"): i for i in range(RESERVED)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for token, _ in sorted(trained["vocab"].items(), key=lambda item: item[1]):
        if token not in vocab and len(vocab) < VOCAB_SIZE - len(IMAGE_TOKENS):
            vocab[token] = len(vocab)
    for token in IMAGE_TOKENS:
        vocab[token] = len(vocab)
    pairs = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in trained["merges"]]
    merges = [pair for pair in pairs if all(part in vocab for part in pair) and "".join(pair) in vocab]
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges)
    controls = [token for token in CONTROL_TOKENS.values() if token not in ("<pad>", "<eos>", "<bos>", "<unk>")]
    tokenizer.add_special_tokens({"additional_special_tokens": [*controls, *IMAGE_TOKENS]})
    tokenizer.chat_template = CHAT_TEMPLATE
    assert len(tokenizer) == VOCAB_SIZE, len(tokenizer)
    for token_id, token in CONTROL_TOKENS.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id, token
    return tokenizer


SMALL = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64, "num_experts": 4, "head_dim": 32}
WIDE = {"hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 512, "num_experts": 8, "head_dim": 64}
"""About 90 MB of bfloat16 weights (86% of them in the routed experts, as in the release's 88%): big enough to
measure what a load or a quantizer does to memory."""


def build_config(vocab_size: int, image_ids: dict[str, int], sizes: dict[str, int] = SMALL):
    """The release's config (a DiffusionGemmaConfig) with the text stack and vision tower scaled down to ``sizes``."""
    from transformers import DiffusionGemmaConfig

    from diffgemma_engine.training.configs import TINY_VISION

    release = json.loads((RELEASE / "config.json").read_text())
    text = release["text_config"]
    layers = 6
    text.update(
        vocab_size=vocab_size,
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        moe_intermediate_size=sizes["moe_intermediate_size"],
        num_hidden_layers=layers,
        layer_types=text["layer_types"][:layers],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=sizes["head_dim"],
        per_layer_config={f"{layers - 1:02d}": {"head_dim": 2 * sizes["head_dim"], "num_key_value_heads": 1}},
        num_experts=sizes["num_experts"],
        top_k_experts=2,
        sliding_window=128,
    )
    assert text["layer_types"][-1] == "full_attention"
    release["vision_config"].update(TINY_VISION)
    release.update(image_ids)
    return DiffusionGemmaConfig.from_dict(release)


def save_release_format(model: torch.nn.Module, tokenizer: object, out_dir: Path, shard_size: str = "300KB") -> Path:
    """Write ``model`` and ``tokenizer`` as the release lays out its folder (sharded safetensors and an index)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out_dir, max_shard_size=shard_size)
    tokenizer.save_pretrained(out_dir)  # type: ignore[attr-defined]
    for name in ("generation_config.json",):
        (out_dir / name).write_text((RELEASE / name).read_text())
    processor = {"processor_class": "Gemma4Processor", "image_seq_length": 280, "audio_ms_per_token": 40}
    (out_dir / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return out_dir


def _new_model(seed: int, sizes: dict[str, int] = SMALL):
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    ids = {
        "boi_token_id": tokenizer.convert_tokens_to_ids("<|image>"),
        "image_token_id": tokenizer.convert_tokens_to_ids("<|image|>"),
        "eoi_token_id": tokenizer.convert_tokens_to_ids("<image|>"),
    }
    return DiffusionGemmaForBlockDiffusion(build_config(len(tokenizer), ids, sizes)), tokenizer


def build_release_random(out_dir: Path, seed: int = 0) -> Path:
    """Random weights: its canvases never settle, so every one of the release's 48 steps runs."""
    model, tokenizer = _new_model(seed)
    return save_release_format(model.eval(), tokenizer, out_dir)


def build_release_wide(out_dir: Path, seed: int = 0) -> Path:
    """Random weights at the ``WIDE`` sizes, in 20 MB shards."""
    model, tokenizer = _new_model(seed, WIDE)
    return save_release_format(model.eval(), tokenizer, out_dir, shard_size="20MB")


ANSWERED_PREFIX = "def add(a, b):\n"
ANSWERED_SUFFIX = "\n\nprint(add(1, 2))\n"
ANSWERED_LANGUAGE = "python"
RAW_ANSWER = "```python\n    return a + b\n```"
"""What the memorized checkpoint writes for that document: fenced, as instruction models often answer."""
INSERTED = "    return a + b"
"""What should reach the editor once the fence is gone."""


def build_release_memorized(out_dir: Path, train_steps: int = 1200, seed: int = 0) -> Path:
    """A release-format checkpoint trained to answer ``RAW_ANSWER`` (then ``<turn|>``) to the engine's chat
    prompt for ``ANSWERED_PREFIX``/``ANSWERED_SUFFIX``, laid out by the engine's own code; kept only once the
    engine answers it so (``train_until_answered``), int8 too where torchao is installed (the int8 tests load it so).

    1,200 steps: after 400 (the checks then took two seeds) 5 in 24 draws of bfloat16 and 8 in 24 of int8 missed the
    answer (``return a + `` or a garbled fence), and the tests that draw unseeded failed that often; after 1,200, none
    in 24 of either, and the canvas settles in a few of its 48 steps."""
    from diffgemma_engine.loading.model import DEFAULT_MAX_PROMPT_TOKENS
    from diffgemma_engine.shared.prompt import PromptParts, layout_for
    from tests.support.models import CHECKS, asked_for, train_to_answer, train_until_answered

    parts = PromptParts(prefix=ANSWERED_PREFIX, suffix=ANSWERED_SUFFIX, language=ANSWERED_LANGUAGE)

    def train(out: Path, steps: int, attempt_seed: int) -> float:
        model, tokenizer = _new_model(attempt_seed)
        prompt = layout_for(tokenizer).prompt(parts, DEFAULT_MAX_PROMPT_TOKENS).ids
        answer = [*tokenizer.encode(RAW_ANSWER, add_special_tokens=False), CONTROL_IDS["<turn|>"]]
        loss = train_to_answer(model, [prompt], answer, pad_id=CONTROL_IDS["<pad>"], steps=steps, balanced=True)
        save_release_format(model.eval(), tokenizer, out)
        return loss

    loads = CHECKS + ((("auto", "int8"),) if importlib.util.find_spec("torchao") else ())
    return train_until_answered(out_dir, train, [asked_for(parts)], RAW_ANSWER, train_steps, seed, range(4), loads)


CONTROL_IDS = {token: token_id for token_id, token in CONTROL_TOKENS.items()}


def main() -> None:
    """``python -m tests.support.release_format DIR [--memorized | --wide]``: build one for benchmarks or by hand."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out", type=Path)
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--memorized", action="store_true", help="the one trained to answer ANSWERED_PREFIX")
    kind.add_argument("--wide", action="store_true", help="random, at the WIDE sizes (about 90 MB)")
    args = parser.parse_args()
    build = build_release_memorized if args.memorized else build_release_wide if args.wide else build_release_random
    build(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
