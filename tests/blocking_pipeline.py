"""`python tests/blocking_pipeline.py ARGS`: the pipeline CLI, except that the grid point whose
batch_size is $BLOCK_BATCH_SIZE prints BLOCKED and then waits inside its run until a signal comes.
Lets a test interrupt a point mid-run at a known moment instead of after a guessed delay."""

import os
import sys
import time

import pipeline.training.train
from pipeline.cli import main

real_fit = pipeline.training.train.fit


def fit(config, *args, **kwargs):
    if config.batch_size == int(os.environ["BLOCK_BATCH_SIZE"]):
        print("BLOCKED", flush=True)
        while True:
            time.sleep(0.1)
    return real_fit(config, *args, **kwargs)


pipeline.training.train.fit = fit
sys.exit(main(sys.argv[1:], prog_name="pipeline"))
