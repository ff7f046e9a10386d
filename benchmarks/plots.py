"""Small PNG charts for the benchmark scripts (matplotlib, Agg backend); a missing matplotlib skips the plot."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return None
    return plt


def bars(path: Path, title: str, labels: Sequence[str], values: Sequence[float], unit: str) -> None:
    """One bar per label, its value written on it."""
    plt = pyplot()
    if plt is None:
        return
    figure, axes = plt.subplots(figsize=(6, 3.6))
    drawn = axes.bar(list(labels), list(values), color="#4c72b0")
    axes.bar_label(drawn, labels=[f"{value:.3g} {unit}" for value in values], fontsize=8)
    axes.set_ylabel(unit)
    axes.set_title(title, fontsize=10)
    axes.set_ylim(0, 1.2 * max(values))
    save(figure, path)


def grouped_bars(
    path: Path, title: str, groups: Sequence[str], series: dict[str, Sequence[float]], unit: str, log: bool = False
) -> None:
    """One group of bars per entry of ``groups``, one bar in each per series (``log``: a logarithmic axis, for
    values that span decades), its value written on it."""
    plt = pyplot()
    if plt is None:
        return
    figure, axes = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / len(series)
    for index, (label, values) in enumerate(series.items()):
        places = [group + (index - (len(series) - 1) / 2) * width for group in range(len(groups))]
        drawn = axes.bar(places, list(values), width, label=label)
        axes.bar_label(drawn, labels=[f"{value:.3g}" for value in values], fontsize=7)
    axes.set_xticks(range(len(groups)), list(groups))
    axes.set_ylabel(unit)
    if log:
        axes.set_yscale("log")
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=7)
    save(figure, path)


def cdf(path: Path, title: str, series: dict[str, Sequence[float]], unit: str = "ms") -> None:
    """The cumulative share of samples under each value, one line per series."""
    plt = pyplot()
    if plt is None:
        return
    figure, axes = plt.subplots(figsize=(6, 3.6))
    for label, samples in series.items():
        ordered = sorted(samples)
        axes.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)
    axes.set_xlabel(unit)
    axes.set_ylabel("share of requests")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    save(figure, path)


def pass_at_1_by_steps(path: Path, report: dict) -> None:
    """``benchmarks.infill_eval``'s sweep: pass@1 against denoising steps, one line per split and canvas, the
    do-nothing floor dashed."""
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


def repair_by_strength(path: Path, report: dict) -> None:
    """``benchmarks.edit_eval``: repair pass@1 (left axis) and denoising steps per edit (right axis) against the
    rewrite's strength; strength 1 is the from-noise infill of the same span, the do-nothing floor dashed."""
    plt = pyplot()
    if plt is None:
        return
    runs = sorted(report["runs"], key=lambda run: run["strength"])
    strengths = [run["strength"] for run in runs]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(strengths, [100 * run["pass_at_1"] for run in runs], marker="o", color="#4c72b0", label="pass@1")
    axes.axhline(100 * report["floor_pass_at_1"], linestyle="--", linewidth=1, color="grey")
    axes.annotate(
        "do-nothing floor (the corrupted program)",
        (0.01, 100 * report["floor_pass_at_1"]),
        xycoords=("axes fraction", "data"),
        xytext=(0, 3),
        textcoords="offset points",
        fontsize=7,
    )
    axes.set_ylim(0, max(10.0, 1.2 * max(100 * run["pass_at_1"] for run in runs)))
    axes.set_xlabel("strength (share of the canvas renoised at the start; 1 = from noise)")
    axes.set_ylabel("repair pass@1 (%)", color="#4c72b0")
    axes.set_xticks(strengths)
    steps = axes.twinx()
    steps.plot(strengths, [run["steps_per_edit"] for run in runs], marker="s", color="#dd8452", label="steps")
    steps.set_ylim(0, 1.2 * max(max(run["steps_per_edit"] for run in runs), 1))
    steps.set_ylabel("denoising steps per edit", color="#dd8452")
    lines = axes.get_legend_handles_labels()
    more = steps.get_legend_handles_labels()
    axes.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
    axes.set_title(f"HumanEval one-line repairs ({report['n_edits']}), {Path(report['model']).name}", fontsize=10)
    save(figure, path)


def save(figure, path: Path) -> None:
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")
