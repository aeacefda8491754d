"""`python tests/ending_pipeline.py ARGS`: the pipeline CLI, except that the grid point whose
batch_size is $END_BATCH_SIZE ends at a known moment, $END_AT: `epoch` (at its first training step)
or `model` (training done, just before its model is logged), the way $END_HOW says: SIGKILL,
SIGTERM, SIGHUP sent to itself, `exception` (a RuntimeError), `fill`: the disk under the folder
$FILL_FOLDER is filled up (a file written until ENOSPC), and the pipeline meets a full disk, or
`pause`: it waits there until the file $PAUSE_UNTIL exists, then goes on. Events, not guessed
delays: the end comes from inside the pipeline's own functions, wrapped here."""

import os
import signal
import sys
import time

import pipeline.execution.point
import pipeline.tracking.tracker
from pipeline.cli import main

TARGET, AT, HOW = os.environ["END_BATCH_SIZE"], os.environ["END_AT"], os.environ["END_HOW"]


def end() -> None:
    if HOW == "fill":
        fill(os.environ["FILL_FOLDER"])
        return
    if HOW == "pause":
        pause(os.environ["PAUSE_UNTIL"])
        return
    print(f"ENDING at {AT} by {HOW}", flush=True)
    if HOW == "exception":
        raise RuntimeError(f"injected at {AT}")
    os.kill(os.getpid(), getattr(signal, HOW))


def pause(until: str) -> None:
    """Until the file `until` exists: say so once, and wait."""
    if os.path.exists(until):
        return
    print(f"PAUSED at {AT}", flush=True)
    while not os.path.exists(until):
        time.sleep(0.05)


def fill(folder: str) -> None:
    """Once: write zeros into FOLDER/filler until the disk refuses another byte."""
    if os.path.exists(os.path.join(folder, "filler")):
        return
    print(f"ENDING at {AT} by {HOW}", flush=True)
    with open(os.path.join(folder, "filler"), "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(bytes(64 * 1024))
        except OSError:
            pass
        try:
            while True:
                filler.write(b"\0")
        except OSError:
            pass


real_step = pipeline.execution.point._PointHooks.step


def step(self) -> None:
    if AT == "epoch" and str(self.job.point.config.batch_size) == TARGET:
        end()
    real_step(self)


real_log_network = pipeline.tracking.tracker.log_network


def log_network(model, example, step, params):
    if AT == "model" and params.get("batch_size") == TARGET:
        end()
    return real_log_network(model, example, step, params)


pipeline.execution.point._PointHooks.step = step
pipeline.tracking.tracker.log_network = log_network
sys.exit(main(sys.argv[1:], prog_name="pipeline"))
