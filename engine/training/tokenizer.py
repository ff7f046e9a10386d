"""Train the byte-level BPE code tokenizer with fill-in-the-middle sentinels.

    python -m diffgemma_engine.training.tokenizer OUT_DIR [--vocab-size 8192] [--max-mb 60]

Writes ``tokenizer.json`` and ``tokenizer_config.json`` so that ``AutoTokenizer.from_pretrained(OUT_DIR)`` loads it.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ..shared import vocab
from .corpus import default_roots, is_held_out, iter_sources


def train_tokenizer(texts: Iterator[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE whose first ids are ``vocab.SPECIAL_TOKENS``."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(vocab.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def wrap(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """The transformers view of the tokenizer, with its special tokens named."""
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves its __init__ unannotated
        tokenizer_object=tokenizer,
        bos_token=vocab.BOS,
        eos_token=vocab.EOS,
        pad_token=vocab.PAD,
        unk_token=vocab.UNK,
        additional_special_tokens=[vocab.FIM_PREFIX, vocab.FIM_SUFFIX, vocab.FIM_MIDDLE, vocab.FILE_SEP],
        clean_up_tokenization_spaces=False,
    )


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--max-mb", type=float, default=60.0, help="stop reading the corpus after this much text")
    args = parser.parse_args()

    budget = int(args.max_mb * 1e6)

    def texts() -> Iterator[str]:
        total = 0
        for path, text in iter_sources(default_roots()):
            if is_held_out(path):
                continue
            total += len(text)
            yield text
            if total >= budget:
                return

    tokenizer = train_tokenizer(itertools.chain(texts()), args.vocab_size)
    for index, token in enumerate(vocab.SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == index, token
    args.out_dir.mkdir(parents=True, exist_ok=True)
    wrap(tokenizer).save_pretrained(args.out_dir)


if __name__ == "__main__":
    main()
