"""The local results file: one JSON line per trained point, so a tracking outage loses no training.

The driver of a sweep appends a line for every point that finished training, `logged: true` when
its run is complete in the store and `logged: false` when the store went down first (then the
trained weights are kept beside the file too). `relog` later writes each unlogged line into the
store and sweep the line names, closes what the outage left RUNNING, and marks the line logged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.base.files import atomic_write, folder_lock
from pipeline.base.names import (
    CHECKPOINT_DIR,
    FAILED,
    FINISHED,
    KILLED,
    RESULTS_FILE,
    RUN_DURATION,
    TAG_COMPLETE,
    TAG_ERROR,
    TAG_KILLED_REASON,
    TAG_RELOGGED,
    TAG_ROLE,
)
from pipeline.base.uris import redact, without_password
from pipeline.errors import UserError
from pipeline.measures.timing import logged_at_end
from pipeline.tracking.liveness import close, process_gone
from pipeline.tracking.records import logged_model_id
from pipeline.tracking.store import TrackingUnavailable, first_line
from pipeline.tracking.tracker import Tracker

MODELS_DIR = "unlogged-models"  # under CHECKPOINT_DIR: weights of points trained during an outage


def path_in(state_dir: Path) -> Path:
    return state_dir / RESULTS_FILE


def append(state_dir: Path, line: dict[str, Any], model_state: dict | None = None) -> None:
    """Add one point's line; with `model_state`, keep the trained weights for relog as well."""
    if model_state is not None:
        import io

        import torch

        folder = state_dir / CHECKPOINT_DIR / MODELS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        model_file = folder / f"{line['run_key']}-{line['run_id'] or 'new'}.pt"
        # Serialised in memory first: torch.save into a full disk raises a RuntimeError without an
        # errno, a plain write an OSError that says ENOSPC. Relog never finds half a model.
        weights = io.BytesIO()
        torch.save(model_state, weights)
        atomic_write(model_file, weights.getvalue())
        line = {**line, "model_file": str(model_file)}
    line = {"time": datetime.now().isoformat(timespec="seconds"), **line}
    # Under the folder's lock: never between a relog's read of the file and its rewrite.
    with folder_lock(state_dir), open(path_in(state_dir), "ab", buffering=0) as f:  # unbuffered: fails here
        kept = f.tell()
        try:
            f.write((json.dumps(line) + "\n").encode("utf-8"))
        except OSError:  # a full disk: no half line left behind; the lines before it stay as they were
            f.truncate(kept)
            raise


@dataclass(frozen=True)
class Line:
    """One line of the file as read: its entry, or why it is none (then relog leaves it as it is)."""

    number: int  # from 1
    raw: bytes
    entry: dict[str, Any] | None
    problem: str = ""


def read_lines(results_file: Path) -> list[Line]:
    """Every non-blank line, parsed and checked. A line that is not a results line (cut short by a
    full disk or a killed process, edited by hand) is kept with its problem rather than raised: the
    other lines are still worth relogging. A file that is no results file at all is a UserError."""
    try:
        data = results_file.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{results_file}: no results file here; pass the one the sweep named") from None
    except IsADirectoryError:
        inside = path_in(results_file)
        hint = f"pass {inside}" if inside.exists() else f"pass the results file ({RESULTS_FILE}) the sweep named"
        raise UserError(f"{results_file}: is a folder; {hint}") from None
    except OSError as exc:
        raise UserError(f"{results_file}: cannot read it ({exc.strerror or exc.__class__.__name__})") from None
    if b"\0" in data:
        raise UserError(
            f"{results_file}: binary data, not a results file (JSON lines); pass the {RESULTS_FILE} the sweep named"
        )
    lines = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            entry, problem = _parse(raw)
            lines.append(Line(number, raw, entry, problem))
    return lines


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        entry = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg} at column {exc.colno}; cut short?)"
    if not isinstance(entry, dict):
        return None, f"a JSON {type(entry).__name__}, not a results line (an object)"
    if not isinstance(entry.get("logged", True), bool):
        return None, f"'logged' is {entry['logged']!r}, not true or false"
    if entry.get("logged", True):
        return entry, ""  # already in its store: only kept, never read further
    for key, kind in _UNLOGGED_KEYS.items():
        if not isinstance(entry.get(key), kind):
            return None, f"{key!r} missing or not a {kind.__name__}"
    for key, kinds in _OPTIONAL_KEYS.items():
        if entry.get(key) is not None and not isinstance(entry[key], kinds):
            return None, f"{key!r} is {str(entry[key])[:60]!r}, not a {' or '.join(k.__name__ for k in kinds)}"
    from dataclasses import fields

    from pipeline.training.train import (
        EpochStats,  # torch: the CLI imports results at its start, and --help stays quick
    )

    for epoch in entry["epochs"]:
        if not _is_epoch(epoch, fields(EpochStats)):
            return None, f"an epoch that is not one ({str(epoch)[:60]})"
    if not entry["experiment"].strip():
        return None, "'experiment' is empty"
    for name, value in (entry.get("tags") or {}).items():
        if not isinstance(value, (str, int, float)):
            return None, f"tag {name!r} is {str(value)[:60]!r}, not a text or a number"
    for name, value in (entry.get("one_off") or {}).items():
        if not _is_number(value):
            return None, f"one_off {name!r} is {str(value)[:60]!r}, not a number"
    for name, value in (entry.get("metrics") or {}).items():
        if not _is_measured(value):
            return None, f"metric {name!r} is {str(value)[:60]!r}, not [value, step]"
    return entry, ""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_epoch(epoch: Any, known) -> bool:
    """An epoch as the sweep writes it (EpochStats): every field without a default there, no other,
    an integer epoch and numbers (None where the field may be None)."""
    from dataclasses import MISSING

    if not isinstance(epoch, dict) or not set(epoch) <= {f.name for f in known}:
        return False
    if any(f.name not in epoch for f in known if f.default is MISSING):
        return False
    nullable = {f.name for f in known if f.default is None}
    return (
        isinstance(epoch["epoch"], int)
        and not isinstance(epoch["epoch"], bool)
        and all(_is_number(value) or (value is None and name in nullable) for name, value in epoch.items())
    )


def _is_measured(value: Any) -> bool:
    """A run-level metric as the sweep writes it (Outcome.measured): [number, integer step]."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], (int, float))
        and not isinstance(value[0], bool)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    )


# What relog reads from an unlogged line (and how the sweep writes it).
_UNLOGGED_KEYS = {"tracking_uri": str, "experiment": str, "name": str, "params": dict, "epochs": list}
_OPTIONAL_KEYS = {
    "run_id": (str,),
    "parent_run_id": (str,),
    "model_file": (str,),
    "tags": (dict,),
    "one_off": (dict,),
    "run_duration_s": (int, float),
    "metrics": (dict,),
}


def read(results_file: Path) -> list[dict[str, Any]]:
    """The file's results lines (those that are not are left out: `bad_lines` names them)."""
    return [line.entry for line in read_lines(results_file) if line.entry is not None]


def bad_lines(results_file: Path) -> list[str]:
    """`FILE:LINE: problem` for each line relog could not read."""
    return [f"{results_file}:{line.number}: {line.problem}" for line in read_lines(results_file) if line.entry is None]


def unlogged_keys(state_dir: Path, tracking_uri: str) -> set[str]:
    """Run keys trained for `tracking_uri` whose results wait in the file for `pipeline relog`."""
    results_file = path_in(state_dir)
    if not results_file.exists():
        return set()
    masked = redact(tracking_uri)  # as the file holds it
    return {e["run_key"] for e in read(results_file) if not e.get("logged", True) and e.get("tracking_uri") == masked}


@dataclass(frozen=True)
class Relogged:
    run_id: str  # "" when the line failed before it had a run
    tracking_uri: str
    name: str
    error: str = ""  # why the line's run is FAILED (the line stays unlogged, naming the run, for a retry)
    line: int = 0  # its line in the results file, from 1


def relog(
    results_file: Path, override_uri: str | None = None, waiting: Callable[[], None] | None = None
) -> list[Relogged]:
    """Write every unlogged line into its store (or `override_uri`) as the FINISHED child of its
    sweep, with the params, per-epoch metrics, tags and model a normal run has; close the sweeps
    the outage left RUNNING; mark the lines logged. Returns the runs written. Lines that are not
    results lines are skipped and kept as they are (`bad_lines` names them). A line whose relog
    fails (MLflow refuses a name, its model file is missing or no model) marks its run FAILED with
    the reason, is returned with its `error`, and stays unlogged, naming that run, so that a relog
    after the fix completes the same run; the other lines go on.

    One process at a time reads and rewrites the file (a lock on its folder, which `append` takes
    too): a second relog of it waits (`waiting` says so), then finds the lines logged, so no line
    is logged twice and no line a sweep appends meanwhile is lost."""
    if not results_file.parent.is_dir():
        return _relog(results_file, override_uri)  # read_lines names the problem
    with folder_lock(results_file.parent, waiting):
        return _relog(results_file, override_uri)


def _relog(results_file: Path, override_uri: str | None) -> list[Relogged]:
    lines = read_lines(results_file)
    done: list[Relogged] = []
    trackers: dict[tuple[str, str], Tracker] = {}
    parents: dict[tuple[str, str], Tracker] = {}
    try:
        for number, entry in ((line.number, line.entry) for line in lines if line.entry is not None):
            if entry.get("logged", True):
                continue
            # The file holds the store's URI with its password masked: the database's client takes
            # it from its own place (PGPASSWORD, ~/.pgpass), or --tracking-uri gives the whole URI.
            uri = override_uri or without_password(entry["tracking_uri"])
            key = (uri, entry["experiment"])
            if key not in trackers:  # a store that cannot be used is the user's to fix (UserError, exit 2)
                trackers[key] = Tracker.open(uri, entry["experiment"])
            tracker = trackers[key]
            try:
                run_id = _restore(tracker, entry)
            except TrackingUnavailable:
                raise  # the store went away: every later line would fail the same way
            except Exception as exc:  # this line's failure: its run FAILED, the other lines go on
                done.append(
                    Relogged(
                        entry.get("run_id") or "",
                        uri,
                        entry["name"],
                        error=_failed(trackers.get(key), entry, exc),
                        line=number,
                    )
                )
                continue
            entry["logged"], entry["relogged_as"] = True, run_id
            done.append(Relogged(run_id, uri, entry["name"], line=number))
            if entry.get("parent_run_id"):
                parents[(uri, entry["parent_run_id"])] = tracker
    finally:  # what was written is marked, even when a later line fails; lines it could not read stay as they were
        if done:
            atomic_write(
                results_file,
                b"".join(
                    (json.dumps(line.entry).encode() if line.entry is not None else line.raw) + b"\n" for line in lines
                ),
            )
    for (_, parent_id), tracker in parents.items():  # parents of the lines relogged (not of failed ones)
        _close_stale_parent(tracker, parent_id)
    return done


class _LineProblem(Exception):
    """What is wrong with one line that only relogging it shows (its model file): the reason as is."""


def _failed(tracker, entry: dict[str, Any], exc: Exception) -> str:
    """Mark the line's run (when it has one in `tracker`'s store) FAILED with the reason; the reason."""
    import contextlib

    from mlflow.exceptions import MlflowException

    if isinstance(exc, (_LineProblem, UserError)):
        reason = str(exc)
    elif isinstance(exc, MlflowException):
        reason = f"MLflow refused it: {first_line(exc)[:300]}"
    else:
        reason = f"{exc.__class__.__name__}: {first_line(exc)[:300]}"
    if tracker is not None and entry.get("run_id"):
        with contextlib.suppress(Exception):  # a run of another store, or one that cannot be written
            tracker.log_failure(entry["run_id"], exc, reason)
        tracker.end_run(entry["run_id"], FAILED, quick=True)
    return reason


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
    from pipeline.training.train import EpochStats  # torch, as in _parse

    run = _existing_run(tracker, entry)
    tags = {
        **entry.get("tags", {}),
        TAG_ROLE: "point" if entry.get("parent_run_id") else "single",
        TAG_RELOGGED: str(entry.get("results_file", "results file")),
    }
    if run is None:
        run_id = tracker.start_run(entry["name"], _parent_in(tracker, entry.get("parent_run_id")), tags)
        entry["run_id"] = run_id  # should a later step fail, the run is FAILED, and a retry completes it
        logged_steps: set[int] = set()
    else:
        run_id = run.info.run_id
        tracker.log_tags(run_id, tags)
        if TAG_KILLED_REASON in run.data.tags:  # closed meanwhile as an orphan; it finished after all
            closed = run.data.tags[TAG_KILLED_REASON]
            for tag in (TAG_KILLED_REASON, TAG_ERROR):
                if run.data.tags.get(tag) == closed:
                    tracker.client.delete_tag(run_id, tag)
        logged_steps = {m.step for m in tracker.client.get_metric_history(run_id, "epoch_duration_s")}
    tracker.log_params(run_id, entry["params"])
    history = [EpochStats(**e) for e in entry["epochs"]]
    epochs = [e for e in history if e.epoch not in logged_steps]
    # The steady-state summary and end figures, the machine's load and the time to target: [value,
    # step]. A line written before they were kept has its epochs, and they are worked out from them.
    measured = entry.get("metrics") or {}
    run_metrics = {
        RUN_DURATION: entry.get("run_duration_s"),
        **entry.get("one_off", {}),
        **logged_at_end(history),
        **{name: value for name, (value, _) in measured.items()},
    }
    if run is not None:  # what reached the store before the outage is not logged a second time
        run_metrics = {k: v for k, v in run_metrics.items() if k not in run.data.metrics}
    tracker.log_epochs(run_id, epochs, run_metrics, steps={name: step for name, (_, step) in measured.items()})
    # A model whose logging failed mid-way is among the run's outputs without its files: not one.
    has_model = run is not None and logged_model_id(tracker.client, run) is not None
    model_file = Path(entry["model_file"]) if entry.get("model_file") else None
    if model_file is not None and not has_model:
        step = entry["epochs"][-1]["epoch"] if entry["epochs"] else 0
        _log_model(tracker, run_id, model_file, step, entry["params"])
        has_model = True
    if has_model:  # complete: its summary and model are in the store (point.run_point sets the same, last)
        tracker.log_tags(run_id, {TAG_COMPLETE: "true"})
    tracker.end_run(run_id, FINISHED)
    if model_file is not None and has_model:  # the weights kept for relog are in the store now
        model_file.unlink(missing_ok=True)
    return run_id


def _log_model(tracker, run_id: str, model_file: Path, step: int, params: dict[str, Any]) -> None:
    import numpy as np
    import torch

    from pipeline.model import Network

    network = Network()
    try:
        network.load_state_dict(torch.load(model_file, map_location="cpu", weights_only=True))
    except FileNotFoundError:
        raise _LineProblem(
            f"its model file {model_file} is missing; the run's numbers are in the line, "
            "its model is not: delete the line and run the grid again to train it"
        ) from None
    except Exception as exc:  # not a file torch saved, or another network's weights
        raise _LineProblem(
            f"its model file {model_file} holds no model of this pipeline ({exc.__class__.__name__}); "
            "restore it, or delete the line and run the grid again"
        ) from None
    tracker.log_model(run_id, network, np.zeros((2, 1, 28, 28), dtype=np.float32), step, params=params)


def _close_stale_parent(tracker, parent_id: str) -> None:
    """A sweep that stopped on the outage is still RUNNING (or was closed KILLED as an orphan by a
    later sweep): close it FAILED, saying why, once its process is gone (under `mlflow run`, mlflow
    closes its project run itself)."""
    from mlflow.exceptions import MlflowException

    try:
        parent = tracker.client.get_run(parent_id)
    except MlflowException:
        return
    orphaned = parent.info.status == KILLED and "ended without closing" in parent.data.tags.get(TAG_KILLED_REASON, "")
    if (parent.info.status == "RUNNING" and process_gone(parent.data.tags)) or orphaned:
        close(
            tracker.client,
            parent_id,
            FAILED,
            "the tracking store went down during the sweep; its trained points were relogged from the "
            "results file, the rest were not run: run the grid again to train them",
            started=parent.info.start_time,
        )
