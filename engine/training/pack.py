"""Pack the training corpus into one gzip file, for a machine that does not have this one's sources.

    python -m diffgemma_engine.training.pack --out .cache/gpu/corpus.jsonl.gz [--max-mb 34] [--seed 0]

A lent GPU machine starts bare and takes at most 64 MiB of files, the repository included, so the corpus that
``train.py`` reads from this machine's files (``.cache/train/files.json``) travels as JSON lines of
``{path, chars, language, held_out, text}``: every held-out file (so held-out figures stay comparable), then
training files in a seeded random order until the compressed size reaches ``--max-mb``. Train from it with
``python -m diffgemma_engine.training.train --corpus PACK ...`` (``engine/training/device_train.sh`` does, on a lent
GPU).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import sys
from pathlib import Path

from .data import FileEntry, build_file_list, corpus_summary


def pack(entries: list[FileEntry], out: Path, max_bytes: int, seed: int) -> list[FileEntry]:
    """Write the pack; returns the entries that went in."""
    held = [entry for entry in entries if entry.held_out]
    rest = [entry for entry in entries if not entry.held_out]
    random.Random(seed).shuffle(rest)
    kept = []
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9) as packed:
        for entry in held + rest:
            try:
                text = Path(entry.path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            row = {**{k: v for k, v in entry.__dict__.items() if k != "text"}, "text": text}
            packed.write((json.dumps(row) + "\n").encode())
            kept.append(entry)
            if not entry.held_out and buffer.tell() > max_bytes:
                break
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(buffer.getvalue())
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-mb", type=float, default=34.0, help="compressed size to stop at")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    entries = build_file_list(Path(os.environ.get("DG_CACHE", ".cache/train")) / "files.json")
    kept = pack(entries, args.out, int(args.max_mb * 1024 * 1024), args.seed)
    summary = corpus_summary(kept)
    sys.stdout.write(json.dumps({"out": str(args.out), "bytes": args.out.stat().st_size, **summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
