"""Train the shipped default DiffusionGemma on code with the full-sequence block-diffusion objective.

    python -m engine.training.train --out DIR [--resume] [--minutes N] [--size S] [--threads 1] [--device auto]

Objective (DiffusionGemma, notes §8): uniform-state corruption with one level t ~ U(eps, 1) per (example, block),
cross-entropy on every position of every block (prompt blocks, the middle, its <eos> and the <pad> after it), and
two-pass self-conditioning (pass 1 without gradients, pass 2 reads its logits with probability 0.5). One step
scores every token of the batch: the encoder runs causally over the clean sequence once, the decoder denoises all
canvas-sized blocks at once, each against the clean tokens before it, through a block-causal 4-D mask dict.

Writes into DIR: ``state.pt`` (model, optimizer, step, data position; ``--resume`` continues from it),
``train.log`` (JSON lines: train loss, held-out figures), ``best/`` and ``last/`` (``from_pretrained`` folders).

On CUDA (``--device auto`` picks it when present) the forward passes run under bfloat16 autocast with fp32
master weights and optimizer state; on CPU everything is fp32.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import multiprocessing
import multiprocessing.pool
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.training import configs
from engine.training.data import (
    EOS,
    PAD,
    Example,
    ExampleMaker,
    ExampleStream,
    build_file_list,
    corpus_summary,
    load_pack,
)

TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "default_model"
EVAL_STEPS = 16  # denoising steps of the shipped generation config


def pad_batch(examples: list[Example], canvas: int) -> dict[str, torch.Tensor]:
    """Right-pad to a common length and describe the blocks of each row.

    ``start[b, i]`` is the first position of the block of position i (the clean context it sees ends there),
    ``block[b, i]`` its block number, ``weight[b, i]`` the loss weight (0 on row padding).
    """
    S = max(len(e.ids) for e in examples)
    B = len(examples)
    ids = torch.full((B, S), PAD, dtype=torch.long)
    start = torch.zeros(B, S, dtype=torch.long)
    block = torch.zeros(B, S, dtype=torch.long)
    scored = torch.zeros(B, S, dtype=torch.bool)
    middle = torch.zeros(B, S, dtype=torch.bool)
    for b, e in enumerate(examples):
        n, p = len(e.ids), e.prompt_len
        ids[b, :n] = torch.tensor(e.ids)
        # blocks counted backwards from the canvas start p: [.., p-2C, p-C), [p-C, p), [p, p+C)
        pos = torch.arange(S)
        blk = torch.div(pos - p, canvas, rounding_mode="floor")
        st = (p + blk * canvas).clamp(min=0)
        # row padding after the canvas: each position its own block (sees clean context, scores nothing)
        tail = pos >= n
        blk = torch.where(tail, 10_000 + pos, blk)
        st = torch.where(tail, pos, st)
        start[b], block[b] = st, blk
        scored[b, :n] = True
        middle[b, p:n] = True
    return {"ids": ids, "start": start, "block": block, "scored": scored, "middle": middle}


def block_masks(start: torch.Tensor, block: torch.Tensor, window: int) -> dict[str, torch.Tensor]:
    """4-D bool masks (True = attend) over keys ``[clean sequence (S) ; noisy sequence (S)]``.

    A query at i sees clean keys j < start[i] (sliding layers: only the last window-1 of them, as the
    inference cache holds) and the noisy keys of its own block, bidirectionally.
    """
    S = start.shape[1]
    j = torch.arange(S, device=start.device)[None, None, :]
    st = start[:, :, None]
    clean_full = j < st
    clean_slide = clean_full & (j >= st - (window - 1))
    noisy = block[:, :, None] == block[:, None, :]
    return {
        "full_attention": torch.cat([clean_full, noisy], 2)[:, None],
        "sliding_attention": torch.cat([clean_slide, noisy], 2)[:, None],
    }


def diffusion_forward(model, batch, sc_prob=0.5, eps=1e-3, t_override=None, self_condition=True):
    """Corrupt, run encoder + (two-pass) decoder; return logits and the corrupted sequence."""
    from transformers import DynamicCache

    x0, block = batch["ids"], batch["block"]
    B, S = x0.shape
    V = model.config.text_config.vocab_size
    device = x0.device
    cache = DynamicCache()  # config-less: keeps every position of every layer, with gradients
    model.model.encoder(input_ids=x0, cache=cache)
    # one level t per (example, block)
    if t_override is None:
        t_blk = torch.empty(B, S, device=device).uniform_(eps, 1.0)
        t = torch.gather(t_blk, 1, (block - block.min(1, keepdim=True).values).clamp(max=S - 1))
    else:
        t = torch.full((B, S), float(t_override), device=device)
    xt = torch.where(torch.rand(B, S, device=device) < t, torch.randint(0, V, (B, S), device=device), x0)
    masks = block_masks(batch["start"], block, model.config.text_config.sliding_window)
    pos = torch.arange(S, device=device)[None].expand(B, S)
    kw = dict(decoder_input_ids=xt, cache=cache, decoder_attention_mask=masks, decoder_position_ids=pos)
    sc_logits = sc_mask = None
    if self_condition:
        with torch.no_grad():
            sc_logits = model(**kw).logits
        sc_mask = torch.rand(B, device=device) < sc_prob
    logits = model(**kw, self_conditioning_logits=sc_logits, self_conditioning_mask=sc_mask).logits
    return logits, xt


def autocast(device: torch.device) -> torch.autocast:
    """bfloat16 forward passes on CUDA; nothing changes on CPU."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}


def weighted_ce(logits, batch, middle_weight: float):
    logits = logits.float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ids"].reshape(-1), reduction="none")
    w = batch["scored"].float() * (1.0 + (middle_weight - 1.0) * batch["middle"].float())
    return (ce * w.reshape(-1)).sum() / w.sum()


def batch_group(stream, batch: int, canvas: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Four batches from ``stream``: its next 4 x ``batch`` examples sorted by length, so that the rows of a batch
    have similar lengths (little row padding), in an order shuffled by ``seed``."""
    examples = sorted((next(stream) for _ in range(4 * batch)), key=lambda e: len(e.ids))
    chunks = [examples[i : i + batch] for i in range(0, len(examples), batch)]
    random.Random(seed).shuffle(chunks)
    return [pad_batch(chunk, canvas) for chunk in chunks]


_worker_stream: ExampleStream | None = None


def _worker_group(job: tuple[int, int, int, int]) -> list[dict]:
    """A worker's ``batch_group``, its examples drawn from an RNG seeded by the group number alone."""
    assert _worker_stream is not None
    seed, group, batch, canvas = job
    _worker_stream.rng.seed(seed * 1_000_003 + group)
    # numpy arrays travel by value; tensors would go through file descriptors shared between processes
    return [
        {name: tensor.numpy() for name, tensor in b.items()} for b in batch_group(_worker_stream, batch, canvas, group)
    ]


def worker_batches(entries: list, tokenizer, args: argparse.Namespace, start: int) -> Iterator[dict]:
    """Batches made by ``args.workers`` forked processes (on a GPU, making and tokenizing examples in one CPU
    process would be the bottleneck). Group n is the same whatever the number of workers; a resumed run
    continues at group ``start``, so its examples differ from the in-process stream's."""
    global _worker_stream
    _worker_stream = ExampleStream(entries, ExampleMaker(tokenizer, args.canvas), held_out=False, seed=args.seed)
    pool = multiprocessing.get_context("fork").Pool(args.workers)  # the workers inherit the corpus
    groups = itertools.count(start)

    def submit() -> multiprocessing.pool.AsyncResult:
        return pool.apply_async(_worker_group, ((args.seed, next(groups), args.batch, args.canvas),))

    # A bounded read-ahead (Pool.imap would queue groups without limit while the GPU is slower than the workers)
    pending = collections.deque(submit() for _ in range(2 * args.workers))
    try:
        while True:
            group = pending.popleft().get()
            pending.append(submit())
            for arrays in group:
                yield {name: torch.from_numpy(array) for name, array in arrays.items()}
    finally:
        pool.terminate()


def lr_at(step: int, elapsed: float, budget: float, peak: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from peak to 10% over the time budget of this run."""
    warm = min(1.0, (step + 1) / warmup)
    frac = min(1.0, elapsed / budget) if budget > 0 else 0.0
    return peak * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


# ---------------------------------------------------------------------------------------------- evaluation


def first_line(text: str) -> str:
    return text.split("\n", 1)[0].rstrip()


def infill(model, tokenizer, prompt_ids: list[int], seed: int = 0) -> tuple[str, list[int], float]:
    """One canvas with ``model.generate`` (the engine's sampler settings); text up to the first <eos>."""
    torch.manual_seed(seed)
    C = model.config.canvas_length
    out = model.generate(input_ids=torch.tensor([prompt_ids], device=model.device), max_new_tokens=C)
    new = out.sequences[0, len(prompt_ids) :].tolist()
    if EOS in new:
        new = new[: new.index(EOS)]
    new = [t for t in new if t != PAD]
    return tokenizer.decode(new, skip_special_tokens=True), new, float(out.tokens_per_forward[0])


@torch.no_grad()
def evaluate(model, tokenizer, eval_batches, em_examples, middle_weight) -> dict:
    was_training = model.training
    model.eval()
    g = torch.random.get_rng_state()
    torch.manual_seed(1234)  # the same corruption every evaluation
    losses, mid_losses, acc_all, acc_mid, n_all, n_mid = [], [], 0, 0, 0, 0
    for batch in eval_batches:
        with autocast(model.device):
            logits, _ = diffusion_forward(model, batch, sc_prob=0.5)
        losses.append(weighted_ce(logits, batch, 1.0).item())
        mid_losses.append(weighted_ce(logits, {**batch, "scored": batch["middle"]}, 1.0).item())
        # fully corrupted canvases (t = 1), one decoder pass without self-conditioning: what the first
        # denoising step sees
        with autocast(model.device):
            logits, _ = diffusion_forward(model, batch, t_override=1.0, self_condition=False)
        hit = logits.argmax(-1) == batch["ids"]
        m = batch["middle"]
        acc_all += hit[m].sum().item()
        n_all += m.sum().item()
        content = m & (batch["ids"] != PAD) & (batch["ids"] != EOS)
        acc_mid += hit[content].sum().item()
        n_mid += content.sum().item()
    em, tpf, t0 = 0, 0.0, time.perf_counter()
    samples = []
    for i, ex in enumerate(em_examples):
        text, _, tpf_i = infill(model, tokenizer, ex.ids[: ex.prompt_len], seed=i)
        tpf += tpf_i
        em += first_line(text) == first_line(ex.middle_text)
        if i < 3:
            samples.append({"want": ex.middle_text, "got": text})
    gen_s = time.perf_counter() - t0
    torch.random.set_rng_state(g)
    model.train(was_training)
    return {
        "heldout_loss": sum(losses) / len(losses),
        "heldout_canvas_loss": sum(mid_losses) / len(mid_losses),
        "full_noise_acc_canvas": acc_all / max(n_all, 1),
        "full_noise_acc_middle_tokens": acc_mid / max(n_mid, 1),
        "first_line_em": em / max(len(em_examples), 1),
        "n_em": len(em_examples),
        "tokens_per_forward": tpf / max(len(em_examples), 1),
        "ms_per_infill": 1000 * gen_s / max(len(em_examples), 1),
        "samples": samples,
    }


# ---------------------------------------------------------------------------------------------- main


def export(model, out_dir: Path) -> None:
    configs.set_generation_defaults(model, steps=EVAL_STEPS)
    configs.save_checkpoint(model, TOKENIZER_DIR, out_dir)


def main() -> None:
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
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=150)
    parser.add_argument("--middle-weight", type=float, default=2.0, help="loss weight of the canvas block")
    parser.add_argument("--eval-minutes", type=float, default=10.0)
    parser.add_argument("--save-minutes", type=float, default=5.0)
    parser.add_argument("--n-eval", type=int, default=64, help="held-out examples for loss and accuracy")
    parser.add_argument("--n-em", type=int, default=40, help="held-out single-line infills for exact match")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", type=Path, default=None, help="a packed corpus (engine.training.pack)")
    parser.add_argument(
        "--workers", type=int, default=0, help="processes that make the batches (0: in this process, resumable)"
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    args.out.mkdir(parents=True, exist_ok=True)
    log_file = args.out / "train.log"

    def log(record: dict) -> None:
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}
        with log_file.open("a") as f:
            f.write(json.dumps(record) + "\n")
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    if args.corpus is not None:
        entries = load_pack(args.corpus)
    else:
        entries = build_file_list(Path(os.environ.get("DG_CACHE", ".cache/train")) / "files.json")
    maker = ExampleMaker(tokenizer, args.canvas)
    stream = ExampleStream(entries, maker, held_out=False, seed=args.seed)
    # fixed held-out sets
    held = ExampleStream(entries, maker, held_out=True, seed=12345)
    eval_examples = [next(held) for _ in range(args.n_eval)]
    eval_batches = [
        to_device(pad_batch(eval_examples[i : i + 8], args.canvas), device) for i in range(0, len(eval_examples), 8)
    ]
    em_examples = []
    while len(em_examples) < args.n_em:
        ex = next(held)
        if ex.kind == "line":
            em_examples.append(ex)

    torch.manual_seed(args.seed)
    state_file = args.out / "state.pt"
    cfg = configs.build_config(args.size, len(tokenizer), canvas_length=args.canvas)
    model = DiffusionGemmaForBlockDiffusion(cfg)
    if args.init is not None and not (args.resume and state_file.exists()):
        # the shipped model's weights, with a fresh optimizer: how a later session continues training it
        model.load_state_dict(DiffusionGemmaForBlockDiffusion.from_pretrained(args.init).state_dict())
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    step, trained_s, tokens, best = 0, 0.0, 0, None
    if args.resume and state_file.exists():
        state = torch.load(state_file, weights_only=False, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, trained_s, tokens, best = state["step"], state["trained_s"], state["tokens"], state["best"]
        stream.set_state(state["data_rng"])
        torch.random.set_rng_state(state["torch_rng"].cpu())
        log({"event": "resume", "step": step, "trained_s": trained_s})
    else:
        n_params = sum(p.numel() for p in model.parameters())
        log(
            {
                "event": "start",
                "device": str(device),
                "size": args.size,
                "params": n_params,
                "args": {k: str(v) for k, v in vars(args).items()},
                "corpus": corpus_summary(entries),
            }
        )
    model.train()

    def save_state() -> None:
        tmp = state_file.with_suffix(".tmp")
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "trained_s": trained_s,
                "tokens": tokens,
                "best": best,
                "data_rng": stream.state(),
                "torch_rng": torch.random.get_rng_state(),
                "size": args.size,
                "canvas": args.canvas,
            },
            tmp,
        )
        os.replace(tmp, state_file)

    def run_eval() -> None:
        nonlocal best
        metrics = evaluate(model, tokenizer, eval_batches, em_examples, args.middle_weight)
        score = (metrics["first_line_em"], metrics["full_noise_acc_middle_tokens"])
        is_best = best is None or score >= tuple(best)
        log(
            {
                "event": "eval",
                "step": step,
                "trained_min": round(trained_s / 60, 1),
                "tokens": tokens,
                "best": is_best,
                **metrics,
            }
        )
        if is_best:
            best = list(score)
            export(model, args.out / "best")
        export(model, args.out / "last")

    run_start = time.perf_counter()
    budget = args.minutes * 60
    last_save = last_eval = time.perf_counter()
    run_eval() if step == 0 else None
    window_loss, window_n, window_t = 0.0, 0, time.perf_counter()
    if args.workers:
        batches = worker_batches(entries, tokenizer, args, start=step)
    else:
        batches = (b for n in itertools.count(step) for b in batch_group(stream, args.batch, args.canvas, n))
    while time.perf_counter() - run_start < budget:
        t0 = time.perf_counter()
        batch = to_device(next(batches), device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, time.perf_counter() - run_start, budget, args.lr, args.warmup)
        with autocast(device):
            logits, _ = diffusion_forward(model, batch)
        loss = weighted_ce(logits, batch, args.middle_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += int(batch["scored"].sum())
        trained_s += time.perf_counter() - t0
        window_loss += loss.item()
        window_n += 1
        if step % 25 == 0:
            dt = time.perf_counter() - window_t
            log(
                {
                    "event": "train",
                    "step": step,
                    "loss": round(window_loss / window_n, 4),
                    "lr": opt.param_groups[0]["lr"],
                    "s_per_step": round(dt / window_n, 3),
                    "tok_per_s": round(tokens / max(trained_s, 1e-9)),
                    "tokens": tokens,
                    "trained_min": round(trained_s / 60, 1),
                }
            )
            window_loss, window_n, window_t = 0.0, 0, time.perf_counter()
        now = time.perf_counter()
        if now - last_eval > args.eval_minutes * 60:
            run_eval()
            last_eval = time.perf_counter()
        if now - last_save > args.save_minutes * 60:
            save_state()
            last_save = time.perf_counter()
    run_eval()
    save_state()
    log({"event": "done", "step": step, "trained_min": round(trained_s / 60, 1), "tokens": tokens})


if __name__ == "__main__":
    main()
