"""Exactly once across processes: a grid point is trained by the one process that claims it.

Two sweeps of one grid on one store, or a sweep started while another trains the same points, must
never train a point twice. MLflow's public API has no lock and no conditional write, but it has one
atomic test-and-set on every store it supports: an experiment name is unique (a database constraint
on sqlite and PostgreSQL, behind a server too), and creating a taken name fails with
RESOURCE_ALREADY_EXISTS. So a claim is an experiment named after the point:

    pipeline.claim/<experiment id>/<run key>/<attempt>

created with the claiming process's host, pid and start time (liveness.process_tags) and its sweep's
parent run as tags, in the one insert that takes the name. Whoever creates it holds attempt N of
the point. The claim is deleted at once (it leaves the experiments list; MLflow keeps a deleted
experiment's name taken), and the run that trains the point carries the attempt (names.TAG_CLAIM).

An attempt is spent, and the next one may be claimed, when its process is gone (the pid no longer
runs, or runs a younger process: liveness.process_gone) or is this one (an earlier sweep of the same
process, say through pipeline.api, that stopped before the point), when its run has ended (FINISHED, FAILED or
KILLED), or when its sweep's parent has ended (a sweep that stopped before reaching the point). A
live process's claim is never taken over, so neither is its checkpoint. A run key names its host,
so only processes on one host ever contend for a point, and liveness is judged there, on sqlite as
on a server store. `mlflow gc` purges deleted experiments, claims included: run it between sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.base.names import TAG_CLAIM, TAG_CLAIM_SWEEP, TAG_HOST, TAG_PID, TAG_RUN_KEY
from pipeline.tracking.liveness import close, process_gone, process_tags

PREFIX = "pipeline.claim/"
ENDED = ("FINISHED", "FAILED", "KILLED")


@dataclass(frozen=True)
class Holder:
    """The live process that holds a point."""

    pid: str
    host: str
    sweep: str

    def __str__(self) -> str:
        return f"process {self.pid} on {self.host}" + (f" (sweep {self.sweep[:8]})" if self.sweep else "")


def claim_name(experiment_id: str, run_key: str, attempt: int) -> str:
    return f"{PREFIX}{experiment_id}/{run_key}/{attempt}"


def claim(client, experiment_id: str, run_key: str, sweep: str | None) -> int | Holder:
    """Claim the point `run_key` of the experiment for this process and its sweep (the parent run id):
    the attempt now held (an int, for the run's TAG_CLAIM), or the Holder of a live claim."""
    from mlflow.exceptions import MlflowException

    attempt = 1
    while True:
        name = claim_name(experiment_id, run_key, attempt)
        try:
            held = client.create_experiment(name, tags={**process_tags(), TAG_CLAIM_SWEEP: sweep or ""})
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            taken = client.get_experiment_by_name(name)
            if taken is None:  # purged (mlflow gc) since: try the name again
                continue
            if not spent(client, experiment_id, run_key, attempt, taken.tags):
                return Holder(
                    taken.tags.get(TAG_PID, "?"), taken.tags.get(TAG_HOST, "?"), taken.tags.get(TAG_CLAIM_SWEEP, "")
                )
            attempt += 1
            continue
        client.delete_experiment(held)
        return attempt


def spent(client, experiment_id: str, run_key: str, attempt: int, tags: dict[str, str]) -> bool:
    """Whether attempt `attempt` of a point is over: its process gone, its run ended, or its sweep ended."""
    from mlflow.exceptions import MlflowException

    if process_gone(tags):
        return True
    if all(tags.get(key) == value for key, value in process_tags().items()):
        return True  # this process's own, from a sweep it ran before (a sweep never claims a point twice)
    runs = client.search_runs(
        [experiment_id], f"tags.`{TAG_RUN_KEY}` = '{run_key}' and tags.`{TAG_CLAIM}` = '{attempt}'", max_results=1
    )
    if runs:
        return runs[0].info.status in ENDED
    sweep = tags.get(TAG_CLAIM_SWEEP)
    if not sweep:
        return False
    try:
        return client.get_run(sweep).info.status in ENDED
    except MlflowException:
        return True  # its sweep's parent is gone (deleted for good): nothing will train it


def end_lost(client, experiment_id: str, run_key: str, attempt: int, reason: str) -> str | None:
    """End FAILED, saying why, the run of attempt `attempt` at a point that its executor lost (a Ray
    worker that died mid-task): its own process cannot end it any more. Its id, or None where the
    attempt has no run still RUNNING."""
    if not attempt:
        return None
    runs = client.search_runs(
        [experiment_id],
        f"tags.`{TAG_RUN_KEY}` = '{run_key}' and tags.`{TAG_CLAIM}` = '{attempt}' and attributes.status = 'RUNNING'",
    )
    for run in runs:
        close(client, run.info.run_id, "FAILED", reason, started=run.info.start_time)
    return runs[0].info.run_id if runs else None
