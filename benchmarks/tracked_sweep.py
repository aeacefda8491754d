"""The device comparison as a user runs it: `pipeline run` on a grid with repeats, tracked in a fresh
sqlite store, then `pipeline compare` with its intervals and charts.

`benchmarks/gpu_check.sh` runs it on a lent GPU machine for the README's device chart (cuda against
cpu, measured on a real card); on a machine without CUDA the grid's cuda points are skipped with the
reason and the cpu half is still tracked and compared, which is how the test suite checks it.

    python benchmarks/tracked_sweep.py OUT_DIR                         # experiments/devices.yaml, repeats 3
    python benchmarks/tracked_sweep.py OUT_DIR --synthetic             # generated data of Fashion-MNIST's shape
    python benchmarks/tracked_sweep.py OUT_DIR --grid G.yaml --repeats 2 --data-dir DIR

It prints the comparison as markdown (so a log of it is the result) and writes the device chart
`devices-epoch-duration.png` into OUT_DIR. The store lives in a temporary folder unless --store is
given: a GPU machine sends back files, not a store. With --budget-s the sweep is interrupted (Ctrl-C,
so its runs end KILLED, honestly) 30 s before the budget, and what FINISHED is still compared.
Exit status: 0 when the sweep and the comparison ran to the end, 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The chart a GPU machine sends back (it returns at most 8 files: gpu_check.sh's logs take the rest).
CHARTS = {"epoch_duration.png": "devices-epoch-duration.png"}


def pipeline(*args: str) -> list[str]:
    """The pipeline CLI of this checkout, run by this Python (no install needed: the repo is on the path)."""
    return [sys.executable, "-m", "pipeline", *args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the charts")
    parser.add_argument("--grid", type=Path, default=REPO / "experiments" / "devices.yaml")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (interleaved)")
    parser.add_argument("--data-dir", help="Fashion-MNIST's IDX files (default: where the pipeline finds them)")
    parser.add_argument("--synthetic", action="store_true", help="generated data of Fashion-MNIST's shape")
    parser.add_argument("--store", type=Path, help="keep the sqlite store in this folder")
    parser.add_argument("--budget-s", type=float, help="seconds for the sweep and the comparison together")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp)
        store.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite:///{(store / 'mlflow.db').resolve()}"
        data = ["--data-dir", args.data_dir] if args.data_dir else []
        if args.synthetic:
            sys.path.insert(0, str(REPO / "benchmarks"))
            from harness import synthetic_idx

            folder = Path(tmp) / "synthetic"
            folder.mkdir()
            data = ["--data-dir", str(synthetic_idx(folder))]
        env_note = f"grid {args.grid}, repeats {args.repeats}, store {uri}"
        print(f"== tracked sweep: {env_note}", flush=True)
        sweep = subprocess.Popen(
            pipeline("run", str(args.grid), "--repeats", str(args.repeats), "--tracking-uri", uri, *data), cwd=REPO
        )
        ran = _wait(sweep, None if args.budget_s is None else max(args.budget_s - 30, 1))
        # A sweep with a failed point still compares what finished; a sweep that never started does not.
        charts = Path(tmp) / "comparison"
        compared = subprocess.run(
            pipeline("compare", "--format", "markdown", "--tracking-uri", uri, "--out", str(charts)), cwd=REPO
        )
        for name, target in CHARTS.items():
            if (charts / name).exists():
                shutil.copy(charts / name, args.out / target)
                print(f"wrote {args.out / target}")
    return 0 if ran == 0 and compared.returncode == 0 else 1


def _wait(process: subprocess.Popen, timeout: float | None) -> int:
    """The sweep's exit status; past `timeout`, Ctrl-C it (its runs end KILLED) and give it 20 s to close."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        print(f"== tracked sweep: interrupting at its budget ({timeout:.0f} s); comparing what finished", flush=True)
        process.send_signal(signal.SIGINT)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return 1


if __name__ == "__main__":
    sys.exit(main())
