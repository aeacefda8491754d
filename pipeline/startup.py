"""Python's garbage collector kept out of the `pipeline` command's start-up and exit.

Start-up imports torch, MLflow and SQLAlchemy and opens the store: over 400,000 objects the
collector tracks, made faster than any die, and every full collection walks them all. In a one-run
sweep on 2 cores the collector took 1.8 s (1.4 s in 7 full collections), and the interpreter's
teardown walks them once more (about 2 s after `import torch, mlflow` alone). So the command
starts with the collector off (`pause`); once the sweep is open, what start-up built is frozen
(`gc.freeze`: kept, never walked again) and the collector is back on (`resume`), so a long sweep
collects its garbage as usual; at exit everything is frozen before the teardown, which then frees
memory without walking it. Commands that train nothing resume at once. Objects still die by
reference counting throughout; garbage cycles made during start-up are frozen with the rest and
kept for the process's life (peak memory of a 6-run grid: 957 MiB before, 962 after). A process
that did not pause (a notebook, a test, a Ray worker) is left alone.
"""

from __future__ import annotations

import atexit
import gc

_paused = False


def pause() -> None:
    """Collector off until `resume`, and frozen at exit (the last exit handler to run)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True
    atexit.register(gc.freeze)


def resume() -> None:
    """Start-up's objects frozen, the collector back on; a no-op unless `pause` turned it off."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()


TRAINING = ("run", "train")  # their runner calls `resume` once the sweep is open (runner.py)


def resume_unless_training(command: str | None) -> None:
    """`resume` at once for any other command: relog, predict or compare may run for long, and only
    a sweep knows where its start-up ends. They keep the quick exit."""
    if command not in TRAINING:
        resume()
