"""Small PNG charts for the benchmark scripts (matplotlib, Agg backend); a missing matplotlib skips the plot."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def pyplot():  # noqa: ANN202
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


def save(figure, path: Path) -> None:  # noqa: ANN001
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")
