"""A packed corpus carries the texts (for a machine without these sources) and feeds the same example stream."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from diffgemma_engine.loading.model import DEFAULT_MODEL_DIR
from diffgemma_engine.training.data import ExampleMaker, ExampleStream, FileEntry, load_pack
from diffgemma_engine.training.pack import pack

SOURCE = "\n".join(f"def f{n}(x):\n    y = x * {n}\n    return y + {n}\n" for n in range(40))


def _entries(tmp_path: Path) -> list[FileEntry]:
    entries = []
    for index, held_out in enumerate([True, False, False, False]):
        path = tmp_path / f"m{index}.py"
        path.write_text(SOURCE.replace("def f", f"def g{index}_"))
        entries.append(FileEntry(str(path), path.stat().st_size, "python", held_out))
    return entries


def test_pack_round_trip_and_examples(tmp_path: Path) -> None:
    entries = _entries(tmp_path)
    kept = pack(entries, tmp_path / "corpus.jsonl.gz", max_bytes=10**9, seed=0)
    assert len(kept) == 4
    loaded = load_pack(tmp_path / "corpus.jsonl.gz")
    assert {entry.path for entry in loaded} == {entry.path for entry in entries}
    for entry in loaded:
        assert entry.text == Path(entry.path).read_text()
        Path(entry.path).unlink()  # from here on, the texts come from the pack alone
    maker = ExampleMaker(AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR), canvas=32)
    example = next(ExampleStream(loaded, maker, held_out=False, seed=0))
    assert example.prompt_len > 0 and len(example.ids) > example.prompt_len


def test_a_size_cap_keeps_every_held_out_file(tmp_path: Path) -> None:
    kept = pack(_entries(tmp_path), tmp_path / "small.jsonl.gz", max_bytes=1, seed=0)
    assert [entry.held_out for entry in kept] == [True, False]  # all held-out files, then one past the cap


def test_worker_batches_do_not_depend_on_the_number_of_workers(tmp_path: Path) -> None:
    import argparse
    import itertools

    import torch

    from diffgemma_engine.training.batches import worker_batches

    entries = _entries(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)

    def first(workers: int, start: int) -> list[dict[str, torch.Tensor]]:
        args = argparse.Namespace(workers=workers, seed=3, batch=2, canvas=32, line_canvas=16)
        batches = worker_batches(entries, tokenizer, args, start=start)
        taken = list(itertools.islice(batches, 8))  # two groups of four batches
        batches.close()  # ends the worker pool
        return taken

    one, two = first(1, start=0), first(2, start=0)
    assert all(torch.equal(a["ids"], b["ids"]) for a, b in zip(one, two, strict=True))
    assert all(a["ids"].shape[0] == 2 for a in one)
    assert not torch.equal(first(1, start=5)[0]["ids"], one[0]["ids"])  # a resumed run continues elsewhere
