"""Side-by-side speed: the pipeline's training loop against the tutorial's, and MLflow's overhead.

Runs the reference (benchmarks/tutorial_loop.py) and the pipeline's `fit` on the same settings,
alternating, for several rounds in one process, and reports medians and spreads as ratios: absolute
times on shared machines are noise, ratios measured side by side are not. Needs no MLflow for the
loop comparison (the GPU machine has none); `--overhead` adds the tracking measurements.

    python benchmarks/harness.py                                    # CPU, bs 1000, 0 workers
    python benchmarks/harness.py --device cuda --device cpu --batch-size 1000 --batch-size 10000 \\
        --workers 0 --workers 1 --synthetic                         # what gpu_check.sh runs
    python benchmarks/harness.py --overhead --accuracy-epochs 3     # the README's figures
    python benchmarks/harness.py --device cuda --device cpu --epochs 3 --no-loops
                                    # per-epoch times: warm-up, epoch 1, steady state, speedups
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tutorial_loop  # noqa: E402

from pipeline.measures.timing import steady_mean, timed_label  # noqa: E402
from pipeline.settings.config import RunConfig  # noqa: E402
from pipeline.training import data as data_mod  # noqa: E402
from pipeline.training import idx  # noqa: E402
from pipeline.training.device import DeviceUnavailable, hardware_name, resolve  # noqa: E402
from pipeline.training.train import fit  # noqa: E402


def synthetic_idx(folder: Path) -> Path:
    """Fashion-MNIST-shaped random IDX files (60000/10000), for machines without the data set."""
    rng = np.random.default_rng(0)
    for stem, n, magic, shape in (
        ("train-images-idx3-ubyte", 60000, 2051, (28, 28)),
        ("train-labels-idx1-ubyte", 60000, 2049, ()),
        ("t10k-images-idx3-ubyte", 10000, 2051, (28, 28)),
        ("t10k-labels-idx1-ubyte", 10000, 2049, ()),
    ):
        dims = (n, *shape)
        values = rng.integers(0, 10 if not shape else 256, dims, dtype=np.uint8)
        header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
        (folder / stem).write_bytes(header + values.tobytes())
    return folder


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def settings(args):
    """(device, batch size, workers) for every setting asked for, on the devices this machine has."""
    for name in args.device:
        try:
            device = resolve(name)
        except DeviceUnavailable as exc:
            print(f"skipping {name}: {exc}", flush=True)
            continue
        for batch_size in args.batch_size:
            for workers in args.workers:
                yield device, batch_size, workers


def compare_loops(args, dataset, reference_root: Path) -> list[dict]:
    reference = tutorial_loop.train_set(reference_root)
    rows = []
    for (device, batch_size, workers), precision in itertools.product(settings(args), args.precision):
        config = RunConfig(
            lr=0.01, batch_size=batch_size, num_workers=workers, device=str(device), epochs=1, precision=precision
        )
        # Warm-up, untimed: first optimizer (torch imports its compiler), worker start, caches.
        warm = data_mod.Dataset(
            dataset.train.head(2 * batch_size), dataset.test.head(1000), dataset.folder, dataset.verified
        )
        fit(config, warm, device)
        tutorial_loop.epoch(torch.utils.data.Subset(reference, range(2 * batch_size)), batch_size, workers, device)
        ref_s, ours_s, stats = [], [], []
        for _ in range(args.rounds):
            ref_s.append(tutorial_loop.epoch(reference, batch_size, workers, device)[0])
            result = fit(config, dataset, device).final
            ours_s.append(result.epoch_duration_s)
            stats.append(result)
        ratios = [o / r for o, r in zip(ours_s, ref_s)]
        last = stats[-1]
        row = {  # the tutorial's loop is fp32; a lower precision is the pipeline's alone
            "device": str(device) + ("" if precision == "fp32" else f" {precision}"),
            "hardware": hardware_name(device),
            "batch_size": batch_size,
            "workers": workers,
            "tutorial_s": ref_s,
            "pipeline_s": ours_s,
            "ratio": ratios,
            "images_per_s": statistics.median(s.images_per_s for s in stats),
            "shares": [
                round(100 * getattr(last, k) / last.epoch_duration_s, 1)
                for k in ("data_time_s", "transfer_time_s", "compute_time_s")
            ],
        }
        rows.append(row)
        print(
            f"{row['device']:7} bs {batch_size:>5} w {workers}: tutorial {spread(ref_s)} s, "
            f"pipeline {spread(ours_s)} s, ratio {spread(ratios)}",
            flush=True,
        )
    return rows


def loops_table(rows: list[dict]) -> str:
    lines = [
        "| device | batch | workers | tutorial epoch s | pipeline epoch s | pipeline/tutorial | pipeline img/s "
        "| data/transfer/compute % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['device']} | {r['batch_size']} | {r['workers']} | {spread(r['tutorial_s'])} | "
            f"{spread(r['pipeline_s'])} | {spread(r['ratio'])} | {r['images_per_s']:,.0f} | "
            f"{'/'.join(str(s) for s in r['shares'])} |"
        )
    speedups = _speedups(rows)
    if speedups:
        lines.append("")
        lines += [f"- {line}" for line in speedups]
    return "\n".join(lines)


def _speedups(rows: list[dict]) -> list[str]:
    """cuda vs cpu for the same batch size and workers, for both loops."""
    out = []
    cpu = {(r["batch_size"], r["workers"]): r for r in rows if r["device"] == "cpu"}
    for r in rows:
        twin = cpu.get((r["batch_size"], r["workers"]))
        if r["device"] != "cpu" and twin:
            ours = statistics.median(twin["pipeline_s"]) / statistics.median(r["pipeline_s"])
            theirs = statistics.median(twin["tutorial_s"]) / statistics.median(r["tutorial_s"])
            out.append(
                f"bs {r['batch_size']}, {r['workers']} workers: {r['device']}/cpu speedup x{ours:.1f} "
                f"with the pipeline's loop, x{theirs:.1f} with the tutorial's"
            )
    return out


def accuracy(args, dataset, reference_root: Path) -> str:
    """Same settings, N epochs each: speed must not change what is learned."""
    device = resolve(args.device[0]) if args.device else torch.device("cpu")
    bs = args.batch_size[0]
    reference, test = tutorial_loop.train_set(reference_root), tutorial_loop.train_set(reference_root, train=False)
    network = optimizer = None
    for _ in range(args.accuracy_epochs):
        _, network, optimizer = tutorial_loop.epoch(reference, bs, 0, device, network=network, optimizer=optimizer)
    theirs = tutorial_loop.test_accuracy(network, test, device)
    ours = fit(RunConfig(batch_size=bs, epochs=args.accuracy_epochs), dataset, device).final.test_accuracy
    return (
        f"test accuracy after {args.accuracy_epochs} epochs at bs {bs}, lr 0.01 on {device}: "
        f"tutorial {theirs:.4f}, pipeline {ours:.4f}"
    )


def epochs_table(args, dataset) -> tuple[str, list[str]]:
    """One fit of `--epochs` epochs per device and setting: the untimed warm-up, each epoch's time,
    and cuda/cpu speedups on the mean of the steady-state epochs (`pipeline compare` takes their
    median; with the one or two steady epochs these tables time, the two are equal). Each row is
    printed whole as it is measured, so a run cut short by a time limit still leaves its rows; a
    variant that fails is listed under the table, and returned, while the others go on."""
    rows, failures = [], []
    for device, batch_size, workers, extra in _epoch_jobs(args):
        config = RunConfig(lr=0.01, batch_size=batch_size, num_workers=workers, epochs=args.epochs, **extra)
        label = str(device) + "".join(f" +{k}" if v is True else f" {v}" for k, v in extra.items())
        try:
            result = fit(config, dataset, device)
        except Exception as exc:  # one broken variant must not cost the rest of a one-shot GPU lease
            traceback.print_exc()
            failures.append(f"{label} bs {batch_size} w {workers}: {exc.__class__.__name__}: {exc}".splitlines()[0])
            print(f"FAILED {failures[-1]}", flush=True)
            continue
        times = [e.epoch_duration_s for e in result.epochs]
        peak = max((e.peak_memory_mb or 0.0) for e in result.epochs)
        joules = steady_mean([e.energy_j for e in result.epochs]) if result.final.energy_j is not None else None
        rows.append(
            {
                "device": label,
                "batch_size": batch_size,
                "workers": workers,
                # with compile, compiling is the warm-up
                "warmup_s": result.one_off.get("compile_s", result.warmup_s),
                "epochs_s": times,
                "steady_s": steady_mean(times),
                "peak_mb": peak,
                "joules": joules,
                "test_accuracy": result.final.test_accuracy,
            }
        )
        print(
            f"{label} bs {batch_size} w {workers}: warm-up {result.warmup_s:.3f} s, one-off {result.one_off}, "
            f"epochs {', '.join(f'{t:.3f}' for t in times)} s, peak {peak:,.0f} MiB, "
            f"J/epoch {'-' if joules is None else f'{joules:.1f}'}, test acc {result.final.test_accuracy:.4f}",
            flush=True,
        )
    cpu = {(r["batch_size"], r["workers"]): r["steady_s"] for r in rows if r["device"] == "cpu"}
    lines = [
        f"per-epoch seconds, {args.epochs} epochs; steady state = {timed_label(args.epochs)}",
        "",
        "| device | batch | workers | warm-up (or compile) s | epoch s (1, 2, ...) | steady s | speedup vs cpu "
        "| peak MiB | J/epoch | test acc |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reference = cpu.get((r["batch_size"], r["workers"]))
        speedup = f"x{reference / r['steady_s']:.2f}" if reference and r["device"] != "cpu" else ""
        energy = "-" if r["joules"] is None else f"{r['joules']:.1f}" if r["joules"] else "0 (< 1 counter step)"
        lines.append(
            f"| {r['device']} | {r['batch_size']} | {r['workers']} | {r['warmup_s']:.3f} | "
            f"{', '.join(f'{t:.3f}' for t in r['epochs_s'])} | {r['steady_s']:.3f} | {speedup} | "
            f"{r['peak_mb']:,.0f} | {energy} | {r['test_accuracy']:.4f} |"
        )
    lines += [f"- FAILED {failure}" for failure in failures]
    return "\n".join(lines), failures


def _epoch_jobs(args):
    """(device, batch size, workers, variant) in the order they are timed: the compiled variants
    (a minute or so of compiling each, at the smallest batch size only) after everything else."""
    later, lower = [], [{"precision": p} for p in args.precision if p != "fp32"]
    for device, batch_size, workers in settings(args):
        yield device, batch_size, workers, {}
        if not (args.cuda_variants and device.type == "cuda" and workers == 0):
            for extra in lower:
                yield device, batch_size, workers, extra
            continue
        for extra in (
            {"cuda_graph": True},
            {"prefetch": True},
            {"cuda_graph": True, "prefetch": True},
            {"data_on_device": True},
            {"cuda_graph": True, "data_on_device": True},
            {"precision": "bf16"},
            {"precision": "fp16"},
        ):
            yield device, batch_size, workers, extra
        if batch_size == min(args.batch_size):
            later += [
                (device, batch_size, workers, {"compile": True, **precision})
                for precision in ({}, {"precision": "bf16"}, {"precision": "fp16"})
            ]
    yield from later


# --- tracking overhead (needs mlflow) ------------------------------------------------------------------


def _timed(command: list[str], cwd: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS (MiB) of a command."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(command)}")
    return elapsed, usage.ru_maxrss // 1024


def _new_run_seconds(results: Path, seen: int) -> tuple[float, int]:
    lines = results.read_text().splitlines() if results.exists() else []
    return sum(json.loads(line)["run_duration_s"] for line in lines[seen:]), len(lines)


def _run_overheads(results: Path, start: int, end: int) -> list[float]:
    """For each run of lines [start, end) of the results file: its wall time in the store (created to
    ended) less its training and evaluation (run_duration_s). One clock, no process start-up or
    exit in it: what the run costs beyond its training, told apart from the machine's noise."""
    import mlflow

    lines = [json.loads(line) for line in results.read_text().splitlines()[start:end]]
    clients = {uri: mlflow.MlflowClient(uri) for uri in {line["tracking_uri"] for line in lines}}
    overheads = []
    for line in lines:
        info = clients[line["tracking_uri"]].get_run(line["run_id"]).info
        overheads.append((info.end_time - info.start_time) / 1000 - line["run_duration_s"])
    return overheads


def overhead(args, data_dir: Path) -> str:
    # The runs' store and logged models: tens of MB, removed when the measurements end.
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as work:
        return _overhead(args, data_dir, Path(work))


def _overhead(args, data_dir: Path, work: Path) -> str:
    python, pipeline = sys.executable, [sys.executable, "-m", "pipeline"]
    tiny = "data: {train_size: 1000, test_size: 1000}\ngrid:\n  device: [cpu]\n"
    (work / "one.yaml").write_text("experiment: one\n" + tiny)
    (work / "two.yaml").write_text("experiment: two\n" + tiny + "  seed: [0, 1]\n")
    # Twelve runs, not six: a whole process here varies by tenths of a second between identical
    # runs, and ten runs between the two grids divide that by ten, where four divided it by four.
    (work / "twelve.yaml").write_text("experiment: twelve\n" + tiny + f"  seed: {list(range(12))}\n")
    (work / "full6.yaml").write_text(
        "experiment: full6\ngrid:\n  batch_size: [1000]\n  device: [cpu]\n  seed: [0, 1, 2, 3, 4, 5]\n"
    )
    common = ["--data-dir", str(data_dir), "--rerun"]
    _timed([*pipeline, "run", "one.yaml", *common], work)  # creates the store; warms the page cache
    results, seen = work / "pipeline-results.jsonl", 0
    _, seen = _new_run_seconds(results, 0)
    help_ratio, start_ratio, extra, marginal, in_run = [], [], [], [], []
    for _ in range(args.rounds):
        torch_s, _ = _timed([python, "-c", "import torch"], work)
        help_s, _ = _timed([*pipeline, "--help"], work)
        both_s, _ = _timed([python, "-c", "import torch, mlflow"], work)
        one_s, _ = _timed([*pipeline, "run", "one.yaml", *common], work)
        one_train, seen = _new_run_seconds(results, seen)
        two_s, _ = _timed([*pipeline, "run", "two.yaml", *common], work)
        two_train, seen = _new_run_seconds(results, seen)
        twelve_s, _ = _timed([*pipeline, "run", "twelve.yaml", *common], work)
        twelve_start = seen
        twelve_train, seen = _new_run_seconds(results, seen)
        in_run += _run_overheads(results, twelve_start, seen)
        help_ratio.append(help_s / torch_s)
        start_ratio.append(one_s / both_s)
        # From two runs to twelve, both sweeps build the comparison and draw its charts: what each
        # run adds alone. From one to twelve, the comparison's one-time cost is spread over eleven.
        marginal.append(((twelve_s - two_s) - (twelve_train - two_train)) / 10)
        extra.append(((twelve_s - one_s) - (twelve_train - one_train)) / 11)
    full_s, peak_mib = _timed([*pipeline, "run", "full6.yaml", *common], work)
    return "\n".join(
        [
            "| measurement | median [min-max] | target |",
            "|---|---|---|",
            f"| `pipeline --help` / `python -c 'import torch'` | {spread(help_ratio)} | <= 0.3 |",
            f"| grid of one tiny run / `python -c 'import torch, mlflow'` | {spread(start_ratio)} | <= 3.0 |",
            f"| cost of each extra run in a grid, beyond its training and evaluation: two runs to twelve (s) "
            f"| {spread(marginal)} | <= 0.60 |",
            f"| the same from one run to twelve, with the comparison a grid of two or more pays once (s) "
            f"| {spread(extra)} | |",
            f"| inside each run of the twelve: created to ended in the store, less its training and evaluation (s) "
            f"| {spread(in_run)} | |",
            f"| peak memory of a 6-run grid on the full data (MiB) | {peak_mib} ({full_s:.0f} s) | <= 1536 |",
        ]
    )


def report(args, tmp: Path) -> tuple[str, list[str]]:
    """Every measurement `args` asks for, as markdown, and the settings that failed; `tmp` holds
    the data copies meanwhile."""
    if args.synthetic:
        folder = synthetic_idx(tmp)
    else:
        folder, _ = idx.locate(args.data_dir)
    _, files = idx.locate(folder)
    dataset = data_mod.load(folder, verify=not args.synthetic)
    reference_root = tutorial_loop.torchvision_root(files, tmp / "torchvision")
    cpu = hardware_name(torch.device("cpu"))
    lines = [
        f"# pipeline vs tutorial loop ({time.strftime('%Y-%m-%d')})",
        "",
        f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}"
        f"{', ' + torch.cuda.get_device_name() if torch.cuda.is_available() else ''}; "
        f"data: {dataset.description}"
        + ("" if args.no_loops else f"; {args.rounds} alternating rounds per setting in the loop table"),
        "",
    ]
    failures: list[str] = []
    if not args.no_loops:
        lines += [loops_table(compare_loops(args, dataset, reference_root)), ""]
    if args.epochs:
        table, failures = epochs_table(args, dataset)
        lines += [table, ""]
    if args.accuracy_epochs:
        lines += [accuracy(args, dataset, reference_root), ""]
    lines.append(f"peak memory of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB")
    if args.overhead:
        lines += ["", overhead(args, folder)]
    return "\n".join(lines) + "\n", failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", action="append", help="cpu, cuda, ... (repeat; default cpu)")
    parser.add_argument("--batch-size", action="append", type=int, help="repeat; default 1000")
    parser.add_argument("--workers", action="append", type=int, help="repeat; default 0")
    parser.add_argument(
        "--precision",
        action="append",
        choices=("fp32", "bf16", "fp16"),
        help="the pipeline's precision (repeat; default fp32): the loop table times exactly these, the "
        "per-epoch table these beside its fp32 reference; the tutorial's loop stays fp32",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per setting (default 3)")
    parser.add_argument("--data-dir", help="Fashion-MNIST folder (default: the pipeline's search)")
    parser.add_argument("--synthetic", action="store_true", help="random data of Fashion-MNIST's shape")
    parser.add_argument("--accuracy-epochs", type=int, default=0, help="also compare accuracy after N epochs")
    parser.add_argument("--epochs", type=int, default=0, help="also time N epochs per setting, warm-up shown")
    parser.add_argument(
        "--cuda-variants",
        action="store_true",
        help="with --epochs, also time cuda_graph, prefetch, data_on_device, bf16, fp16 and compile "
        "(fp32/bf16/fp16, smallest batch size) on cuda (0 workers)",
    )
    parser.add_argument("--overhead", action="store_true", help="also measure start-up and tracking overhead")
    parser.add_argument("--no-loops", action="store_true", help="skip the loop comparison")
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    args = parser.parse_args()
    args.device = args.device or ["cpu"]
    args.batch_size = args.batch_size or [1000]
    args.workers = args.workers or [0]
    args.precision = args.precision or ["fp32"]
    # Synthetic data and the tutorial's uncompressed copy: 50-100 MB, removed even when a run fails.
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-data-") as tmp:
        text, failures = report(args, Path(tmp))
    print("\n" + text)
    if args.out:
        args.out.write_text(text)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
