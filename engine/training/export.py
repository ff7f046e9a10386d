"""Export a trained checkpoint as the shipped default model.

    python -m diffgemma_engine.training.export --src .cache/train/run1/best [--dst engine/default_model] [--steps 16]

``--src`` is a ``from_pretrained`` folder written by ``diffgemma_engine.training.train`` (``best/`` or ``last/``) or its
``state.pt``. Writes ``config.json``, ``model.safetensors`` and ``generation_config.json`` into ``--dst``; the
tokenizer files there are left as they are.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from . import configs

FILES = ("config.json", "model.safetensors", "generation_config.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--dst", type=Path, default=Path(__file__).resolve().parent.parent / "default_model")
    parser.add_argument("--steps", type=int, default=16, help="max denoising steps in generation_config.json")
    args = parser.parse_args()

    from transformers import DiffusionGemmaForBlockDiffusion

    from .train import TOKENIZER_DIR

    if args.src.suffix == ".pt":
        state = torch.load(args.src, weights_only=False)
        cfg = configs.build_config(state["size"], 8192, canvas_length=state["canvas"])
        model = DiffusionGemmaForBlockDiffusion(cfg)
        model.load_state_dict(state["model"])
    else:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.src, dtype=torch.float32)
    model.train(False)  # model.eval(), which transformers leaves unannotated
    configs.set_generation_defaults(model, steps=args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        configs.save_checkpoint(model, TOKENIZER_DIR, Path(tmp))
        args.dst.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            shutil.copyfile(Path(tmp) / name, args.dst / name)
    size = sum((args.dst / name).stat().st_size for name in FILES)
    sys.stdout.write(f"exported {args.src} -> {args.dst} ({size / 1e6:.1f} MB)\n")


if __name__ == "__main__":
    main()
