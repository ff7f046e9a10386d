"""HumanEval-infilling pass@1 of a DiffusionGemma checkpoint, one canvas per task.

    python -m benchmarks.infill_eval [--model DIR] [--split single-line|mid-line|multi-line|default|all] [--n 60]
                                     [--steps S [S ...]] [--canvas C [C ...]] [--json PATH] [--raw] [--random-init]
                                     [--backend engine|generate]

The default splits are single-line (the cursor at the start of the removed line) and mid-line (derived from the
same tasks: the cursor at a random character inside the removed line, inside a word too, and the rest of the line
to fill; ``benchmarks.humaneval.mid_line_task``), each with its own do-nothing floor (``pass`` at the line's
indentation; the empty fill for mid-line). ``--split all`` adds multi-line. ``--n``/``--limit`` pick the
single-line tasks a mid-line split is derived from, so both splits come from the same tasks.

Each task's prompt (text before the gap) and suffix (text after it) become the ``Infill`` request the language server
would send with the cursor in the gap, and the engine serves it in-process
(``diffgemma_engine.request.infill.run_infill``: the checkpoint's prompt layout, canvas and step choice, and the
engine's sampler, seeded per task). The completion is the canvas text up to the first <eos>. ``--backend generate`` runs
transformers' ``model.generate`` on the same prompt ids instead (the reference loop, with the checkpoint's generation
config, after ``torch.manual_seed``; sessions 1 to 3 measured with it). The program ``prompt + completion + suffix`` is
run with the task's tests in a subprocess with a timeout: pass@1 (one sample). Also reported: exact match (completion ==
canonical solution, ignoring leading/trailing blank space), ``parses`` (the share of filled-in programs that are valid
Python, tests aside: whether the completions read as code), ``suppressed`` (the share post-processing left nothing of:
no completion shown, counted as failed and not parsing), tokens/s, ms per completion, tokens per forward, and the
do-nothing floor (the gap filled with ``pass`` at the right indentation).

``--pin-suffix N`` (with ``--backend generate``) also holds the suffix's first N tokens fixed at the end of the
canvas (notes §6.3), where the bidirectional decoder sees them at every step; the middle is what comes before them.
``--n`` takes N tasks spread evenly over the file (deterministic); ``--limit N`` takes the first N instead.
``--samples k`` completes each task k times with different seeds (task i's first seed is ``--seed + i``, as with
one sample): the figures are means over all completions, and ``pass_at_1_per_sample`` shows their spread. With
few passes, one seed's figure moves by several tasks from seed to seed (benchmarks/README.md).
``--steps`` and ``--canvas`` take several values to sweep (every combination is run); the JSON holds every run
(the top-level figures are the first run's) and a PNG plots pass@1 against the steps, with the floor.
Without ``--raw`` each completion goes through the language server's post-processing
(``diffgemma_lsp.postprocess``) first, as it would before reaching the editor; ``--raw`` scores the model's text.
``--also-raw`` tests both on the same completions (``raw_pass_at_1`` beside ``pass_at_1``, and the tasks that
only one of them passes): the paired measure of what post-processing adds.
Data: ``benchmarks.humaneval`` (``--data`` takes any .jsonl[.gz] of the same fields). Never train on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion, LogitsProcessorList

from benchmarks.humaneval import (
    DEFAULT_DATA,
    MID_LINE,
    SPLITS,
    compiles,
    floor_middle,
    load_tasks,
    mid_line_task,
    pick,
    program_for,
    run_tests,
)
from benchmarks.plots import pass_at_1_by_steps
from benchmarks.report import RESULTS, write_json
from diffgemma_engine.canvas.caches import DEFAULT_SLOTS
from diffgemma_engine.loading.checkpoint_files import DEFAULT_MODEL_DIR
from diffgemma_engine.loading.model import DEFAULT_MAX_PROMPT_TOKENS, read_hints
from diffgemma_engine.loading.model import load_model as engine_load_model
from diffgemma_engine.request.infill import check_request, cut_at_eos, run_infill
from diffgemma_engine.shared import protocol, vocab
from diffgemma_engine.shared.prompt import PromptParts, build_fim_prompt, special_ids_from
from diffgemma_lsp.postprocess import postprocess
from diffgemma_lsp.postprocess.answer import strip_fence, unwrap_answer

EOS_IDS = {vocab.SPECIAL_IDS[vocab.EOS]}
"""Where ``--backend generate``'s canvas ends: the project tokenizer's ids (the engine reads its model's own)."""
PAD_ID = vocab.SPECIAL_IDS[vocab.PAD]


def finish(task: dict, text: str, raw: bool, instruct: bool = False) -> tuple[str, str] | None:
    """(middle, suffix) as the editor would hold them: the language server's post-processing unless ``raw``
    (with ``instruct``, an instruction model's answer unwrapped first, as for a ``chat`` checkpoint).

    None when post-processing leaves nothing to show: the editor shows no completion, which counts as a failure
    (not as the empty middle, whose program can pass where the line did not matter, like the do-nothing floor).
    """
    if raw:
        return text, task["suffix"]
    edit = postprocess(task["prompt"], task["suffix"], text, "python", instruct=instruct)
    if edit is None:
        return None
    return edit.text, task["suffix"][len(edit.replaced(task["suffix"])) :]


def load_model(model_dir: Path, random_init: bool, seed: int):
    """transformers' model (float32, eval) and tokenizer of ``model_dir``, for ``--backend generate``."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir, dtype=torch.float32)
    if random_init:
        model = fresh_weights(model, seed)
    return model.float().eval(), tokenizer


def fresh_weights(model, seed: int):
    """A model of the same config and generation config with random weights (the ``--random-init`` baseline)."""
    torch.manual_seed(seed)
    fresh = type(model)(model.config)
    fresh.generation_config = model.generation_config
    return fresh.float().eval()


def load_engine_model(model_dir: Path, random_init: bool, seed: int, max_prompt_tokens: int):
    """The engine's ``LoadedModel`` on CPU (fresh weights of the same config with ``random_init``)."""
    loaded = engine_load_model(model_dir, "cpu", "float32", max_prompt_tokens)
    if random_init:
        fresh = fresh_weights(loaded.model, seed)
        loaded = dataclasses.replace(loaded, model=fresh, cache_slots=DEFAULT_SLOTS)
    return loaded


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
    pinned = torch.full((1, canvas), -1, dtype=torch.long)
    pinned[0, canvas - len(suffix_ids) :] = torch.tensor(suffix_ids)
    start = torch.where(pinned >= 0, pinned, torch.randint(0, 8192, (1, canvas)))
    return {"decoder_input_ids": start, "logits_processor": LogitsProcessorList([PinCanvasTokens(pinned)])}


@dataclass(frozen=True)
class Completion:
    """One task's model output: its text (up to <eos>), its token count and tokens per decoder forward."""

    text: str
    tokens: int
    tokens_per_forward: float
    canvas: int = 0
    """The canvas length it was denoised on (the engine's: the line canvas for a cursor inside a line)."""


Complete = Callable[[dict, int], Completion]
"""Completes a task with a seed (``sample_seeds``)."""
SAMPLE_SEED_STRIDE = 1_000_003


def engine_completer(loaded, canvas: int, steps: int) -> Complete:
    """The engine's own infill, with the request the language server would send (canvas/steps 0: the engine's)."""
    run_infill(loaded, protocol.Infill(id="warm-up", uri="", prefix="def f():\n", max_steps=2))

    def complete(task: dict, seed: int) -> Completion:
        request = protocol.Infill(
            id=str(seed),
            uri="file:///task.py",
            prefix=task["prompt"],
            suffix=task["suffix"],
            language_id="python",
            canvas_length=canvas,
            max_steps=steps,
            scope=protocol.cursor_scope(task["prompt"]),
            seed=seed,
        )
        text, _, timings = run_infill(loaded, request)
        used, _ = check_request(loaded, request)
        return Completion(text, timings.new_tokens, timings.new_tokens / max(timings.steps, 1), used)

    return complete


def generate_completer(model, tokenizer, encode, special, canvas: int, steps: int, args) -> Complete:
    """transformers' ``model.generate`` on the engine's prompt ids, with the checkpoint's generation config."""
    model.config.canvas_length = canvas
    gen_kwargs = {"max_new_tokens": canvas, "max_denoising_steps": steps}
    with torch.no_grad():  # warm-up (first calls allocate)
        model.generate(
            input_ids=torch.tensor([[special.bos, special.fim_suffix, special.fim_prefix, special.fim_middle]]),
            **gen_kwargs,
        )

    def complete(task: dict, seed: int) -> Completion:
        prompt = build_fim_prompt(
            PromptParts(prefix=task["prompt"], suffix=task["suffix"]), encode, special, args.max_prompt_tokens
        )
        torch.manual_seed(seed)
        extra = pin_suffix_kwargs(encode(task["suffix"])[: args.pin_suffix], canvas)
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([prompt.ids]), **gen_kwargs, **extra)
        new = out.sequences[0, len(prompt.ids) :].tolist()
        if extra:  # the pinned suffix tokens end the canvas; the middle is what comes before them
            new = new[: len(new) - args.pin_suffix]
        new, _ = cut_at_eos(new, EOS_IDS, PAD_ID)
        text = tokenizer.decode(new, skip_special_tokens=True)
        return Completion(text, len(new), float(out.tokens_per_forward[0]), canvas)

    return complete


def sample_seeds(base: int, task_index: int, samples: int) -> list[int]:
    """The seed of each sample of a task: ``base + task_index`` first (one sample: as before ``--samples``)."""
    return [base + task_index + sample * SAMPLE_SEED_STRIDE for sample in range(samples)]


def evaluate(tasks: list[dict], complete: Complete, args, with_floor: bool) -> dict:
    """pass@1, exact match and speed of one setting on ``tasks`` (and the do-nothing floor if asked).

    With ``--samples k`` each task is completed k times with different seeds and every figure is the mean over
    all k x n completions: for pass@1, the unbiased estimator of HumanEval's pass@k at k = 1 (c/k per task).
    """
    passed = exact = floor_passed = parses = raw_passed = suppressed = fenced = echoing = 0
    instruct = getattr(args, "instruct", False)
    latencies, n_tokens, tpfs, samples, passed_ids = [], 0, [], [], []
    canvases: dict[int, int] = {}
    only_processed: list[str] = []  # with --also-raw: passed with post-processing only, or raw only
    only_raw: list[str] = []
    per_sample = [0] * args.samples
    runs = [
        (i, sample, task, seed)
        for i, task in enumerate(tasks)
        for sample, seed in enumerate(sample_seeds(args.seed, i, args.samples))
    ]
    for i, sample, task, seed in runs:
        t0 = time.perf_counter()
        out = complete(task, seed)
        latencies.append(time.perf_counter() - t0)
        n_tokens += out.tokens
        canvases[out.canvas] = canvases.get(out.canvas, 0) + 1
        tpfs.append(out.tokens_per_forward)
        text = out.text
        finished = finish(task, text, args.raw, instruct)
        if instruct:  # what shapes the instruction model answers in (diffgemma_lsp.postprocess.answer)
            fenced += strip_fence(text) != text
            echoing += unwrap_answer(text, task["prompt"], task["suffix"]) != strip_fence(text)
        suppressed += finished is None
        completion, suffix = finished or ("", task["suffix"])
        program = program_for(task, completion, suffix)
        ok = finished is not None and run_tests(program, args.timeout)
        parses += finished is not None and compiles(program)
        passed += ok
        per_sample[sample] += ok
        task_id = task.get("task_id", str(i)) + (f"#{sample}" if args.samples > 1 else "")
        if ok:
            passed_ids.append(task_id)
        if args.also_raw and not args.raw:  # the same completion, as the model wrote it
            raw_ok = run_tests(program_for(task, text), args.timeout)
            raw_passed += raw_ok
            if ok != raw_ok:
                (only_processed if ok else only_raw).append(task_id)
        exact += completion.strip() == task["canonical_solution"].strip()
        if with_floor and sample == 0:
            floor_passed += run_tests(program_for(task, floor_middle(task)), args.timeout)
        if len(samples) < 8:
            samples.append(
                {"task_id": task.get("task_id"), "want": task["canonical_solution"], "got": completion, "passed": ok}
            )
    n = len(runs)  # completions: tasks x samples
    return {
        "n_tasks": len(tasks),
        "samples_per_task": args.samples,
        "pass_at_1": passed / n,
        "pass_at_1_per_sample": [count / len(tasks) for count in per_sample],
        "exact_match": exact / n,
        "parses": parses / n,
        "suppressed": suppressed / n,
        "floor_pass_at_1": floor_passed / len(tasks) if with_floor else None,
        "tokens_per_s": n_tokens / sum(latencies),
        "ms_per_completion": 1000 * sum(latencies) / n,
        "latency_ms_median": 1000 * statistics.median(latencies),
        "tokens_per_forward": sum(tpfs) / n,
        "tokens_per_completion": n_tokens / n,
        "completions_by_canvas": {str(length): count for length, count in sorted(canvases.items())},
        "samples": samples,
        "passed_task_ids": passed_ids,
        **({"answers_fenced": fenced / n, "answers_echoing_code": echoing / n} if instruct else {}),
        **(
            {"raw_pass_at_1": raw_passed / n, "passed_only_processed": only_processed, "passed_only_raw": only_raw}
            if args.also_raw and not args.raw
            else {}
        ),
    }


SPLIT_SETS = {"default": ("single-line", MID_LINE), "all": ("single-line", MID_LINE, "multi-line")}


def chosen_splits(args) -> dict[str, list[dict]]:
    """The tasks of each split ``--split`` names, picked by ``--n``/``--limit`` (mid-line: from the single-line
    tasks picked, those whose line is long enough to hold a cursor inside it)."""
    names = SPLIT_SETS.get(args.split, (args.split,))
    out = {}
    for name in names:
        source = "single-line" if name == MID_LINE else name
        tasks = pick(load_tasks(args.data_dir / SPLITS[source]), args.n, args.limit)
        out[name] = [task for task in map(mid_line_task, tasks) if task] if name == MID_LINE else tasks
    return out


def parse_args() -> argparse.Namespace:
    """The benchmark's command line, its defaults filled in."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument(
        "--split",
        choices=[*SPLITS, MID_LINE, "default", "all"],
        default="default",
        help="default: single-line and mid-line; all: multi-line too",
    )
    parser.add_argument("--data", type=Path, help="a .jsonl[.gz] of HumanEval-infilling tasks (overrides --split)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA,
        help="the folder of the splits' files (default: ../shared/data/...)",
    )
    parser.add_argument("--n", type=int, default=60, help="tasks per split, spread evenly over the file")
    parser.add_argument("--limit", type=int, help="take the first N tasks instead")
    parser.add_argument("--steps", type=int, nargs="+", help="max denoising steps, one or more (default: the model's)")
    parser.add_argument("--canvas", type=int, nargs="+", help="canvas length, one or more (default: the model's)")
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=None, help="prompt budget (default: the engine's for this checkpoint)"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per test run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--samples", type=int, default=1, help="completions per task, each with its own seed; figures are means"
    )
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
    parser.add_argument(
        "--backend",
        choices=["engine", "generate"],
        default="engine",
        help="the engine's infill (default) or transformers' model.generate on the same prompt ids",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the do-nothing floor")
    parser.add_argument("--json", type=Path, default=None, help="default: benchmarks/results/infill_eval[_raw].json")
    parser.add_argument("--plot", type=Path, default=None, help="default: the --json path with .png")
    args = parser.parse_args()
    if args.json is None:
        args.json = RESULTS / ("infill_eval_raw.json" if args.raw else "infill_eval.json")
    if args.plot is None:
        args.plot = args.json.with_suffix(".png")

    return args


Shown = Callable[[int, int], tuple[int, int]]
"""(asked canvas, asked steps) -> the canvas and steps the backend uses."""


def backend_of(args: argparse.Namespace) -> tuple[Any, list[int], list[int], Callable[[int, int], Complete], Shown]:
    """The model, the canvases and step counts to run, a completer for each pair and what each pair runs as."""
    if args.max_prompt_tokens is None:  # what the engine would use: its default, capped by the checkpoint's hint
        hint = read_hints(args.model).get("max_prompt_tokens", DEFAULT_MAX_PROMPT_TOKENS)
        args.max_prompt_tokens = min(DEFAULT_MAX_PROMPT_TOKENS, hint)
    if args.backend == "engine":
        if args.pin_suffix:
            raise SystemExit("--pin-suffix needs --backend generate (the engine does not pin)")
        loaded = load_engine_model(args.model, args.random_init, args.seed, args.max_prompt_tokens)
        model = loaded.model
        # 0: the engine chooses, as it does for the language server (recorded as the model's own figures)
        canvases, steps_list = args.canvas or [0], args.steps or [0]
        args.instruct = loaded.layout.name is protocol.Layout.CHAT

        def completer(canvas: int, steps: int) -> Complete:
            return engine_completer(loaded, canvas, steps)

        def shown(canvas: int, steps: int) -> tuple[int, int]:  # what the engine uses at the start of a line
            request = protocol.Infill(id="", uri="", prefix="", canvas_length=canvas, max_steps=steps)
            return check_request(loaded, request)
    else:
        model, tokenizer = load_model(args.model, args.random_init, args.seed)
        canvases = args.canvas or [model.config.canvas_length]
        steps_list = args.steps or [model.generation_config.max_denoising_steps]
        known = tokenizer.get_vocab()
        special = special_ids_from(lambda tok: known.get(tok))
        if special is None:
            raise SystemExit("this checkpoint's tokenizer has no FIM tokens; --backend generate needs the fim layout")

        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False) if text else []

        def completer(canvas: int, steps: int) -> Complete:
            return generate_completer(model, tokenizer, encode, special, canvas, steps, args)

        def shown(canvas: int, steps: int) -> tuple[int, int]:
            return canvas, steps

    return model, canvases, steps_list, completer, shown


def run_grid(
    args: argparse.Namespace,
    splits: dict[str, list[dict]],
    runs: tuple[list[int], list[int]],
    completer: Callable[[int, int], Complete],
    shown: Shown,
) -> list[dict]:
    """Each (canvas, steps) pair's figures on every split (each split's do-nothing floor computed once)."""
    canvases, steps_list = runs
    out = []
    floors: dict[str, float | None] = {}
    for asked_canvas in canvases:
        for asked_steps in steps_list:
            complete = completer(asked_canvas, asked_steps)
            canvas, steps = shown(asked_canvas, asked_steps)
            run = {"canvas": canvas, "steps": steps, "splits": {}}
            for name, tasks in splits.items():
                with_floor = not args.no_floor and name not in floors
                result = evaluate(tasks, complete, args, with_floor)
                if with_floor:
                    floors[name] = result["floor_pass_at_1"]
                result["floor_pass_at_1"] = floors.get(name)
                run["splits"][name] = result
                summary = {k: v for k, v in result.items() if k not in ("samples", "passed_task_ids")}
                print(json.dumps({"split": name, "canvas": canvas, "steps": steps, **summary}), flush=True)
            out.append(run)
    return out


def main() -> None:
    """Command-line entry point."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    model, canvases, steps_list, completer, shown = backend_of(args)
    splits = {args.data.name: pick(load_tasks(args.data), args.n, args.limit)} if args.data else chosen_splits(args)
    report: dict = {
        "model": str(args.model),
        "backend": args.backend,
        "random_init": args.random_init,
        "raw": args.raw,
        "pin_suffix": args.pin_suffix,
        "max_prompt_tokens": args.max_prompt_tokens,
        "threads": args.threads,
        "params": sum(p.numel() for p in model.parameters()),
        "runs": [],
    }
    report["runs"] = run_grid(args, splits, (canvases, steps_list), completer, shown)
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
    pass_at_1_by_steps(args.plot, report)
    write_json(args.json, report)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
