"""PNG charts of a comparison (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pipeline.compare import Comparison

EPOCH_DURATION_PNG = "epoch_duration.png"
TEST_ACCURACY_PNG = "test_accuracy.png"
TIME_BREAKDOWN_PNG = "time_breakdown.png"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; works without a display
    import matplotlib.pyplot as plt

    return plt


def _finish(fig, ax, title: str) -> Figure:
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def _save(fig: Figure, path: Path) -> Path:
    # "tight" grows the image to take in legends placed outside the axes.
    fig.savefig(path, dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def _timed(comparison: "Comparison") -> str:
    """Which epochs the chart's times average, as the table's `timed` column says."""
    labels = comparison.table["timed"].unique()
    return labels[0] if len(labels) == 1 else "steady state where a run had 2+ epochs"


# Settings that change how a device runs the same training: each value gets its own bar.
_VARIANTS = ("precision", "compile", "cuda_graph", "prefetch", "data_on_device")


def variants(comparison: "Comparison") -> list[str]:
    """Each run's bar label: its device, and the variant settings that differ in the sweep
    ("cpu bf16 compiled"), so that twins on other axes are never averaged into one bar."""
    from pipeline.grid import short

    t = comparison.table
    keys = [k for k in _VARIANTS if k in comparison.varying]
    return [" ".join([str(row["device"])] + [short(k, str(row[k]).lower() == "true") if k != "precision" else str(row[k])
                                             for k in keys]) for _, row in t.iterrows()]


def epoch_duration(comparison: "Comparison", path: Path) -> Path:
    """Steady-state epoch duration (timing.steady) for each (batch size, workers), one bar per
    device (and variant: precision, compile, ...)."""
    plt = _pyplot()
    t = comparison.table.assign(device=variants(comparison))
    means = t.groupby(["batch_size", "num_workers", "device"], sort=False)["epoch_duration_s"].mean()
    categories = list(dict.fromkeys((b, w) for b, w, _ in means.index))
    devices = list(dict.fromkeys(d for _, _, d in means.index))
    width = 0.8 / len(devices)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(categories) * max(1, len(devices)) / 1.5), 4.5))
    for i, device in enumerate(devices):
        xs, ys = [], []
        for j, (batch, workers) in enumerate(categories):
            if (batch, workers, device) in means.index:
                xs.append(j + (i - (len(devices) - 1) / 2) * width)
                ys.append(means[(batch, workers, device)])
        bars = ax.bar(xs, ys, width, label=device)
        ax.bar_label(bars, fmt="%.2f", fontsize=8, padding=2)
    ax.set_xticks(range(len(categories)), [f"bs {b}\n{w} worker{'s' if w != 1 else ''}" for b, w in categories])
    ax.set_xlabel("batch size / DataLoader workers")
    ax.set_ylabel("epoch duration (s), " + _timed(comparison))
    ax.legend(title="device")
    ax.margins(y=0.15)
    return _save(_finish(fig, ax, f"Epoch duration by batch size and workers\n{comparison.sweep.name}"), path)


_DASHES = ("-", "--", "-.", ":")
_MARKERS = "osD^vP<>X"


def test_accuracy(comparison: "Comparison", path: Path) -> Path:
    """Test accuracy after each epoch, one line per run."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    longest, runs = 1, comparison.sweep.children
    for i, run in enumerate(runs):
        values = run.histories.get("test_accuracy") or []
        if values:
            # Runs that learn the same numbers (same seed, 0 or 1 workers) draw the same line: each
            # later line is thinner, with its own dashes and marker, so none hides under another.
            fade = i / max(len(runs) - 1, 1)
            ax.plot(range(1, len(values) + 1), values, label=run.name, linestyle=_DASHES[i % len(_DASHES)],
                    marker=_MARKERS[i % len(_MARKERS)], linewidth=3.5 - 2.5 * fade, markersize=9 - 5 * fade,
                    alpha=0.85)
            longest = max(longest, len(values))
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (fraction correct)")
    ax.set_xticks(range(1, longest + 1))
    ax.set_xlim(0.5, longest + 0.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="run")
    return _save(_finish(fig, ax, f"Test accuracy per epoch\n{comparison.sweep.name}"), path)


def time_breakdown(comparison: "Comparison", path: Path) -> Path:
    """Where each run's epoch went: data, transfer and compute seconds, stacked."""
    return _save(time_breakdown_figure(comparison), path)


def time_breakdown_figure(comparison: "Comparison") -> Figure:
    """The figure time_breakdown saves, open, for callers that look at its parts."""
    plt = _pyplot()
    t = comparison.table
    labels = [f"{n} [{d}]" if d not in n else n for n, d in zip(t["run_name"], t["device"])]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(t) + 1.8))
    left = [0.0] * len(t)
    for share, colour in (("data_share", "tab:orange"), ("transfer_share", "tab:purple"), ("compute_share", "tab:blue")):
        seconds = (t[share].fillna(0) * t["epoch_duration_s"]).tolist()
        ax.barh(labels, seconds, left=left, color=colour, label=share.replace("_share", ""))
        left = [a + b for a, b in zip(left, seconds)]
    ax.invert_yaxis()
    ax.set_xlabel("seconds per epoch, " + _timed(comparison))
    # Right of the axes: the bars span the plot's whole width, so any legend inside covers one.
    ax.legend(title="time spent on", fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _finish(fig, ax, f"Where each epoch's time goes\n{comparison.sweep.name}")


def write_all(comparison: "Comparison", folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [
        epoch_duration(comparison, folder / EPOCH_DURATION_PNG),
        test_accuracy(comparison, folder / TEST_ACCURACY_PNG),
        time_breakdown(comparison, folder / TIME_BREAKDOWN_PNG),
    ]
