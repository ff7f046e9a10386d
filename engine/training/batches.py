"""Training batches, in length-sorted groups: made in this process, or by a pool of forked workers that reads ahead.

``stream_batches`` draws from the run's resumable ``ExampleStream``; ``worker_batches`` makes them in worker
processes, for a GPU that one CPU process would starve.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import multiprocessing
import multiprocessing.pool
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from .data import Example, ExampleMaker, ExampleStream, FileEntry
from .objective import pad_batch

if TYPE_CHECKING:
    import numpy as np
    from transformers import PreTrainedTokenizerBase

GROUP_BATCHES = 4
"""Batches per length-sorted group."""


def batch_group(stream: Iterator[Example], batch: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Four batches from ``stream``: its next 4 x ``batch`` examples sorted by length, so that the rows of a batch
    have similar lengths (little row padding), in an order shuffled by ``seed``."""
    examples = sorted((next(stream) for _ in range(GROUP_BATCHES * batch)), key=lambda example: len(example.ids))
    chunks = [examples[i : i + batch] for i in range(0, len(examples), batch)]
    random.Random(seed).shuffle(chunks)
    return [pad_batch(chunk) for chunk in chunks]


def stream_batches(stream: ExampleStream, batch: int, start: int) -> Iterator[dict[str, torch.Tensor]]:
    """Batches made in this process, group after group from group ``start``; the stream's RNG is the position."""
    for group in itertools.count(start):
        yield from batch_group(stream, batch, group)


_worker_stream: ExampleStream | None = None


def _worker_group(job: tuple[int, int, int]) -> list[dict[str, np.ndarray]]:
    """A worker's ``batch_group``, its examples drawn from an RNG seeded by the group number alone."""
    assert _worker_stream is not None
    seed, group, batch = job
    _worker_stream.rng.seed(seed * 1_000_003 + group)
    # numpy arrays travel by value; tensors would go through file descriptors shared between processes
    return [
        {name: tensor.numpy() for name, tensor in tensors.items()}
        for tensors in batch_group(_worker_stream, batch, group)
    ]


def worker_batches(
    entries: list[FileEntry], tokenizer: PreTrainedTokenizerBase, args: argparse.Namespace, start: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches made by ``args.workers`` forked processes (on a GPU, making and tokenizing examples in one CPU
    process would be the bottleneck). Group n is the same whatever the number of workers; a resumed run
    continues at group ``start``, so its examples differ from the in-process stream's.

    ``args`` needs ``workers``, ``seed``, ``batch``, ``canvas`` and ``line_canvas`` (the training command's
    arguments)."""
    global _worker_stream
    _worker_stream = ExampleStream(
        entries, ExampleMaker(tokenizer, args.canvas, line_canvas=args.line_canvas), held_out=False, seed=args.seed
    )
    pool = multiprocessing.get_context("fork").Pool(args.workers)  # the workers inherit the corpus
    groups = itertools.count(start)

    def submit() -> multiprocessing.pool.AsyncResult[list[dict[str, np.ndarray]]]:
        return pool.apply_async(_worker_group, ((args.seed, next(groups), args.batch),))

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


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The batch's tensors on ``device`` (copied without waiting, where the device allows)."""
    return {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}
