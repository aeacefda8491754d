"""The local results file: one JSON line per trained point, so a tracking outage loses no training.

The driver of a sweep appends a line for every point that finished training, `logged: true` when
its run is complete in the store and `logged: false` when the store went down first (then the
trained weights are kept beside the file too). `relog` later writes each unlogged line into the
store and sweep the line names, closes what the outage left RUNNING, and marks the line logged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.errors import UserError
from pipeline.names import (CHECKPOINT_DIR, FAILED, FINISHED, KILLED, RESULTS_FILE, RUN_DURATION,
                            TAG_KILLED_REASON, TAG_RELOGGED, TAG_ROLE)

MODELS_DIR = "unlogged-models"  # under CHECKPOINT_DIR: weights of points trained during an outage


def path_in(state_dir: Path) -> Path:
    return state_dir / RESULTS_FILE


def append(state_dir: Path, line: dict[str, Any], model_state: dict | None = None) -> None:
    """Add one point's line; with `model_state`, keep the trained weights for relog as well."""
    if model_state is not None:
        import torch

        folder = state_dir / CHECKPOINT_DIR / MODELS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        model_file = folder / f"{line['run_key']}-{line['run_id'] or 'new'}.pt"
        torch.save(model_state, model_file)
        line = {**line, "model_file": str(model_file)}
    line = {"time": datetime.now().isoformat(timespec="seconds"), **line}
    with open(path_in(state_dir), "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def read(results_file: Path) -> list[dict[str, Any]]:
    if not results_file.exists():
        raise UserError(f"{results_file}: no results file here; pass the one the sweep named")
    return [json.loads(text) for text in results_file.read_text(encoding="utf-8").splitlines() if text.strip()]


def unlogged_keys(state_dir: Path, tracking_uri: str) -> set[str]:
    """Run keys trained for `tracking_uri` whose results wait in the file for `pipeline relog`."""
    results_file = path_in(state_dir)
    if not results_file.exists():
        return set()
    return {e["run_key"] for e in read(results_file) if not e.get("logged", True) and e.get("tracking_uri") == tracking_uri}


@dataclass(frozen=True)
class Relogged:
    run_id: str
    tracking_uri: str
    name: str


def relog(results_file: Path, override_uri: str | None = None) -> list[Relogged]:
    """Write every unlogged line into its store (or `override_uri`) as the FINISHED child of its
    sweep, with the params, per-epoch metrics, tags and model a normal run has; close the sweeps
    the outage left RUNNING; mark the lines logged. Returns the runs written."""
    from pipeline.tracking import Tracker

    lines = read(results_file)
    done: list[Relogged] = []
    trackers: dict[tuple[str, str], Tracker] = {}
    parents: dict[tuple[str, str], Tracker] = {}
    try:
        for entry in lines:
            if entry.get("logged", True):
                continue
            uri = override_uri or entry["tracking_uri"]
            key = (uri, entry["experiment"])
            if key not in trackers:
                trackers[key] = Tracker.open(uri, entry["experiment"])
            tracker = trackers[key]
            run_id = _restore(tracker, entry)
            entry["logged"], entry["relogged_as"] = True, run_id
            done.append(Relogged(run_id, uri, entry["name"]))
            if entry.get("parent_run_id"):
                parents[(uri, entry["parent_run_id"])] = tracker
    finally:  # what was written is marked, even when a later line fails
        temporary = results_file.with_suffix(".tmp")
        temporary.write_text("".join(json.dumps(entry) + "\n" for entry in lines), encoding="utf-8")
        os.replace(temporary, results_file)
    for (_, parent_id), tracker in parents.items():
        _close_stale_parent(tracker, parent_id)
    return done


def _existing_run(tracker, entry: dict[str, Any]):
    from mlflow.exceptions import MlflowException

    if not entry.get("run_id"):
        return None
    try:
        run = tracker.client.get_run(entry["run_id"])
    except MlflowException:
        return None  # another store (--tracking-uri), or the run was lost with the outage
    return run if run.info.experiment_id == tracker.experiment_id else None


def _parent_in(tracker, parent_id: str | None) -> str | None:
    from mlflow.exceptions import MlflowException

    if not parent_id:
        return None
    try:
        return parent_id if tracker.client.get_run(parent_id).info.experiment_id == tracker.experiment_id else None
    except MlflowException:
        return None


def _restore(tracker, entry: dict[str, Any]) -> str:
    """The line's run in `tracker`'s store: the run the sweep opened when it is there, completed
    with what the outage kept from it, else a new child of the same sweep."""
    from pipeline.train import EpochStats

    run = _existing_run(tracker, entry)
    tags = {**entry.get("tags", {}), TAG_ROLE: "point" if entry.get("parent_run_id") else "single",
            TAG_RELOGGED: str(entry.get("results_file", "results file"))}
    if run is None:
        run_id = tracker.start_run(entry["name"], _parent_in(tracker, entry.get("parent_run_id")), tags)
        logged_steps: set[int] = set()
    else:
        run_id = run.info.run_id
        tracker.log_tags(run_id, tags)
        if TAG_KILLED_REASON in run.data.tags:  # closed meanwhile as an orphan; it finished after all
            tracker.client.delete_tag(run_id, TAG_KILLED_REASON)
        logged_steps = {m.step for m in tracker.client.get_metric_history(run_id, "epoch_duration_s")}
    tracker.log_params(run_id, entry["params"])
    epochs = [EpochStats(**e) for e in entry["epochs"] if e["epoch"] not in logged_steps]
    run_metrics = {RUN_DURATION: entry.get("run_duration_s"), **entry.get("one_off", {})}
    if run is not None:  # what reached the store before the outage is not logged a second time
        run_metrics = {k: v for k, v in run_metrics.items() if k not in run.data.metrics}
    tracker.log_epochs(run_id, epochs, run_metrics)
    if entry.get("model_file") and Path(entry["model_file"]).exists() and not _has_model(run):
        step = entry["epochs"][-1]["epoch"] if entry["epochs"] else 0
        _log_model(tracker, run_id, Path(entry["model_file"]), step, entry["params"])
    tracker.end_run(run_id, FINISHED)
    return run_id


def _has_model(run) -> bool:
    return bool(run is not None and run.outputs and run.outputs.model_outputs)


def _log_model(tracker, run_id: str, model_file: Path, step: int, params: dict[str, Any]) -> None:
    import numpy as np
    import torch

    from pipeline.model import Network

    network = Network()
    network.load_state_dict(torch.load(model_file, map_location="cpu", weights_only=True))
    tracker.log_model(run_id, network, np.zeros((2, 1, 28, 28), dtype=np.float32), step, params=params)
    model_file.unlink(missing_ok=True)


def _close_stale_parent(tracker, parent_id: str) -> None:
    """A sweep that stopped on the outage is still RUNNING (or was closed KILLED as an orphan by a
    later sweep): close it FAILED, saying why, once its process is gone (under `mlflow run`, mlflow
    closes its project run itself)."""
    from mlflow.exceptions import MlflowException

    from pipeline.liveness import close, process_gone

    try:
        parent = tracker.client.get_run(parent_id)
    except MlflowException:
        return
    orphaned = parent.info.status == KILLED and "ended without closing" in parent.data.tags.get(TAG_KILLED_REASON, "")
    if (parent.info.status == "RUNNING" and process_gone(parent.data.tags)) or orphaned:
        close(tracker.client, parent_id, FAILED,
              "the tracking store went down during the sweep; its trained points were relogged from the "
              "results file, the rest were not run: run the grid again to train them")
