"""Train the shipped default DiffusionGemma on code with the full-sequence block-diffusion objective.

    python -m diffgemma_engine.training.train --out DIR [--resume] [--minutes N] [--size S] [--threads 1]
        [--device auto]

This module is the command: its arguments, the run's state, and the loop. The objective (DiffusionGemma, notes §8)
is ``diffgemma_engine.training.objective``, the batches come from ``diffgemma_engine.training.batches`` and the held-out
figures from ``diffgemma_engine.training.evaluate``.

Writes into DIR: ``state.pt`` (model, optimizer, step, data position; ``--resume`` continues from it),
``train.log`` (JSON lines: train loss, held-out figures), ``best/`` and ``last/`` (``from_pretrained`` folders).

On CUDA (``--device auto`` picks it when present) the forward passes run under bfloat16 autocast with fp32
master weights and optimizer state; on CPU everything is fp32.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion, PreTrainedTokenizerBase

from . import configs
from .batches import stream_batches, to_device, worker_batches
from .data import ExampleMaker, ExampleStream, FileEntry, build_file_list, corpus_summary, load_pack
from .evaluate import HeldOut, evaluate, held_out_sets
from .objective import autocast, diffusion_forward, weighted_ce

TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "default_model"
EVAL_STEPS = 16  # denoising steps of the shipped generation config
LOG_EVERY = 25
"""Steps per ``train`` record of the log (its loss is the mean over them)."""


@dataclass
class Progress:
    """Where a run stands; saved in ``state.pt`` with the model, optimizer and data position."""

    step: int = 0
    trained_s: float = 0.0
    """Seconds spent in training steps (evaluations and saves not counted)."""
    tokens: int = 0
    """Scored tokens trained on."""
    best: list[float] | None = None
    """The best held-out score so far: (first-line plus rest-of-line exact match, full-noise accuracy on middle
    tokens)."""


def parse_args() -> argparse.Namespace:
    """The command's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/state.pt")
    parser.add_argument(
        "--init",
        type=Path,
        default=None,
        help="start from the weights of a checkpoint folder (e.g. engine/default_model)",
    )
    parser.add_argument("--minutes", type=float, default=100.0, help="training time budget of this run")
    parser.add_argument("--size", default="mini", choices=sorted(configs.SIZES))
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    parser.add_argument("--canvas", type=int, default=32)
    parser.add_argument(
        "--line-canvas",
        type=int,
        default=16,
        help="the canvas of examples whose cursor is inside a line (the model's line_canvas_length hint)",
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=150)
    parser.add_argument("--middle-weight", type=float, default=2.0, help="loss weight of the canvas block")
    parser.add_argument("--eval-minutes", type=float, default=10.0)
    parser.add_argument("--save-minutes", type=float, default=5.0)
    parser.add_argument("--n-eval", type=int, default=64, help="held-out examples for loss and accuracy")
    parser.add_argument(
        "--n-em", type=int, default=40, help="held-out single-line and rest-of-line infills for exact match"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", type=Path, default=None, help="a packed corpus (diffgemma_engine.training.pack)")
    parser.add_argument(
        "--workers", type=int, default=0, help="processes that make the batches (0: in this process, resumable)"
    )
    return parser.parse_args()


def log_record(log_file: Path, record: dict[str, Any]) -> None:
    """Append one time-stamped JSON line to ``log_file`` and echo it on stdout."""
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}
    with log_file.open("a") as f:
        f.write(json.dumps(record) + "\n")
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def load_entries(corpus: Path | None) -> list[FileEntry]:
    """The files to train on: a packed corpus, or this machine's sources (the cached file list)."""
    if corpus is not None:
        return load_pack(corpus)
    return build_file_list(Path(os.environ.get("DG_CACHE", ".cache/train")) / "files.json")


def lr_at(step: int, elapsed: float, budget: float, peak: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from peak to 10% over the time budget of this run."""
    warm = min(1.0, (step + 1) / warmup)
    frac = min(1.0, elapsed / budget) if budget > 0 else 0.0
    return peak * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_step(
    model: DiffusionGemmaForBlockDiffusion,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    middle_weight: float,
    device: torch.device,
) -> torch.Tensor:
    """One optimizer step on the batch's diffusion loss (gradients clipped to norm 1); returns the loss."""
    with autocast(device):
        logits, _ = diffusion_forward(model, batch)
    loss = weighted_ce(logits, batch, middle_weight)
    optimizer.zero_grad(set_to_none=True)
    torch.autograd.backward(loss)  # loss.backward(), which torch leaves unannotated
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def export(model: DiffusionGemmaForBlockDiffusion, out_dir: Path) -> None:
    """Write the model as a ``from_pretrained`` folder with the shipped generation settings and tokenizer."""
    configs.set_generation_defaults(model, steps=EVAL_STEPS)
    configs.save_checkpoint(model, TOKENIZER_DIR, out_dir)


def save_state(
    state_file: Path,
    model: DiffusionGemmaForBlockDiffusion,
    optimizer: torch.optim.Optimizer,
    progress: Progress,
    stream: ExampleStream,
    args: argparse.Namespace,
) -> None:
    """Write ``state.pt`` (through a temporary file, so a stopped run never leaves half of one)."""
    tmp = state_file.with_suffix(".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": progress.step,
            "trained_s": progress.trained_s,
            "tokens": progress.tokens,
            "best": progress.best,
            "data_rng": stream.state(),
            "torch_rng": torch.random.get_rng_state(),
            "size": args.size,
            "canvas": args.canvas,
        },
        tmp,
    )
    os.replace(tmp, state_file)


def load_state(
    state_file: Path,
    model: DiffusionGemmaForBlockDiffusion,
    optimizer: torch.optim.Optimizer,
    stream: ExampleStream,
    device: torch.device,
) -> Progress:
    """Restore the model, optimizer, data position and torch RNG of ``state.pt``; returns the run's progress."""
    state = torch.load(state_file, weights_only=False, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    progress = Progress(step=state["step"], trained_s=state["trained_s"], tokens=state["tokens"], best=state["best"])
    stream.set_state(state["data_rng"])
    torch.random.set_rng_state(state["torch_rng"].cpu())
    return progress


def evaluate_and_export(
    model: DiffusionGemmaForBlockDiffusion,
    tokenizer: PreTrainedTokenizerBase,
    held_out: HeldOut,
    args: argparse.Namespace,
    progress: Progress,
    log: Callable[[dict[str, Any]], None],
) -> None:
    """Log the held-out figures; export ``last/``, and ``best/`` when the score is the best so far."""
    metrics = evaluate(model, tokenizer, held_out, args.middle_weight)
    score = (metrics["first_line_em"] + metrics["rest_of_line_em"], metrics["full_noise_acc_middle_tokens"])
    is_best = progress.best is None or score >= tuple(progress.best)
    log(
        {
            "event": "eval",
            "step": progress.step,
            "trained_min": round(progress.trained_s / 60, 1),
            "tokens": progress.tokens,
            "best": is_best,
            **metrics,
        }
    )
    if is_best:
        progress.best = list(score)
        export(model, args.out / "best")
    export(model, args.out / "last")


def start_or_resume(
    args: argparse.Namespace,
    vocab_size: int,
    state_file: Path,
    stream: ExampleStream,
    device: torch.device,
    log: Callable[[dict[str, Any]], None],
    corpus: object,
) -> tuple[DiffusionGemmaForBlockDiffusion, torch.optim.AdamW, Progress]:
    """The model (fresh, from ``--init``, or resumed from ``state_file`` with ``--resume``) on ``device`` in training
    mode, its optimizer, and the run's progress so far; a fresh run's first log record names the ``corpus``."""
    resume = args.resume and state_file.exists()
    model = DiffusionGemmaForBlockDiffusion(configs.build_config(args.size, vocab_size, canvas_length=args.canvas))
    configs.set_generation_defaults(model, steps=EVAL_STEPS)  # the held-out infills sample as the engine does
    if args.init is not None and not resume:
        # the shipped model's weights, with a fresh optimizer: how a later session continues training it
        model.load_state_dict(DiffusionGemmaForBlockDiffusion.from_pretrained(args.init).state_dict())
    cast(torch.nn.Module, model).to(device)  # transformers' wrapper of `to` is typed as taking the model
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    if resume:
        progress = load_state(state_file, model, optimizer, stream, device)
        log({"event": "resume", "step": progress.step, "trained_s": progress.trained_s})
    else:
        progress = Progress()
        log(
            {
                "event": "start",
                "device": str(device),
                "size": args.size,
                "params": sum(parameter.numel() for parameter in model.parameters()),
                "args": {k: str(v) for k, v in vars(args).items()},
                "corpus": corpus,
            }
        )
    model.train()
    return model, optimizer, progress


def train_record(progress: Progress, loss: float, lr: float, s_per_step: float) -> dict[str, object]:
    """The log record of a window of training steps (``loss`` and ``s_per_step`` its means)."""
    return {
        "event": "train",
        "step": progress.step,
        "loss": round(loss, 4),
        "lr": lr,
        "s_per_step": round(s_per_step, 3),
        "tok_per_s": round(progress.tokens / max(progress.trained_s, 1e-9)),
        "tokens": progress.tokens,
        "trained_min": round(progress.trained_s / 60, 1),
    }


def training_data(
    args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase, device: torch.device
) -> tuple[list[FileEntry], ExampleStream, HeldOut]:
    """The corpus's files, the stream of training examples made from them, and the held-out sets."""
    entries = load_entries(args.corpus)
    maker = ExampleMaker(tokenizer, args.canvas, line_canvas=args.line_canvas)
    stream = ExampleStream(entries, maker, held_out=False, seed=args.seed)
    return entries, stream, held_out_sets(entries, maker, args.n_eval, args.n_em, device)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    log = functools.partial(log_record, args.out / "train.log")

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    entries, stream, held_out = training_data(args, tokenizer, device)
    torch.manual_seed(args.seed)
    state_file, corpus = args.out / "state.pt", corpus_summary(entries)
    model, optimizer, progress = start_or_resume(args, len(tokenizer), state_file, stream, device, log, corpus)

    run_start = time.perf_counter()
    budget = args.minutes * 60
    last_save = last_eval = time.perf_counter()
    if progress.step == 0:
        evaluate_and_export(model, tokenizer, held_out, args, progress, log)
    window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
    start = progress.step
    batches = (
        worker_batches(entries, tokenizer, args, start) if args.workers else stream_batches(stream, args.batch, start)
    )
    while time.perf_counter() - run_start < budget:
        step_start = time.perf_counter()
        batch = to_device(next(batches), device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(progress.step, time.perf_counter() - run_start, budget, args.lr, args.warmup)
        loss = train_step(model, optimizer, batch, args.middle_weight, device)
        progress.step += 1
        progress.tokens += int(batch["scored"].sum())
        progress.trained_s += time.perf_counter() - step_start
        window_loss += loss.item()
        window_steps += 1
        if progress.step % LOG_EVERY == 0:
            window_s = time.perf_counter() - window_start
            log(
                train_record(
                    progress, window_loss / window_steps, optimizer.param_groups[0]["lr"], window_s / window_steps
                )
            )
            window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
        now = time.perf_counter()
        if now - last_eval > args.eval_minutes * 60:
            evaluate_and_export(model, tokenizer, held_out, args, progress, log)
            last_eval = time.perf_counter()
        if now - last_save > args.save_minutes * 60:
            save_state(state_file, model, optimizer, progress, stream, args)
            last_save = time.perf_counter()
    evaluate_and_export(model, tokenizer, held_out, args, progress, log)
    save_state(state_file, model, optimizer, progress, stream, args)
    log(
        {
            "event": "done",
            "step": progress.step,
            "trained_min": round(progress.trained_s / 60, 1),
            "tokens": progress.tokens,
        }
    )


if __name__ == "__main__":
    main()
