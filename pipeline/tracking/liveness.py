"""Runs whose process is gone: the tags that let a later process tell, and closing such runs honestly.

MLflow never marks a run KILLED by itself: a process killed with SIGKILL, or one that lost its store,
leaves RUNNING runs behind forever. Every run the pipeline opens carries its host, pid and the
process's start time; a run whose process no longer exists can then be closed by whoever comes next.
"""

from __future__ import annotations

import os
import socket
import time

from pipeline.base.names import FAILED, KILLED, TAG_ERROR, TAG_HOST, TAG_KILLED_REASON, TAG_PID, TAG_PROCESS_START
from pipeline.tracking.records import all_runs


def process_tags() -> dict[str, str]:
    """Host, pid and process start time: enough to tell later whether this process is gone."""
    import psutil

    return {
        TAG_HOST: socket.gethostname(),
        TAG_PID: str(os.getpid()),
        TAG_PROCESS_START: f"{psutil.Process().create_time():.2f}",
    }


def process_gone(tags: dict[str, str]) -> bool:
    """True when the run's tags name a process on this host that no longer runs."""
    import psutil

    if tags.get(TAG_HOST) != socket.gethostname() or not tags.get(TAG_PID, "").isdigit():
        return False  # another machine's run, or one we did not open: not ours to judge
    try:
        process = psutil.Process(int(tags[TAG_PID]))
        started = tags.get(TAG_PROCESS_START)
        return started is not None and abs(process.create_time() - float(started)) >= 1.0
    except (psutil.NoSuchProcess, ValueError):
        return True


def reap_orphans(client, experiment_id: str, spare: str | None = None) -> list[str]:
    """Mark KILLED the RUNNING runs of an experiment left by dead processes on this host (all but `spare`)."""
    host = socket.gethostname()
    runs = all_runs(client, [experiment_id], f"attributes.status = 'RUNNING' and tags.`{TAG_HOST}` = '{host}'")
    reaped = []
    for run in runs:
        if run.info.run_id != spare and process_gone(run.data.tags):
            close(
                client,
                run.info.run_id,
                KILLED,
                f"process {run.data.tags[TAG_PID]} on {host} ended without closing the run",
                started=run.info.start_time,
            )
            reaped.append(run.info.run_id)
    return reaped


def close(client, run_id: str, status: str, reason: str, started: int | None = None) -> None:
    """End a run that its own process can no longer end, saying why: now, or at its start (epoch
    ms, `started`) where this clock reads earlier, so that it never ends before it started. A run
    closed FAILED also carries the reason where every FAILED run does (TAG_ERROR: the UI's column)."""
    client.set_tag(run_id, TAG_KILLED_REASON, reason)
    if status == FAILED:
        client.set_tag(run_id, TAG_ERROR, reason)
    now = int(time.time() * 1000)
    client.set_terminated(run_id, status, end_time=max(now, started) if started else now)


def kill_running_children(client, experiment_id: str, parent_id: str, reason: str) -> list[str]:
    """Mark KILLED every RUNNING child of a sweep (Ray tasks cancelled from the driver)."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    runs = all_runs(
        client, [experiment_id], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_id}' and attributes.status = 'RUNNING'"
    )
    for run in runs:
        close(client, run.info.run_id, KILLED, reason, started=run.info.start_time)
    return [r.info.run_id for r in runs]
