"""How the store reads grow with a sweep's size: the comparison and the resume lookup over synthetic
sweeps of 100, 1,000 and 10,000 FINISHED runs, built and timed side by side in one process.

Each size gets a fresh sqlite store in a temp dir holding one sweep: a parent run (tag
`pipeline.role=sweep`) and its children (`mlflow.parentRunId`), each holding what a real child
holds: the params of a grid point, its tags, per-epoch metrics for 3 epochs, its run-level metrics
and, as every child logs them at its end, its summary and end figures (timing.run_figures), its
two datasets and a logged model as its output (`search_runs` returns those with each run), written
through MlflowClient. Then, per size, the median of `--rounds` timings of:

- the comparison: `records.read_sweep(client, parent_run_id=..., histories=compare.HISTORIES)`
  followed by `compare.build`, what `pipeline compare` and the end of a sweep do, and the read
  alone (paged searches: no history is read for a run with end figures);
- the same comparison of runs made before children logged end figures (their figures come from
  per-epoch histories, one read per run and metric), in a store of their own, for the sizes up to
  `--old-runs-up-to` (default 1,000: at 10,000 runs it takes about ten minutes);
- `pipeline compare --format json` as a user runs it, in this process: the comparison, printed (it
  only reads; publishing the view is `--publish`, which `pipeline run` does at a sweep's end);
- the resume lookup: `records.finished_by_key`, what a rerun of a grid asks before it trains.

The table gives ms per run and its ratio to the smallest sweep's (1.0 everywhere = linear growth).

    python benchmarks/scale.py                                  # 100, 1,000 and 10,000 runs
    python benchmarks/scale.py --sizes 100 1000 --out scale.md  # also write the report
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlflow  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Dataset, DatasetInput, InputTag, LoggedModelOutput, Metric, Param  # noqa: E402
from mlflow.utils.mlflow_tags import (  # noqa: E402
    MLFLOW_DATASET_CONTEXT,
    MLFLOW_PARENT_RUN_ID,
    MLFLOW_SOURCE_NAME,
    MLFLOW_SOURCE_TYPE,
    MLFLOW_USER,
)

from pipeline.analysis import compare  # noqa: E402
from pipeline.base import names
from pipeline.base.names import EPOCH_METRICS, FINISHED, MODEL_NAME, RUN_DURATION  # noqa: E402
from pipeline.measures.timing import run_figures  # noqa: E402
from pipeline.settings.config import DEFAULTS  # noqa: E402
from pipeline.settings.grid import format_value  # noqa: E402
from pipeline.tracking import records
from pipeline.training.device import cpu_name  # noqa: E402

# The settings that vary, as a grid would: device twins give the comparison its speedups, and the
# seed, which grows with the sweep, its repeats.
VARYING = {
    "lr": [0.001, 0.003, 0.01, 0.03, 0.1],
    "batch_size": [100, 1000, 10000, 20000],
    "num_workers": [0, 1],
    "device": ["cpu", "cuda"],
}
# What a CPU run logs each epoch (energy_j only where a counter is readable, so not here).
LOGGED = tuple(name for name in EPOCH_METRICS if name != "energy_j")
EPOCHS = 3
TRAIN_SIZE, TEST_SIZE = 60000, 10000


@dataclass(frozen=True)
class Sweep:
    """A synthetic sweep in its store."""

    client: MlflowClient
    experiment_id: str
    parent_run_id: str
    runs: int


def grid_point(index: int) -> dict[str, str]:
    """The params of the sweep's `index`-th point: every grid key at its default, the VARYING ones
    taken in grid order, and the seed counting the passes over VARYING (so every point differs)."""
    combos = list(itertools.product(*VARYING.values()))
    values = dict(zip(VARYING, combos[index % len(combos)]))
    params = {**DEFAULTS, **values, "epochs": EPOCHS, "seed": index // len(combos)}
    return {key: format_value(value) for key, value in params.items()} | {
        "train_size": str(TRAIN_SIZE),
        "test_size": str(TEST_SIZE),
    }


def child_tags(parent_run_id: str, runs: int, index: int, device: str) -> dict[str, str]:
    """The tags a real child carries (point._open_run, tracking.source_tags, liveness.process_tags),
    with made-up values; `pipeline.run_key` tells the sweep's points apart."""
    return {
        MLFLOW_PARENT_RUN_ID: parent_run_id,
        MLFLOW_SOURCE_NAME: "pipeline run",
        MLFLOW_SOURCE_TYPE: "LOCAL",
        MLFLOW_USER: "bench",
        names.TAG_ROLE: "point",
        names.TAG_RUN_KEY: f"synthetic-{runs}-{index}",
        names.TAG_DEVICE: device,
        names.TAG_HARDWARE: "synthetic",
        names.TAG_HOST: "bench-host",
        names.TAG_TORCH: "2.14.1",
        names.TAG_CUDA: "none",
        names.TAG_CONFIG_HASH: f"{index:016x}",
        names.TAG_DATA: "IDX files of Fashion-MNIST from /data (checksums verified)",
        names.TAG_ENERGY: "not measured: no RAPL energy counters on this machine",
        names.TAG_PARAM_DEVICES: device,
        names.TAG_PID: str(10000 + index),
        names.TAG_PROCESS_START: "1796162713.92",
        names.TAG_COMPLETE: "true",
    }


# Each child's training and test data as a child records them (tracking.dataset_descriptions).
_TENSORS = {
    "features": [{"type": "tensor", "tensor-spec": {"dtype": "uint8", "shape": [-1, 1, 28, 28]}}],
    "targets": [{"type": "tensor", "tensor-spec": {"dtype": "int64", "shape": [-1]}}],
}
_SCHEMA = json.dumps({"mlflow_tensorspec": {name: json.dumps(spec) for name, spec in _TENSORS.items()}})
DATASETS = [
    DatasetInput(
        Dataset(
            f"fashion-mnist-{split}",
            f"{split}-digest",
            "local",
            '{"uri": "/data"}',
            _SCHEMA,
            f'{{"features_shape": [{size}, 1, 28, 28], "targets_shape": [{size}]}}',
        ),
        [InputTag(MLFLOW_DATASET_CONTEXT, context)],
    )
    for split, context, size in (("train", "training", TRAIN_SIZE), ("test", "testing", TEST_SIZE))
]


def epoch_values(index: int, epoch: int, device: str) -> dict[str, float]:
    """Plausible per-epoch figures of a point (cuda faster than cpu), deterministic in `index`."""
    speed = 5.0 if device == "cuda" else 1.0
    duration = (3.0 + (index % 7) * 0.1) / speed
    return {
        "train_loss": 1.0 / epoch,
        "train_accuracy": 0.7 + 0.05 * epoch,
        "test_loss": 1.1 / epoch,
        "test_accuracy": 0.68 + 0.05 * epoch + (index % 10) * 0.001,
        "epoch_duration_s": duration,
        "images_per_s": TRAIN_SIZE / duration,
        "data_time_s": 0.05 * duration,
        "transfer_time_s": 0.01 * duration,
        "compute_time_s": 0.94 * duration,
        "enqueue_time_s": 0.0,
        "peak_memory_mb": 900.0 + index % 50,
    }


def build_sweep(
    tracking_uri: str,
    runs: int,
    metrics: tuple[str, ...] = LOGGED,
    epochs: int = EPOCHS,
    point: Callable[[int], dict[str, str]] = grid_point,
    end_figures: bool = True,
    inputs_and_model: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Sweep:
    """A parent run and `runs` FINISHED children in the store at `tracking_uri`, written the cheapest
    way the public client allows: per child one create_run (with its tags), one log_batch (the params
    `point(index)` gives, every epoch's `metrics`, its run-level metrics and, with `end_figures`, the
    figures a child logs at its end, worked out from those epochs as a child does) and one
    set_terminated; with `inputs_and_model`, also its datasets (log_inputs) and a logged model, a
    record without files, as its output (create_logged_model, log_outputs). Without `end_figures` the
    children are runs made before children logged them. `progress(done)` is called every 5% of them."""
    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment(f"scale-{runs}")
    start = int(time.time() * 1000)
    parent = client.create_run(
        experiment_id, start_time=start, run_name=f"scale-{runs}", tags={names.TAG_ROLE: "sweep"}
    ).info.run_id
    report_every = max(1, runs // 20)
    for index in range(runs):
        params = point(index)
        device = params.get("device", "cpu")
        # Distinct start times keep the children in creation order, as a sweep's are.
        child = client.create_run(
            experiment_id,
            start_time=start + 1 + index,
            run_name=f"point-{index}",
            tags=child_tags(parent, runs, index, device),
        ).info.run_id
        history = {
            name: [epoch_values(index, epoch, device)[name] for epoch in range(1, epochs + 1)] for name in metrics
        }
        logged = [
            Metric(name, value, start + index, epoch)
            for name, values in history.items()
            for epoch, value in enumerate(values, start=1)
        ]
        once = {RUN_DURATION: 10.0, names.WARMUP: 0.2, names.LOAD_AVERAGE: 0.5, names.OTHERS_CPU_SHARE: 0.01}
        if end_figures:
            once.update(run_figures(history, history["test_accuracy"][-1] if "test_accuracy" in history else None))
        logged += [Metric(name, value, start + index, 0) for name, value in once.items()]
        client.log_batch(child, metrics=logged, params=[Param(k, v) for k, v in params.items()])
        if inputs_and_model:
            client.log_inputs(child, datasets=DATASETS)
            model = client.create_logged_model(experiment_id, name=MODEL_NAME, source_run_id=child)
            client.log_outputs(child, [LoggedModelOutput(model.model_id, epochs)])
        client.set_terminated(child, FINISHED)
        if progress is not None and ((index + 1) % report_every == 0 or index + 1 == runs):
            progress(index + 1)
    client.set_terminated(parent, FINISHED)
    return Sweep(client, experiment_id, parent, runs)


def compare_sweep(sweep: Sweep) -> tuple[float, float, compare.Comparison]:
    """What `pipeline compare` computes for the sweep, timed: the seconds its children took to read back
    and the table to build, and the comparison."""
    began = time.perf_counter()
    record = records.read_sweep(sweep.client, parent_run_id=sweep.parent_run_id, histories=compare.HISTORIES)
    read = time.perf_counter()
    comparison = compare.build(record)
    return read - began, time.perf_counter() - read, comparison


def cli_compare(sweep: Sweep) -> int:
    """`pipeline compare --format json` of the sweep, in this process; the rows it printed."""
    from click.testing import CliRunner

    from pipeline.cli import main

    result = CliRunner().invoke(
        main,
        [
            "compare",
            "--parent-run",
            sweep.parent_run_id,
            "--format",
            "json",
            "--tracking-uri",
            sweep.client.tracking_uri,
        ],
    )
    if result.exit_code != 0:
        raise SystemExit(f"pipeline compare of {sweep.runs} runs: exit {result.exit_code}: {result.output[-500:]}")
    return len(json.loads(result.stdout))


def median_seconds(action: Callable[[], object], rounds: int) -> tuple[float, object]:
    """The median wall time of `rounds` calls of `action`, and what the last call returned."""
    times, result = [], None
    for _ in range(rounds):
        began = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - began)
    return statistics.median(times), result


def time_comparison(sweep: Sweep, rounds: int) -> tuple[float, float, float]:
    """The median seconds of `rounds` comparisons of `sweep`, of their reads and of their builds."""
    timed = [compare_sweep(sweep) for _ in range(rounds)]
    for _, _, comparison in timed:
        if len(comparison.table) != sweep.runs:
            raise SystemExit(f"the comparison of {sweep.runs} runs has {len(comparison.table)} rows")
    return (
        statistics.median(r + b for r, b, _ in timed),
        statistics.median(r for r, _, _ in timed),
        statistics.median(b for _, b, _ in timed),
    )


def measure(
    sizes: list[int], rounds: int, folder: Path, log: Callable[[str], None], old_runs_up_to: int = 1000
) -> list[dict]:
    """Build each size's sweep in its own store under `folder`, then time its reads; for sizes up to
    `old_runs_up_to`, also a sweep of runs without end figures in a store of its own. The first size's
    reads run once untimed before: the process's first reads pay one-off costs (imports, SQL
    compilation) that would inflate the reference the ratios divide by."""
    rows = []
    for position, runs in enumerate(sizes):
        began = time.perf_counter()
        uri = f"sqlite:///{folder / f'scale-{runs}.db'}"
        log(f"building a sweep of {runs} runs in {uri}")
        sweep = build_sweep(uri, runs, progress=_progress(log, runs))
        built = time.perf_counter() - began
        if position == 0:
            compare_sweep(sweep)
            records.finished_by_key(sweep.client, sweep.experiment_id)
        log(f"  timing the comparison of {runs} runs ({rounds} rounds)")
        seconds, read, table_built = time_comparison(sweep, rounds)
        rows.append({"runs": runs, "what": COMPARISON, "seconds": seconds})
        rows.append({"runs": runs, "what": READ, "seconds": read})
        rows.append({"runs": runs, "what": BUILD, "seconds": table_built})
        log(f"  timing pipeline compare of {runs} runs ({rounds} rounds)")
        seconds, printed = median_seconds(functools.partial(cli_compare, sweep), rounds)
        if printed != runs:
            raise SystemExit(f"pipeline compare of {runs} runs printed {printed} rows")
        rows.append({"runs": runs, "what": CLI, "seconds": seconds})
        if runs <= old_runs_up_to:
            old_uri = f"sqlite:///{folder / f'scale-{runs}-old.db'}"
            log(f"building a sweep of {runs} runs without end figures in {old_uri}")
            old = build_sweep(old_uri, runs, end_figures=False, progress=_progress(log, runs))
            log(f"  timing its comparison ({rounds} rounds)")
            rows.append({"runs": runs, "what": OLD_COMPARISON, "seconds": time_comparison(old, rounds)[0]})
        log(f"  timing the resume lookup of {runs} runs ({rounds} rounds)")
        seconds, finished = median_seconds(
            functools.partial(records.finished_by_key, sweep.client, sweep.experiment_id), rounds
        )
        if len(finished) != runs:
            raise SystemExit(f"the resume lookup of {runs} runs found {len(finished)}")
        rows.append({"runs": runs, "what": RESUME, "seconds": seconds})
        rows.append({"runs": runs, "what": BUILDING, "seconds": built})
    return rows


def _progress(log: Callable[[str], None], runs: int) -> Callable[[int], None]:
    """build_sweep's progress: how many of `runs` are built, and the seconds since this call."""
    began = time.perf_counter()
    return lambda done: log(f"  {runs} runs: built {done} ({time.perf_counter() - began:.0f} s)")


COMPARISON = "comparison: read_sweep + compare.build"
READ = "of which read_sweep"
BUILD = "of which compare.build"
CLI = "pipeline compare --format json (in process)"
OLD_COMPARISON = "comparison of runs without end figures"
RESUME = "resume lookup: finished_by_key"
BUILDING = "building the sweep (one time, not a read)"


def table(rows: list[dict]) -> str:
    """The rows as markdown, each with ms per run and its ratio to the smallest sweep's same row
    ("-" where that size did not measure it)."""
    smallest = min(row["runs"] for row in rows)
    reference = {row["what"]: row["seconds"] / row["runs"] for row in rows if row["runs"] == smallest}
    order = list(dict.fromkeys(row["what"] for row in rows))
    lines = [f"| runs | measurement | seconds | ms per run | ms/run vs {smallest:,} runs |", "|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: (order.index(r["what"]), r["runs"])):
        per_run = row["seconds"] / row["runs"]
        ratio = f"{per_run / reference[row['what']]:.2f}" if row["what"] in reference else "-"
        lines.append(f"| {row['runs']:,} | {row['what']} | {row['seconds']:.2f} | {1000 * per_run:.2f} | {ratio} |")
    return "\n".join(lines)


def store_folder() -> Path:
    """Where the stores go: a RAM-backed folder (/dev/shm) where there is one, else the temp dir.
    sqlite syncs each commit to disk, about seven commits per run written; on a slow disk that makes
    building 10,000 runs take many minutes, while the reads, which never sync, hardly change."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def report(
    sizes: list[int],
    rounds: int,
    command: str,
    folder: Path | None = None,
    log: Callable[[str], None] = print,
    old_runs_up_to: int = 1000,
) -> str:
    """The whole measurement as markdown: machine, date, versions and command, then the table."""
    folder = folder or store_folder()
    with tempfile.TemporaryDirectory(prefix="pipeline-scale-", dir=folder) as tmp:
        rows = measure(sorted(sizes), rounds, Path(tmp), log, old_runs_up_to)
    return "\n".join(
        [
            f"# Store reads at scale ({time.strftime('%Y-%m-%d')})",
            "",
            f"CPU: {cpu_name()}, {os.cpu_count()} cores; MLflow {mlflow.__version__}, Python {sys.version.split()[0]}; "
            f"a fresh sqlite store per size in a temp dir under {folder}; median of {rounds} rounds per read, "
            "after one untimed warm-up read of the smallest sweep.",
            "",
            f"Command: `{command}`",
            "",
            table(rows),
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[100, 1000, 10000],
        help="children per synthetic sweep (default 100 1000 10000); the smallest is the reference",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="timings per read and size; the median is shown (default 3)"
    )
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    parser.add_argument(
        "--store-dir",
        type=Path,
        help="where the temp stores go (default: /dev/shm where there is one, else the temp dir)",
    )
    parser.add_argument(
        "--old-runs-up-to",
        type=int,
        default=1000,
        metavar="N",
        help="also time runs without end figures (history reads) for sizes up to N (default 1000; 0: never)",
    )
    args = parser.parse_args()
    if min(args.sizes) < 1 or args.rounds < 1 or args.old_runs_up_to < 0:
        parser.error("--sizes and --rounds take positive numbers, --old-runs-up-to one >= 0")
    command = " ".join(["python", *sys.argv])
    text = report(
        args.sizes,
        args.rounds,
        command,
        args.store_dir,
        log=lambda line: print(line, file=sys.stderr, flush=True),
        old_runs_up_to=args.old_runs_up_to,
    )
    print("\n" + text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
