"""Executors: where a sweep's point jobs run. Peers behind one small interface; none imports the runner.

    plan(points)                      -> each point's device resolved here, or why it cannot run
    executor.plan(planned)            -> which points can run there (a device on some node)
    executor.run(jobs, on_outcome)    -> one Outcome per job, in job order

`on_outcome(job, outcome)` is called as each outcome arrives and returns a reason to stop ('' to go
on): the jobs not started after that are NOT RUN with the reason (--fail-fast, a store outage).
Ctrl-C propagates as KeyboardInterrupt once no job can open or close a run any more.

local: one point after another in this process (fair timing). ray: every point a Ray task with the
resources it needs; a cuda point asks for `gpus_per_run` GPUs (Ray sets CUDA_VISIBLE_DEVICES), a cpu
point for 1 + num_workers CPUs (`threads` + num_workers where the grid sets threads), and the task
limits torch's threads to the CPUs it was given. Once
every point has landed, each Ray run is tagged with how many points trained beside it on its node
(TAG_CONCURRENT): points sharing a node time each other's load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from pipeline.base.names import TAG_CONCURRENT, TAG_RAY_NODE
from pipeline.base.uris import redact
from pipeline.errors import UserError
from pipeline.execution.outcomes import FAILED, FINISHED, NOT_RUN, Outcome, Planned, Progress
from pipeline.execution.point import PointJob, run_point
from pipeline.tracking.claims import end_lost
from pipeline.tracking.store import (
    CREDENTIAL_VARIABLES,
    TrackingUnavailable,
    first_line,
    open_client,
    process_settings,
    sqlite_path,
)
from pipeline.tracking.tracker import Tracker

if TYPE_CHECKING:
    from pipeline.settings.grid import GridPoint

OnOutcome = Callable[[PointJob, Outcome], str]


def plan(points: Sequence[GridPoint]) -> list[Planned]:
    """Resolve every point's device once; unavailable ones carry the reason."""
    # torch: loaded when a sweep plans, after its inputs are checked
    from pipeline.training.device import DeviceUnavailable, compile_missing, precision_missing, resolve

    planned = []
    for point in points:
        try:
            device = resolve(point.config.device)
        except DeviceUnavailable as exc:
            planned.append(Planned(point, None, str(exc)))
            continue
        config = point.config
        reason = precision_missing(device, config.precision) or (compile_missing(device) if config.compile else "")
        if config.cuda_graph and device.type != "cuda":
            reason = f"cuda_graph needs a CUDA device, and this point runs on {device}"
        elif config.cuda_graph and config.precision != "fp32":
            reason = f"cuda_graph replays fp32 steps; precision {config.precision} runs without it"
        elif config.cuda_graph and config.compile:
            reason = "cuda_graph and compile are two ways to cut launch overhead; set one of them per point"
        elif config.prefetch and device.type != "cuda":
            reason = f"prefetch copies batches ahead on a CUDA stream, and this point runs on {device}"
        elif config.prefetch and config.data_on_device:
            reason = "prefetch and data_on_device are two data paths; set one of them per point"
        planned.append(Planned(point, None, reason) if reason else Planned(point, device))
    return planned


class Executor(Protocol):
    def plan(self, planned: list[Planned]) -> list[Planned]: ...

    def run(self, jobs: Sequence[PointJob], on_outcome: OnOutcome) -> list[Outcome]: ...

    def close(self) -> None: ...


class LocalExecutor:
    """Points one after another in this process, with progress on the terminal."""

    def __init__(self, progress: Progress | None = None, point_function=run_point) -> None:
        self.progress, self.point_function = progress or Progress(), point_function

    def plan(self, planned: list[Planned]) -> list[Planned]:
        return planned

    def run(self, jobs: Sequence[PointJob], on_outcome: OnOutcome) -> list[Outcome]:
        outcomes, stop, cuda_lost = [], "", ""
        for job in jobs:
            if stop:
                outcomes.append(Outcome(job.point, NOT_RUN, reason=stop))
                continue
            if cuda_lost and job.device.startswith("cuda"):
                # After a sticky CUDA error every CUDA call here fails: the cpu points go on.
                outcome = Outcome(job.point, NOT_RUN, device=job.device, reason=cuda_lost)
                self.progress.run_end(outcome)
            else:
                outcome = self.point_function(job, self.progress)
            if outcome.device_lost and not cuda_lost:
                cuda_lost = (
                    f"not run: CUDA became unusable in this process after #{job.point.index} failed "
                    "(a sticky CUDA error); run the grid again to train these points"
                )
            outcomes.append(outcome)
            stop = on_outcome(job, outcome)
        return outcomes

    def close(self) -> None:
        pass


# How often a sweep on Ray checks, while no task lands, that the cluster's head answers.
HEAD_CHECK_S = 5.0


def _not_run(lost: str) -> str:
    """The reason of the points a lost head leaves unsubmitted."""
    return f"not run: {lost}; run the grid again once the cluster is back (it trains only these)"


def _is_remote(address: str | None) -> TypeGuard[str]:
    return bool(address) and address != "local"


def check_ray_address(address: str, timeout_s: float = 3.0) -> None:
    """UserError unless something listens at a cluster address (HOST:PORT, the head's GCS, or
    ray://HOST:PORT, its client server): ray.init retries an address where nothing listens for two
    minutes and more. `auto` is Ray's to find (it says at once when there is no cluster)."""
    import socket

    client = address.startswith("ray://")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto":
        return
    if not host or not port.isdigit():
        host, port = address.removeprefix("ray://"), "10001" if client else "6379"
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(
            f"--ray-address {address}: nothing answers at {host}:{port} ({exc.strerror or 'timed out'}); "
            "start the cluster with `ray start --head` there, check the address, or drop --ray-address"
        ) from None


@contextlib.contextmanager
def _held_stderr():
    """While this process joins a cluster, what is written to file descriptor 2 is held back: Ray's
    core logs each failed try as a warning there, from C++ (a line a second for 20 s when the
    cluster refuses this process's token), which the one-line error then says instead. Written out
    after a join that works, so that nothing is lost."""
    import sys
    import tempfile

    if sys.stderr is None:  # no stderr to hold (pythonw, a daemon)
        yield
        return
    with tempfile.TemporaryFile() as held:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)  # reached only when the join worked
        sys.stderr.write(held.read().decode(errors="replace"))


def _cannot_join(address: str | None, exc: Exception) -> str:
    """Why ray.init failed, in one line: Ray's reason, and what to do for the causes it may stand for.
    Something answered at a HOST:PORT address (check_ray_address), so a refusal there is most often a
    cluster started with token authentication that this process has no token for (Ray says only
    that it could not connect), else another Ray version or not a head's port."""
    reason = first_line(exc).rstrip(".")
    if not _is_remote(address):  # no --ray-address: Ray joins a cluster started on this machine, or starts one
        return (
            f"--executor ray: could not start or join a Ray instance on this machine ({reason}); a cluster "
            "started here with `ray start --head` is joined when it runs (`ray status` shows it), "
            "stop it with `ray stop`, or pass its address with --ray-address"
        )
    if address == "auto":
        return (
            f"--ray-address auto: {reason}; start a cluster with `ray start --head`, pass its HOST:PORT, "
            "or drop --ray-address to start one for this sweep"
        )
    return (
        f"--ray-address {address}: something answers there but Ray could not join it ({reason}); a cluster "
        "started with token authentication needs RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN, "
        "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) in this command's environment; otherwise check the "
        "address (`ray status` on the head prints it) and that both sides run one Ray version"
    )


class RayExecutor:
    """Points as Ray tasks on a cluster (joined, or started here). Checks at once that the sweep can
    run there: a sqlite store cannot be shared by several nodes."""

    def __init__(self, address: str | None, tracking_uri: str, reporter) -> None:
        try:
            import ray
        except ImportError:
            raise UserError("--executor ray needs Ray: pip install -e '.[ray]' (make setup installs it)") from None
        import logging

        self.ray, self.reporter = ray, reporter
        self.started_here = not ray.is_initialized()
        if self.started_here:
            quiet: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": logging.WARNING,
            }
            if _is_remote(address):
                check_ray_address(address)
            try:
                if _is_remote(address):
                    with _held_stderr():
                        ray.init(address=address, **quiet)
                else:
                    ray.init(**quiet)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UserError(_cannot_join(address, exc)) from None
        self._head_checked = time.monotonic()
        self.nodes = len([n for n in ray.nodes() if n.get("Alive")])
        self.resources = ray.cluster_resources()

        if sqlite_path(tracking_uri) is not None and self.nodes > 1:
            self.close()
            raise UserError(
                f"tracking store {redact(tracking_uri)} is a local sqlite file, which the {self.nodes} nodes "
                "of this Ray cluster cannot share; start a tracking server (`pipeline server`) and pass "
                "--tracking-uri http://HOST:5000"
            )

    def plan(self, planned: list[Planned]) -> list[Planned]:
        """On Ray, a device is available when some node of the cluster has it, not this machine.
        Each point runs on the kind of device planned here (`auto` as this driver resolves it), and
        a task asks for a GPU exactly when that kind is cuda."""
        import torch

        result = []
        for item in planned:
            config = item.point.config
            kind = item.device.type if item.device is not None else config.device.split(":")[0]
            reason = self.unsatisfiable(config.device, kind, task_resources(config, kind))
            if reason:
                result.append(Planned(item.point, None, reason))
            elif item.device is not None:
                result.append(item)
            else:  # a device this driver lacks is known only by its kind; the run key says so
                result.append(Planned(item.point, torch.device(kind), hardware=f"ray cluster {config.device}"))
        return result

    def unsatisfiable(self, device: str, kind: str, resources: dict[str, float]) -> str:
        """Why no node of the cluster can run a point, or '' when one can."""
        gpus, cpus = resources["num_gpus"], resources["num_cpus"]
        if kind == "cuda" and ":" in device:
            return (
                f"{device} cannot be pinned on a Ray cluster: Ray gives each task its own GPU(s) "
                "(CUDA_VISIBLE_DEVICES); use device: cuda"
            )
        if kind == "cuda" and self.resources.get("GPU", 0) < gpus:
            return (
                f"{device} needs {gpus:g} GPU(s) but the Ray cluster has {self.resources.get('GPU', 0):g}; "
                "add a GPU node or drop cuda from the grid"
            )
        if kind == "mps":
            return "mps is not schedulable on a Ray cluster"
        available = self.resources.get("CPU", 0)
        if available < cpus:
            return f"needs {cpus:g} CPUs (threads, at least 1, + num_workers) but the Ray cluster has {available:g}"
        return ""

    def run(self, jobs: Sequence[PointJob], on_outcome: OnOutcome) -> list[Outcome]:
        """At most as many tasks in flight as the cluster has CPUs (each needs one), so that a stop
        leaves the rest unsubmitted instead of cancelling tasks; every outcome reported as it lands."""
        ray = self.ray
        tasks = self.tasks()
        login = Login.from_environment()
        window = max(1, int(self.resources.get("CPU", 1)))
        queue = list(enumerate(jobs))
        pending: dict = {}
        outcomes: dict[int, Outcome] = {}
        stop = ""
        self.reporter.note(
            f"submitted {len(jobs)} point(s) to Ray ({self.nodes} node(s), "
            f"{self.resources.get('CPU', 0):g} CPUs, {self.resources.get('GPU', 0):g} GPUs)"
        )
        try:
            while queue or pending:
                while queue and not stop and len(pending) < window:
                    index, job = queue.pop(0)
                    resources = task_resources(job.point.config, job.device.split(":")[0])
                    task = tasks["gpu" if resources["num_gpus"] else "cpu"]
                    pending[task.options(**resources, max_retries=0).remote(job, resources["num_cpus"], login)] = index
                if stop:
                    for index, job in queue:
                        outcomes[index] = Outcome(job.point, NOT_RUN, reason=stop)
                    queue = []
                if not pending:
                    break
                # A timeout, so that Ctrl-C is noticed while every task is still running.
                done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                if not done:
                    if (lost := self._head_lost()) is not None:
                        for index in pending.values():  # Ray may never report these tasks
                            job, reason = jobs[index], f"Ray task failed: {lost}"
                            outcome = Outcome(job.point, FAILED, reason=reason, run_id=self._end_lost(job, reason))
                            outcomes[index] = outcome
                            self.reporter.remote_done(outcome, len(outcomes), len(jobs))
                            on_outcome(job, outcome)
                        pending, stop = {}, _not_run(lost)
                    continue
                index = pending.pop(done[0])
                job = jobs[index]
                try:
                    outcome = ray.get(done[0])
                except ray.exceptions.RayError as exc:
                    reason = f"Ray task failed: {str(exc).splitlines()[0]}"
                    outcome = Outcome(job.point, FAILED, reason=reason, run_id=self._end_lost(job, reason))
                    if not stop and (lost := self._head_lost(now=True)) is not None:
                        stop = _not_run(lost)  # a task submitted to a dead head never returns
                outcomes[index] = outcome
                self.reporter.remote_done(outcome, len(outcomes), len(jobs))
                stop = on_outcome(job, outcome) or stop
        except KeyboardInterrupt:
            self._stop_tasks(list(pending))
            raise
        ordered = [outcomes[i] for i in range(len(jobs))]
        _tag_concurrency(jobs, ordered)
        return ordered

    def _head_lost(self, now: bool = False) -> str | None:
        """Why the cluster's head is gone ("the Ray head at HOST:PORT stopped answering"), checked at
        most every HEAD_CHECK_S while no task lands; None while its GCS port answers. Killed, the
        head reports nothing: the tasks it held never return, and Ray's core ends this process a
        minute later. `now`: check whenever the last check was."""
        checked = time.monotonic()
        if not now and checked - self._head_checked < HEAD_CHECK_S:
            return None
        self._head_checked = checked
        address = self.ray.get_runtime_context().gcs_address
        try:
            check_ray_address(address, timeout_s=2.0)  # the check made before joining, again
        except UserError:
            return f"the Ray head at {address} stopped answering"
        return None

    def _end_lost(self, job: PointJob, reason: str) -> str | None:
        """A task that died (its worker killed, its node lost) left its run RUNNING: end it FAILED
        here, with the reason (claims.end_lost); its id."""
        try:
            return end_lost(open_client(job.tracking_uri), job.experiment_id, job.run_key, job.claim, reason)
        except Exception as exc:  # the store is the sweep's to judge; this point's outcome stands
            self.reporter.note(f"could not end the run of {job.point.name} ({exc.__class__.__name__}: {exc})")
            return None

    def tasks(self) -> dict:
        """The Ray tasks points run as. A GPU task is declared with a GPU so that Ray gives each
        worker one task only (max_calls=1): a reused worker keeps its first CUDA context, and a
        task assigned GPU 1 would run on GPU 0."""
        return {"cpu": self.ray.remote(_run_remote), "gpu": self.ray.remote(num_gpus=1, max_calls=1)(_run_remote_gpu)}

    def _stop_tasks(self, refs: list) -> None:
        if self.started_here:
            # Tasks die with the Ray instance that owns them. (ray.cancel of a task that is just
            # finishing has crashed Ray's core worker here, so the instance is stopped instead.)
            self.close()
            return
        for ref in refs:
            self.ray.cancel(ref)  # raises KeyboardInterrupt in the task, which marks its run KILLED
        self.ray.wait(refs, num_returns=len(refs), timeout=10)

    def close(self) -> None:
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()


def concurrency(spans: Sequence[tuple[float, float]]) -> list[int]:
    """For each (start, end) span, the most spans, itself included, that were running at one moment
    during it. Spans that only touch (one ends as the other starts) did not run together."""
    events = sorted(
        [(start, 1, i) for i, (start, _) in enumerate(spans)] + [(end, 0, i) for i, (_, end) in enumerate(spans)]
    )  # at equal times, ends first
    running: set[int] = set()
    most = [1] * len(spans)
    for _, starts, i in events:
        if not starts:
            running.discard(i)
            continue
        running.add(i)
        for j in running:
            most[j] = max(most[j], len(running))
    return most


def concurrency_by_node(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """Run id → how many points trained at once on its node while it trained (the most at any
    moment, itself included), for the trained outcomes that say where and when they trained.
    Spans are the workers' clocks: compared only within one node, where they are one clock."""
    by_node: dict[str, list[tuple[str, tuple[float, float]]]] = {}  # node: (run id, span) of each run
    for outcome in outcomes:
        node = outcome.tags.get(TAG_RAY_NODE)
        if outcome.trained and outcome.run_id and outcome.span and node:
            by_node.setdefault(node, []).append((outcome.run_id, outcome.span))
    counts: dict[str, int] = {}
    for together in by_node.values():
        run_ids = [run_id for run_id, _ in together]
        counts.update(zip(run_ids, concurrency([span for _, span in together])))
    return counts


def _tag_concurrency(jobs: Sequence[PointJob], outcomes: Sequence[Outcome]) -> None:
    """Tag each Ray run with TAG_CONCURRENT once every point has landed: only the driver sees every
    run's node and training span, and points that shared a node timed each other's load. A store
    that is down loses these tags only (the sweep has said so already)."""
    counts = concurrency_by_node(outcomes)
    for job, outcome in zip(jobs, outcomes):
        if outcome.run_id not in counts or outcome.status != FINISHED:
            continue
        outcome.tags[TAG_CONCURRENT] = str(counts[outcome.run_id])
        try:
            tracker = Tracker.attach(job.tracking_uri, job.experiment_id, job.experiment_name)
            tracker.log_tags(outcome.run_id, {TAG_CONCURRENT: outcome.tags[TAG_CONCURRENT]})
        except TrackingUnavailable:
            return


def task_resources(config, kind: str) -> dict[str, float]:
    """What a point's task asks Ray for, given the kind of device it runs on."""
    return {
        "num_cpus": max(1, config.threads) + config.num_workers,
        "num_gpus": config.gpus_per_run if kind == "cuda" else 0,
    }


class Login:
    """The driver's credentials for the tracking server, handed to each Ray task as an argument:
    not through Ray's runtime_env, which its dashboard and job records show, and never printed."""

    def __init__(self, values: dict[str, str]) -> None:
        self._values = values

    @classmethod
    def from_environment(cls) -> Login:
        return cls({k: os.environ[k] for k in CREDENTIAL_VARIABLES if os.environ.get(k)})

    @property
    def values(self) -> dict[str, str]:
        return dict(self._values)

    def __repr__(self) -> str:
        return f"Login({', '.join(sorted(self._values)) or 'none'})"


def _run_remote(job: PointJob, cpus: float, login: Login | None = None) -> Outcome:
    """Runs in a Ray worker (a process of its own): resolve the device there, then the point."""

    import ray
    import torch

    from pipeline.training.device import DeviceUnavailable, resolve  # torch, as above

    torch.set_num_threads(max(1, int(cpus)))
    try:  # the planned kind; for cuda, Ray's CUDA_VISIBLE_DEVICES makes the assigned GPU cuda:0
        device = resolve(job.device.split(":")[0])
    except DeviceUnavailable as exc:
        return Outcome(job.point, FAILED, reason=f"on node {os.uname().nodename}: {exc}")
    # The node, host and hardware a child records are this worker's, not the driver's.
    node = ((TAG_RAY_NODE, ray.get_runtime_context().get_node_id()),) if ray.is_initialized() else ()
    # The driver's login for the block only: Ray reuses worker processes for other tasks.
    with process_settings(login.values if login is not None else None):
        return run_point(dataclasses.replace(job, device=str(device), where=node))


def _run_remote_gpu(job: PointJob, cpus: float, login: Login | None = None) -> Outcome:
    """The same, under its own name: Ray keeps one declaration (and its max_calls) per function."""
    return _run_remote(job, cpus, login)


def open_executor(kind: str, ray_address: str | None, tracking_uri: str, reporter) -> Executor:
    if kind == "ray":
        return RayExecutor(ray_address, tracking_uri, reporter)
    return LocalExecutor(reporter)
