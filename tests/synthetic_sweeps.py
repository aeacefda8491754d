"""Sweeps written straight into a real sqlite store through MlflowClient, with epoch times the test
chooses: what a `pipeline run` would record (a parent run, FINISHED children carrying the grid's
params, per-epoch metrics at step = epoch, the device/hardware/host tags), without training.

The comparison and the gate read them back through records.read_sweep like any other sweep, so
tests can set a clear 2x difference, or none, and assert the intervals deterministically."""

from __future__ import annotations

from dataclasses import dataclass, field

import mlflow
import numpy as np
from mlflow.entities import Metric, Param, RunTag

from pipeline.base import names

SETTINGS = {"lr": "0.01", "batch_size": "128", "num_workers": "0", "epochs": "4", "seed": "0", "shuffle": "true"}


@dataclass
class Run:
    """One child run: its settings (over SETTINGS), epoch times (epoch 1 first), tags, run-level metrics
    and any more per-epoch metrics (the time buckets, say)."""

    epochs: list[float]
    device: str = "cpu"
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    hardware: str | None = None  # default: "Test CPU" on cpu, "Test GPU" elsewhere
    host: str = "host-a"
    histories: dict[str, list[float]] = field(default_factory=dict)  # more per-epoch metrics, epoch 1 first


def jittered(seconds: float, epochs: int, rng: np.random.Generator, spread: float = 0.03) -> list[float]:
    """`epochs` epoch times around `seconds` (a cold first epoch at twice that), a few percent apart."""
    return [2 * seconds] + list(seconds * (1 + spread * rng.standard_normal(epochs - 1)))


def write_sweep(tracking_uri: str, experiment: str, runs: list[Run], parent_tags: dict[str, str] | None = None) -> str:
    """A FINISHED sweep of `runs` in `experiment` (created when missing); the parent run's id."""
    client = mlflow.MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    parent = client.create_run(
        experiment_id, run_name=f"{experiment}-sweep", tags={names.TAG_ROLE: "sweep", **(parent_tags or {})}
    )
    for i, run in enumerate(runs):
        params = {**SETTINGS, "device": run.device.split(":")[0], **run.params}
        params["epochs"] = str(len(run.epochs))
        hardware = run.hardware or ("Test CPU" if run.device == "cpu" else "Test GPU")
        child = client.create_run(
            experiment_id,
            run_name=f"point{i} {run.device}",
            tags={
                "mlflow.parentRunId": parent.info.run_id,
                names.TAG_ROLE: "point",
                names.TAG_DEVICE: run.device,
                names.TAG_HARDWARE: hardware,
                names.TAG_HOST: run.host,
                **run.tags,
            },
        )
        metrics = [
            Metric(name, value, 0, epoch)
            for epoch, seconds in enumerate(run.epochs, start=1)
            for name, value in (
                ("epoch_duration_s", seconds),
                ("images_per_s", 1000 / seconds),
                ("test_accuracy", 0.7 + 0.02 * epoch),
            )
        ]
        metrics += [
            Metric(name, value, 0, epoch)
            for name, values in run.histories.items()
            for epoch, value in enumerate(values, start=1)
        ]
        metrics += [
            Metric(name, value, 0, 0)
            for name, value in {
                "run_duration_s": sum(run.epochs),
                "train_loss": 0.5,
                "train_accuracy": 0.8,
                "test_loss": 0.6,
                **run.metrics,
            }.items()
        ]
        client.log_batch(
            child.info.run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()], tags=[RunTag("x", "y")]
        )
        client.set_terminated(child.info.run_id, names.FINISHED)
    client.set_terminated(parent.info.run_id, names.FINISHED)
    return parent.info.run_id
