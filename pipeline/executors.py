"""Running a sweep's points on a Ray cluster (the local executor is the serial loop in runner).

Each point is one Ray task: a cuda point asks for `gpus_per_run` GPUs (Ray sets
CUDA_VISIBLE_DEVICES), a cpu point for 1 + num_workers CPUs, and the task limits torch's threads
to the CPUs it was given. The task trains and tracks its point exactly as the local executor does,
logging its child run under the driver's parent run by id. The driver reports each point as it
finishes and writes the local results file.
"""

from __future__ import annotations

import os
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from pipeline.errors import UserError

if TYPE_CHECKING:
    from pipeline.runner import Outcome, Planned, _Sweep


def _is_remote(address: str | None) -> bool:
    return bool(address) and address != "local"


class RayCluster:
    """Connects to (or starts) Ray and checks the sweep can run there before anything trains."""

    def __init__(self, address: str | None, tracking_uri: str) -> None:
        try:
            import ray
        except ImportError:
            raise UserError("--executor ray needs Ray: pip install -e '.[ray]' (make setup installs it)") from None
        import logging

        self.ray = ray
        self.started_here = not ray.is_initialized()
        if self.started_here:
            quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
            try:
                if _is_remote(address):
                    ray.init(address=address, **quiet)
                else:
                    ray.init(**quiet)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UserError(f"--ray-address {address}: cannot join the Ray cluster ({exc}); "
                                "start it with `ray start --head` or drop --ray-address") from None
        self.nodes = len([n for n in ray.nodes() if n.get("Alive")])
        self.resources = ray.cluster_resources()
        from pipeline.tracking import sqlite_path

        if sqlite_path(tracking_uri) is not None and self.nodes > 1:
            self.close()
            raise UserError(
                f"tracking store {tracking_uri} is a local sqlite file, which the {self.nodes} nodes of this Ray "
                "cluster cannot share; start a tracking server (`pipeline server`) and pass --tracking-uri http://HOST:5000"
            )

    def unsatisfiable(self, device: str, gpus: float, cpus: int) -> str:
        """Why no node of the cluster can run a point, or '' when one can."""
        if device.startswith("cuda") and self.resources.get("GPU", 0) < gpus:
            return (f"{device} needs {gpus:g} GPU(s) but the Ray cluster has {self.resources.get('GPU', 0):g}; "
                    "add a GPU node or drop cuda from the grid")
        if device == "mps":
            return "mps is not schedulable on a Ray cluster"
        if self.resources.get("CPU", 0) < cpus:
            return f"needs {cpus} CPUs (1 + num_workers) but the Ray cluster has {self.resources.get('CPU', 0):g}"
        return ""

    def close(self) -> None:
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()


def task_resources(item: "Planned") -> dict[str, float]:
    config = item.point.config
    gpus = config.gpus_per_run if config.device.startswith("cuda") else 0
    return {"num_cpus": 1 + config.num_workers, "num_gpus": gpus}


def _train_remote(payload: dict[str, Any]) -> "Outcome":
    """Runs in a Ray worker: train and track one point, as the local executor would."""
    import torch

    from pipeline import data as data_mod
    from pipeline.report import Reporter
    from pipeline.runner import FAILED, Options, Outcome, _Sweep, plan

    torch.set_num_threads(max(1, int(payload["cpus"])))
    os.environ["MLFLOW_TRACKING_URI"] = payload["tracking_uri"]
    dataset = data_mod.load(payload["data_root"], payload["train_size"], payload["test_size"])
    reporter = Reporter(quiet=True)
    sweep = _Sweep(dataset, reporter, Options(**payload["options"]), payload["experiment"])
    sweep.write_results = False  # the driver writes the results file: it may be on another node
    sweep.parent_id = payload["parent_id"]
    (item,) = plan([payload["point"]])
    if item.device is None:
        return Outcome(payload["point"], FAILED, reason=f"on node {os.uname().nodename}: {item.reason}")
    item.run_key = payload["run_key"]
    return sweep._run_point(item, payload["parent_id"], payload["position"])


def run_on_ray(sweep: "_Sweep", cluster: RayCluster, todo: list["Planned"], parent_id: str | None) -> dict[int, "Outcome"]:
    """Submit every point, report them as they finish; Ctrl-C cancels the rest and marks them KILLED."""
    from pipeline import tracking
    from pipeline.runner import FAILED, FINISHED, Outcome

    ray = cluster.ray
    remote = ray.remote(_train_remote)
    options = asdict(replace(sweep.options, executor="local", ray_address=None))
    pending = {}
    for position, item in enumerate(todo, start=1):
        resources = task_resources(item)
        payload = {
            "tracking_uri": tracking.absolute_store_uri(sweep.tracker.uri), "experiment": sweep.tracker.experiment_name,
            "data_root": str(sweep.dataset.folder), "train_size": len(sweep.dataset.train),
            "test_size": len(sweep.dataset.test), "options": options, "parent_id": parent_id,
            "point": item.point, "run_key": item.run_key, "position": (position, len(todo)),
            "cpus": resources["num_cpus"],
        }
        pending[remote.options(**resources, max_retries=0).remote(payload)] = item
    sweep.reporter.note(f"submitted {len(pending)} point(s) to Ray ({cluster.nodes} node(s), "
                        f"{cluster.resources.get('CPU', 0):g} CPUs, {cluster.resources.get('GPU', 0):g} GPUs)")
    outcomes: dict[int, Outcome] = {}
    try:
        while pending:
            # A timeout, so that Ctrl-C is noticed while every task is still running.
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            if not done:
                continue
            item = pending.pop(done[0])
            try:
                outcome = ray.get(done[0])
            except ray.exceptions.RayError as exc:
                outcome = Outcome(item.point, FAILED, reason=f"Ray task failed: {str(exc).splitlines()[0]}")
            outcomes[item.point.index] = outcome
            sweep.reporter.remote_done(outcome, len(outcomes), len(todo))
            if outcome.status == FINISHED:
                sweep._append_result(item, outcome, logged=True)
    except KeyboardInterrupt:
        if cluster.started_here:
            # Tasks die with the Ray instance that owns them. (ray.cancel of a task that is just
            # finishing has crashed Ray's core worker here, so the instance is stopped instead.)
            cluster.close()
        else:
            for ref in pending:
                ray.cancel(ref)  # raises KeyboardInterrupt in the task, which marks its run KILLED
            ray.wait(list(pending), num_returns=len(pending), timeout=10)
        if parent_id:  # now no task can open or close a run any more
            sweep.tracker.kill_running_children(parent_id)
        raise
    return outcomes
