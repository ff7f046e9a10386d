"""Small DiffusionGemma checkpoints for tests, built with the real transformers classes.

``build_random`` saves a randomly initialised model (its canvases never settle: every denoising step runs).
``build_memorized`` trains one for a few seconds, with the DiffusionGemma objective, to answer one fixed
multi-line middle, so that end-to-end tests can check the exact text that reaches the editor.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion, DynamicCache

from engine import vocab
from engine.model import DEFAULT_MODEL_DIR
from engine.prompt import PromptParts, build_fim_prompt, special_ids_from
from engine.training.configs import build_config, save_checkpoint, set_generation_defaults

CANVAS = 32
MEMORIZED_PREFIX = "def add(a, b):\n"
MEMORIZED_SUFFIX = "\n\nprint(add(1, 2))\n"
MEMORIZED_MIDDLE = "    total = a + b\n    return total"


def build_random(out_dir: Path, steps: int = 8, seed: int = 0) -> Path:
    """A random-weight checkpoint of the 'test' size with the shipped tokenizer."""
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    model = DiffusionGemmaForBlockDiffusion(build_config("test", len(tokenizer), canvas_length=CANVAS)).eval()
    set_generation_defaults(model, steps=steps)
    save_checkpoint(model, DEFAULT_MODEL_DIR, out_dir)
    return out_dir


def build_memorized(out_dir: Path, train_steps: int = 1000, seed: int = 0) -> Path:
    """A checkpoint that completes ``MEMORIZED_PREFIX``/``MEMORIZED_SUFFIX`` with ``MEMORIZED_MIDDLE``.

    Its sampler is the real one (temperature 0.8 -> 0.4), so an answer is a draw: after 500 steps 1 in 200 draws
    was wrong (tests flaked); after 1,000 steps 0 in 1,400 were.
    """
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    vocab_size = len(tokenizer)
    model = DiffusionGemmaForBlockDiffusion(build_config("test", vocab_size, canvas_length=CANVAS))
    special = special_ids_from(tokenizer.get_vocab().get)
    assert special is not None

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    prompt = build_fim_prompt(PromptParts(prefix=MEMORIZED_PREFIX, suffix=MEMORIZED_SUFFIX), encode, special, 512)
    middle = encode(MEMORIZED_MIDDLE) + [vocab.SPECIAL_IDS[vocab.EOS]]
    target = torch.tensor([middle + [vocab.SPECIAL_IDS[vocab.PAD]] * (CANVAS - len(middle))])
    prompt_ids = torch.tensor([prompt.ids])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-3, total_steps=train_steps, pct_start=0.1)
    model.train()
    text_config = model.config.get_text_config(decoder=True)
    for _ in range(train_steps):
        t = 1 - torch.rand(1) ** 2  # mostly heavy corruption: the first denoising steps start from noise
        noisy = torch.where(torch.rand(target.shape) < t, torch.randint(0, vocab_size, target.shape), target)
        cache = DynamicCache(config=text_config)
        self_conditioning = None
        if torch.rand(1).item() < 0.5:  # two-pass self-conditioning, as in DiffusionGemma training
            with torch.no_grad():
                self_conditioning = model(
                    input_ids=prompt_ids, decoder_input_ids=noisy, cache=DynamicCache(config=text_config)
                ).logits
        logits = model(
            input_ids=prompt_ids,
            decoder_input_ids=noisy,
            cache=cache,
            self_conditioning_logits=self_conditioning,
        ).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab_size), target.view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    model.eval()
    set_generation_defaults(model, steps=16)
    save_checkpoint(model, DEFAULT_MODEL_DIR, out_dir)
    return out_dir
