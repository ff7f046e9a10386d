"""HumanEval-infilling pass@1 of a DiffusionGemma checkpoint, one canvas per task.

    python -m benchmarks.infill_eval [--model DIR] [--split single-line|multi-line|both] [--n 60]
                                     [--steps S [S ...]] [--canvas C [C ...]] [--json PATH] [--raw] [--random-init]

Each task's prompt (text before the gap) and suffix (text after it) go through the engine's prompt layout
(``engine.prompt.build_fim_prompt``); ``model.generate`` denoises one canvas with the checkpoint's generation
config (the same entropy-bound sampler, linear temperature and stable-and-confident stop the engine uses), after
``torch.manual_seed``. The completion is the canvas text up to the first <eos>. The program ``prompt + completion +
suffix`` is run with the task's tests in a subprocess with a timeout: pass@1 (one sample). Also reported: exact match
(completion == canonical solution, ignoring leading/trailing blank space), ``parses`` (the share of filled-in
programs that are valid Python, tests aside: whether the completions read as code), tokens/s, ms per
completion, tokens per forward, and the do-nothing floor (the gap filled with ``pass`` at the right indentation).

``--pin-suffix N`` also holds the suffix's first N tokens fixed at the end of the canvas (notes §6.3), where the
bidirectional decoder sees them at every step; the middle is what comes before them.
``--n`` takes N tasks spread evenly over the file (deterministic); ``--limit N`` takes the first N instead.
``--steps`` and ``--canvas`` take several values to sweep (every combination is run); the JSON holds every run
(the top-level figures are the first run's) and a PNG plots pass@1 against the steps, with the floor.
Without ``--raw`` each completion goes through the language server's post-processing
(``diffgemma_lsp.postprocess``) first, as it would before reaching the editor; ``--raw`` scores the model's text.
``--also-raw`` tests both on the same completions (``raw_pass_at_1`` beside ``pass_at_1``, and the tasks that
only one of them passes): the paired measure of what post-processing adds.
Data: ../shared/data/humaneval-infilling (``--data`` takes any .jsonl[.gz] of the same fields). Never train on it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "humaneval-infilling"
SPLITS = {"single-line": "SingleLineInfilling.jsonl.gz", "multi-line": "MultiLineInfilling.jsonl.gz"}
EOS, PAD = 1, 0


def load_tasks(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def pick(tasks: list[dict], n: int | None, limit: int | None) -> list[dict]:
    if limit:
        return tasks[:limit]
    if not n or n >= len(tasks):
        return tasks
    return [tasks[i * len(tasks) // n] for i in range(n)]


def run_tests(program: str, timeout: float) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "task.py"
        file.write_text(program)
        try:
            done = subprocess.run([sys.executable, str(file)], cwd=tmp, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0


def compiles(program: str) -> bool:
    """Whether the filled-in program is valid Python (whatever its tests say): does the completion read as code."""
    with warnings.catch_warnings():  # a completion's odd literals warn: not this script's output
        warnings.simplefilter("ignore")
        try:
            compile(program, "<task>", "exec")
        except (SyntaxError, ValueError):
            return False
    return True


def program_for(task: dict, middle: str, suffix: str | None = None) -> str:
    suffix = task["suffix"] if suffix is None else suffix
    return f"{task['prompt']}{middle}{suffix}\n\n{task['test']}\n\ncheck({task['entry_point']})\n"


def floor_middle(task: dict) -> str:
    """The do-nothing fill: ``pass`` at the indentation of the canonical solution's first line."""
    first = task["canonical_solution"].split("\n", 1)[0]
    return " " * (len(first) - len(first.lstrip())) + "pass\n"


def finish(task: dict, text: str, raw: bool) -> tuple[str, str]:
    """(middle, suffix) as the editor would hold them: the language server's post-processing unless ``raw``."""
    if raw:
        return text, task["suffix"]
    from diffgemma_lsp.postprocess import postprocess

    edit = postprocess(task["prompt"], task["suffix"], text, "python")
    if edit is None:
        return "", task["suffix"]
    if edit.replace_to_eol:  # the edit replaced the closing characters up to the end of the line
        rest = task["suffix"].split("\n", 1)
        return edit.text, "\n" + rest[1] if len(rest) > 1 else ""
    return edit.text, task["suffix"]


def load_model(model_dir: Path, random_init: bool, seed: int):
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir, dtype=torch.float32)
    if random_init:  # same config and generation config, fresh weights
        torch.manual_seed(seed)
        fresh = DiffusionGemmaForBlockDiffusion(model.config)
        fresh.generation_config = model.generation_config
        model = fresh
    return model.float().eval(), tokenizer


class PinCanvasTokens:
    """A logits processor that holds canvas positions at fixed tokens (-1: free) at every denoising step: a
    one-hot distribution there is sampled, accepted first (entropy 0) and fed back through self-conditioning."""

    def __init__(self, pinned: torch.Tensor) -> None:
        self.pinned = pinned

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:  # no **kwargs: see notes §6.3
        forced = torch.full_like(scores, -1e9).scatter_(-1, self.pinned.clamp(min=0).unsqueeze(-1), 0.0)
        return torch.where((self.pinned >= 0).unsqueeze(-1), forced, scores)


def pin_suffix_kwargs(suffix_ids: list[int], canvas: int) -> dict:
    """``generate`` arguments that pin ``suffix_ids`` at the end of the canvas (notes §6.3); {} when empty."""
    if not suffix_ids:
        return {}
    from transformers import LogitsProcessorList

    pinned = torch.full((1, canvas), -1, dtype=torch.long)
    pinned[0, canvas - len(suffix_ids) :] = torch.tensor(suffix_ids)
    start = torch.where(pinned >= 0, pinned, torch.randint(0, 8192, (1, canvas)))
    return {"decoder_input_ids": start, "logits_processor": LogitsProcessorList([PinCanvasTokens(pinned)])}


def evaluate(model, tokenizer, tasks: list[dict], encode, special, gen_kwargs: dict, args, with_floor: bool) -> dict:  # noqa: ANN001
    """pass@1, exact match and speed of one setting on ``tasks`` (and the do-nothing floor if asked)."""
    from engine.prompt import PromptParts, build_fim_prompt

    passed = exact = floor_passed = parses = raw_passed = 0
    latencies, n_tokens, tpfs, samples, passed_ids = [], 0, [], [], []
    only_processed: list[str] = []  # with --also-raw: passed with post-processing only, or raw only
    only_raw: list[str] = []
    for i, task in enumerate(tasks):
        prompt = build_fim_prompt(
            PromptParts(prefix=task["prompt"], suffix=task["suffix"]), encode, special, args.max_prompt_tokens
        )
        torch.manual_seed(args.seed + i)
        extra = pin_suffix_kwargs(encode(task["suffix"])[: args.pin_suffix], gen_kwargs["max_new_tokens"])
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([prompt.ids]), **gen_kwargs, **extra)
        latencies.append(time.perf_counter() - t0)
        new = out.sequences[0, len(prompt.ids) :].tolist()
        if extra:  # the pinned suffix tokens end the canvas; the middle is what comes before them
            new = new[: len(new) - args.pin_suffix]
        if EOS in new:
            new = new[: new.index(EOS)]
        new = [t for t in new if t != PAD]
        n_tokens += len(new)
        tpfs.append(float(out.tokens_per_forward[0]))
        text = tokenizer.decode(new, skip_special_tokens=True)
        completion, suffix = finish(task, text, args.raw)
        program = program_for(task, completion, suffix)
        ok = run_tests(program, args.timeout)
        parses += compiles(program)
        passed += ok
        task_id = task.get("task_id", str(i))
        if ok:
            passed_ids.append(task_id)
        if args.also_raw and not args.raw:  # the same completion, as the model wrote it
            raw_ok = run_tests(program_for(task, text), args.timeout)
            raw_passed += raw_ok
            if ok != raw_ok:
                (only_processed if ok else only_raw).append(task_id)
        exact += completion.strip() == task["canonical_solution"].strip()
        if with_floor:
            floor_passed += run_tests(program_for(task, floor_middle(task)), args.timeout)
        if len(samples) < 8:
            samples.append(
                {"task_id": task.get("task_id"), "want": task["canonical_solution"], "got": completion, "passed": ok}
            )
    n = len(tasks)
    return {
        "n_tasks": n,
        "pass_at_1": passed / n,
        "exact_match": exact / n,
        "parses": parses / n,
        "floor_pass_at_1": floor_passed / n if with_floor else None,
        "tokens_per_s": n_tokens / sum(latencies),
        "ms_per_completion": 1000 * sum(latencies) / n,
        "latency_ms_median": 1000 * statistics.median(latencies),
        "tokens_per_forward": sum(tpfs) / n,
        "tokens_per_completion": n_tokens / n,
        "samples": samples,
        "passed_task_ids": passed_ids,
        **(
            {"raw_pass_at_1": raw_passed / n, "passed_only_processed": only_processed, "passed_only_raw": only_raw}
            if args.also_raw and not args.raw
            else {}
        ),
    }


def plot_steps(report: dict, path: Path) -> None:
    """pass@1 against denoising steps, one line per split and canvas, the floor dashed."""
    from benchmarks.plots import pyplot, save

    plt = pyplot()
    if plt is None:
        return
    figure, axes = plt.subplots(figsize=(6, 4))
    names = list(report["runs"][0]["splits"])
    for name in names:
        for canvas in sorted({run["canvas"] for run in report["runs"]}):
            runs = sorted((r for r in report["runs"] if r["canvas"] == canvas), key=lambda r: r["steps"])
            xs = [r["steps"] for r in runs]
            axes.plot(
                xs, [100 * r["splits"][name]["pass_at_1"] for r in runs], marker="o", label=f"{name}, canvas {canvas}"
            )
        floor = report["runs"][0]["splits"][name]["floor_pass_at_1"]
        if floor is not None:
            axes.axhline(100 * floor, linestyle="--", linewidth=1, color="grey")
            axes.annotate(
                f"do-nothing floor, {name}", (0.01, 100 * floor), xycoords=("axes fraction", "data"), fontsize=7
            )
    values = [100 * r["splits"][n]["pass_at_1"] for r in report["runs"] for n in names]
    floors = [100 * (report["runs"][0]["splits"][n]["floor_pass_at_1"] or 0) for n in names]
    axes.set_ylim(0, max(10.0, 1.2 * max(values + floors)))
    axes.set_xticks(sorted({run["steps"] for run in report["runs"]}))
    axes.set_xlabel("denoising steps (max)")
    axes.set_ylabel("pass@1 (%)")
    axes.set_title(f"HumanEval-infilling, {Path(report['model']).name}{' (raw)' if report['raw'] else ''}")
    axes.legend(fontsize=7)
    save(figure, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / "engine" / "default_model")
    parser.add_argument("--split", choices=[*SPLITS, "both"], default="both")
    parser.add_argument("--data", type=Path, help="a .jsonl[.gz] of HumanEval-infilling tasks (overrides --split)")
    parser.add_argument("--n", type=int, default=60, help="tasks per split, spread evenly over the file")
    parser.add_argument("--limit", type=int, help="take the first N tasks instead")
    parser.add_argument("--steps", type=int, nargs="+", help="max denoising steps, one or more (default: the model's)")
    parser.add_argument("--canvas", type=int, nargs="+", help="canvas length, one or more (default: the model's)")
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=None, help="prompt budget (default: the engine's for this checkpoint)"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per test run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--raw", action="store_true", help="no post-processing of completions")
    parser.add_argument(
        "--also-raw",
        action="store_true",
        help="also test each completion as the model wrote it: both pass@1 figures from the same completions",
    )
    parser.add_argument(
        "--pin-suffix", type=int, default=0, help="hold the suffix's first N tokens at the end of the canvas too"
    )
    parser.add_argument("--random-init", action="store_true", help="same config, random weights (a baseline)")
    parser.add_argument("--no-floor", action="store_true", help="skip the do-nothing floor")
    parser.add_argument("--json", type=Path, default=None, help="default: benchmarks/results/infill_eval[_raw].json")
    parser.add_argument("--plot", type=Path, default=None, help="default: the --json path with .png")
    args = parser.parse_args()
    if args.json is None:
        args.json = REPO / "benchmarks" / "results" / ("infill_eval_raw.json" if args.raw else "infill_eval.json")
    if args.plot is None:
        args.plot = args.json.with_suffix(".png")

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(REPO))
    if args.max_prompt_tokens is None:  # what the engine would use: its default, capped by the checkpoint's hint
        from engine.model import DEFAULT_MAX_PROMPT_TOKENS, HINTS_FILE

        hints = args.model / HINTS_FILE
        hint = json.loads(hints.read_text()).get("max_prompt_tokens") if hints.is_file() else None
        args.max_prompt_tokens = min(DEFAULT_MAX_PROMPT_TOKENS, hint or DEFAULT_MAX_PROMPT_TOKENS)
    from engine.prompt import special_ids_from

    model, tokenizer = load_model(args.model, args.random_init, args.seed)
    canvases = args.canvas or [model.config.canvas_length]
    steps_list = args.steps or [model.generation_config.max_denoising_steps]
    known = tokenizer.get_vocab()
    special = special_ids_from(lambda tok: known.get(tok))
    if special is None:
        raise SystemExit("this checkpoint's tokenizer has no FIM tokens; infill_eval only supports the fim layout")

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False) if text else []

    splits = (
        {args.data.name: args.data}
        if args.data
        else {name: DEFAULT_DATA / file for name, file in SPLITS.items() if args.split in (name, "both")}
    )
    report: dict = {
        "model": str(args.model),
        "random_init": args.random_init,
        "raw": args.raw,
        "pin_suffix": args.pin_suffix,
        "max_prompt_tokens": args.max_prompt_tokens,
        "threads": args.threads,
        "params": sum(p.numel() for p in model.parameters()),
        "runs": [],
    }
    floors: dict[str, float | None] = {}
    for canvas in canvases:
        model.config.canvas_length = canvas
        for steps in steps_list:
            gen_kwargs = {"max_new_tokens": canvas, "max_denoising_steps": steps}
            with torch.no_grad():  # warm-up (first calls allocate)
                model.generate(
                    input_ids=torch.tensor([[special.bos, special.fim_suffix, special.fim_prefix, special.fim_middle]]),
                    **gen_kwargs,
                )
            run = {"canvas": canvas, "steps": steps, "splits": {}}
            for name, path in splits.items():
                tasks = pick(load_tasks(path), args.n, args.limit)
                with_floor = not args.no_floor and name not in floors
                result = evaluate(model, tokenizer, tasks, encode, special, gen_kwargs, args, with_floor)
                if with_floor:
                    floors[name] = result["floor_pass_at_1"]
                result["floor_pass_at_1"] = floors.get(name)
                run["splits"][name] = result
                summary = {k: v for k, v in result.items() if k not in ("samples", "passed_task_ids")}
                print(json.dumps({"split": name, "canvas": canvas, "steps": steps, **summary}), flush=True)
            report["runs"].append(run)
    # the first run's figures at the top level, for tools that read one result
    first = report["runs"][0]
    report.update({"canvas": first["canvas"], "steps": first["steps"], "splits": first["splits"]})
    first_split = next(iter(first["splits"].values()))
    report.update(
        {
            k: first_split[k]
            for k in (
                "pass_at_1",
                "exact_match",
                "tokens_per_s",
                "ms_per_completion",
                "latency_ms_median",
                "tokens_per_forward",
                "n_tasks",
            )
        }
    )
    plot_steps(report, args.plot)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
