"""DataLoader workers and torch threads on a machine that other work shares.

On an idle 2-core machine `num_workers: 0` is the pipeline's fastest CPU setting, yet users of a
shared machine measured `num_workers: 0` several times slower than `num_workers: 1`, while the
tutorial's own loop stayed faster with 0 workers. This script puts each setting beside a chosen
load and times it, side by side, so that the cause shows:

    python benchmarks/workers_under_load.py                  # every load, 10,000 images, 3 epochs
    python benchmarks/workers_under_load.py --load torch --rounds 2

Loads (each started before a setting runs, stopped after, in a process group of its own):
- idle: nothing else runs;
- busy: two pure-Python busy loops, one per core (a single-threaded neighbour);
- torch: two processes training the same network on random batches with torch's default threads
  (a test suite or another sweep on the same machine: multithreaded neighbours).

Settings, each in a fresh process: the pipeline's `fit` with 0 or 1 DataLoader workers at torch's
default thread count (the cores) or at one thread (grid key `threads: 1`), and the tutorial's loop
(benchmarks/tutorial_loop.py, per-image PIL conversion) with 0 or 1 workers. Each times `--epochs`
epochs over the first `--images` training images; the figure is the median of the epochs after
the first. The table gives seconds per epoch and, per load, the ratio to the pipeline's default
(0 workers, default threads): below 1 is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOADS = ("idle", "busy", "torch")
# (name, loop, workers, threads): threads 0 is torch's default (the cores, or OMP_NUM_THREADS).
SETTINGS = (
    ("pipeline w0", "pipeline", 0, 0),
    ("pipeline w1", "pipeline", 1, 0),
    ("pipeline w0 threads 1", "pipeline", 0, 1),
    ("pipeline w1 threads 1", "pipeline", 1, 1),
    ("tutorial w0", "tutorial", 0, 0),
    ("tutorial w1", "tutorial", 1, 0),
)

BUSY_LOOP = "while True: pass"
TORCH_LOAD = """
import torch
from pipeline.model import Network
net = Network(); opt = torch.optim.Adam(net.parameters())
x = torch.randn(256, 1, 28, 28); y = torch.randint(0, 10, (256,))
while True:
    opt.zero_grad(); torch.nn.functional.cross_entropy(net(x), y).backward(); opt.step()
"""


def child(loop: str, workers: int, threads: int, images: int, epochs: int) -> dict:
    """One setting, in this process: the steady epochs' seconds and the thread count it ran with."""
    import torch

    from pipeline.training.data import load

    dataset = load(train_size=images, test_size=100)
    if loop == "pipeline":
        from pipeline.settings.config import RunConfig
        from pipeline.training.train import fit

        result = fit(
            RunConfig(batch_size=100, num_workers=workers, threads=threads, epochs=epochs, device="cpu"),
            dataset,
            torch.device("cpu"),
        )
        seconds = [e.epoch_duration_s for e in result.epochs]
        used = result.threads
    else:
        import tempfile

        import tutorial_loop

        from pipeline.training import idx

        if threads:
            torch.set_num_threads(threads)
        _, files = idx.locate(dataset.folder)
        with tempfile.TemporaryDirectory(prefix="pipeline-tutorial-") as folder:
            root = tutorial_loop.torchvision_root(files, Path(folder))
            full = tutorial_loop.train_set(root)
            subset = torch.utils.data.Subset(full, range(images))
            seconds, network, optimizer = [], None, None
            for _ in range(epochs):
                took, network, optimizer = tutorial_loop.epoch(
                    subset, 100, workers, torch.device("cpu"), network=network, optimizer=optimizer
                )
                seconds.append(took)
        used = torch.get_num_threads()
    return {"epochs": seconds, "threads": used}


def start_load(kind: str) -> list[subprocess.Popen]:
    if kind == "idle":
        return []
    code = BUSY_LOOP if kind == "busy" else TORCH_LOAD
    cores = os.cpu_count() or 2
    return [
        subprocess.Popen(
            [sys.executable, "-c", code], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(min(cores, 2))
    ]


def stop_load(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait()


def time_setting(setting: tuple, args) -> dict:
    _, loop, workers, threads = setting
    command = [
        sys.executable,
        __file__,
        "--child",
        loop,
        str(workers),
        str(threads),
        "--images",
        str(args.images),
        "--epochs",
        str(args.epochs),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{setting[0]} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", action="append", choices=LOADS, help="repeat; default: every load")
    parser.add_argument("--images", type=int, default=10_000, help="training images per epoch (default 10000)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per setting; the first is left out (default 3)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds per load (default 1)")
    parser.add_argument("--child", nargs=3, metavar=("LOOP", "WORKERS", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        loop, workers, threads = args.child
        print(json.dumps(child(loop, int(workers), int(threads), args.images, args.epochs)))
        return

    import platform

    import torch

    from pipeline.training.device import cpu_name

    print(
        f"{cpu_name()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}; {args.images} images, batch size 100, "
        f"{args.epochs} epochs (median of epochs 2-{args.epochs}), {args.rounds} round(s)\n"
    )
    rows = []
    for kind in args.load or LOADS:
        timings: dict[str, list[float]] = {name: [] for name, *_ in SETTINGS}
        threads_used: dict[str, int] = {}
        for _ in range(args.rounds):
            for setting in SETTINGS:
                load = start_load(kind)
                try:
                    time.sleep(1 if load else 0)  # the neighbours running before the setting starts
                    measured = time_setting(setting, args)
                finally:
                    stop_load(load)
                timings[setting[0]].append(statistics.median(measured["epochs"][1:]))
                threads_used[setting[0]] = measured["threads"]
                print(f"  {kind:5} {setting[0]:24} {timings[setting[0]][-1]:7.3f} s/epoch", file=sys.stderr)
        reference = statistics.median(timings[SETTINGS[0][0]])
        for name, *_ in SETTINGS:
            seconds = statistics.median(timings[name])
            rows.append(f"| {kind} | {name} | {threads_used[name]} | {seconds:.3f} | {seconds / reference:.2f} |")
    print("| load | setting | torch threads | s/epoch | vs pipeline w0 |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
