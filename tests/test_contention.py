"""Contention: how busy the machine was while a run trained (contention.py), and how many points
shared a Ray node (executors.concurrency). The measure on controlled input; this process's own
children counted as its own; a real run beside CPU-bound processes that are not its own comes out
tagged contended. (Tests run beside another xdist worker: none asserts that a run was NOT contended.)"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import mlflow
import psutil
import pytest

from conftest import children, invoke, runs_of
from pipeline.base import names
from pipeline.execution.executors import concurrency, concurrency_by_node
from pipeline.execution.outcomes import DONE, FINISHED, Outcome
from pipeline.measures import contention
from pipeline.measures.contention import CONTENDED_SHARE, Contention, CpuSample, measure
from pipeline.settings.config import RunConfig
from pipeline.settings.grid import GridPoint


def test_others_share_is_the_machines_busy_time_less_our_own_over_wall_times_cores():
    start = CpuSample(wall_s=100.0, busy_s=1000.0, own_s=50.0)
    end = CpuSample(wall_s=110.0, busy_s=1016.0, own_s=60.0)  # 16 busy core-seconds, 10 of them ours
    found = measure(start, end, cores=2, load_average=1.9 * 2)
    assert found.others_share == pytest.approx(6 / 20) and found.load_average == pytest.approx(1.9)
    assert found.contended and found.others_share >= CONTENDED_SHARE
    assert found.words() == "other processes took 30% of 2 cores; load average 1.9 per core"
    assert found.tags() == {names.TAG_CONTENDED: found.words()}
    assert found.metrics() == {names.LOAD_AVERAGE: (pytest.approx(1.9), 0), names.OTHERS_CPU_SHARE: (0.3, 0)}
    quiet = measure(start, CpuSample(110.0, 1012.0, 60.0), cores=2, load_average=0.5)
    assert quiet.others_share == pytest.approx(0.1) and not quiet.contended and quiet.tags() == {}


def test_the_share_is_clipped_to_the_machine():
    start = CpuSample(0.0, 0.0, 0.0)
    assert measure(start, CpuSample(1.0, 0.5, 0.9), cores=4, load_average=0.0).others_share == 0.0  # tick noise
    assert measure(start, CpuSample(1.0, 9.0, 0.0), cores=4, load_average=0.0).others_share == 1.0
    assert measure(start, CpuSample(0.0, 9.0, 0.0), cores=4, load_average=0.0).others_share == 0.0  # no time passed
    assert measure(start, CpuSample(1.0, 1.0, 0.0), cores=0, load_average=3.0) == Contention(1.0, 3.0, 1)


def _spin(seconds: float) -> str:
    return f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


# Burns CHILD_CPU_S of its own CPU time (not wall time: a loaded machine stretches that, not this),
# says so, and waits alive until its stdin closes.
_BURN_THEN_WAIT = (
    "import sys, time\nwhile time.process_time() < {seconds}: pass\nprint('burnt', flush=True)\nsys.stdin.read()\n"
)
CHILD_CPU_S = 0.4


def test_cpu_time_of_our_children_is_our_own():
    """A child process (a DataLoader worker, say) burning CPU counts as this process's time, not as
    another process's: its seconds appear in the own_s of a sample, while it lives and once reaped.
    Synchronised on what the child reports (its own CPU time spent), never on a sleep: a busy machine
    makes it slower, not wrong (it failed under load when it slept 0.4 s and hoped)."""
    before = contention.sample()
    child = subprocess.Popen(
        [sys.executable, "-c", _BURN_THEN_WAIT.format(seconds=CHILD_CPU_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "burnt"  # blocks until the child has burnt its seconds
        during = contention.sample()  # the child alive: counted through children(recursive=True)
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    after = contention.sample()  # reaped: in children_user / children_system
    tick = 0.05  # the kernel counts CPU time in 10 ms ticks, per process and per counter
    assert during.own_s - before.own_s >= CHILD_CPU_S - tick
    assert after.own_s - before.own_s >= CHILD_CPU_S - tick
    assert after.busy_s - before.busy_s >= (after.own_s - before.own_s) * 0.5


def _start_spinners(count: int) -> list[int]:
    """`count` CPU-bound processes that are not this process's descendants (each started by a
    short-lived middle process, so it is reparented): to the pipeline they are other processes.
    Each also ends by itself after a minute, should this test die before it kills them."""
    launcher = (
        f"import subprocess, sys\nSPIN = {_spin(60.0)!r}\n"
        "p = subprocess.Popen([sys.executable, '-c', SPIN], stdin=subprocess.DEVNULL,\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(p.pid)\n"
    )
    pids: list[int] = []
    try:
        for _ in range(count):
            done = subprocess.run(
                [sys.executable, "-c", launcher], capture_output=True, text=True, check=True, timeout=60
            )
            pids.append(int(done.stdout))
    except BaseException:
        _stop(pids)
        raise
    return pids


def _stop(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_run_beside_busy_processes_is_tagged_contended(write_grid, data_dir, tracking_uri, monkeypatch):
    monkeypatch.delenv(contention.SHARE_VARIABLE)  # the default threshold, which the suite raises
    # One core left to the run: the machine is then saturated (the run's threads and the spinners),
    # so others take at least a third of it, while the run's OpenMP threads are not starved.
    cores = psutil.cpu_count() or 1
    pids = _start_spinners(max(cores - 1, 1))
    try:
        assert all(p not in {c.pid for c in psutil.Process().children(recursive=True)} for p in pids)
        time.sleep(0.3)
        grid = write_grid("experiment: busy\ngrid:\n  batch_size: [64]\n  device: [cpu]\n  epochs: [1]\n")
        out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
    finally:
        _stop(pids)
    assert out.exit_code == 0, out.output
    (run,) = children(runs_of(tracking_uri, "busy"))
    share = run.data.metrics[names.OTHERS_CPU_SHARE]
    assert CONTENDED_SHARE <= share <= 1.0, run.data.metrics
    assert run.data.metrics[names.LOAD_AVERAGE] >= 0
    tag = run.data.tags[names.TAG_CONTENDED]
    assert tag.startswith(f"other processes took {share:.0%} of {cores} cores; load average "), tag
    steps = {
        m.step
        for name in (names.OTHERS_CPU_SHARE, names.LOAD_AVERAGE)
        for m in mlflow.MlflowClient(tracking_uri).get_metric_history(run.info.run_id, name)
    }
    assert steps == {0}


def test_concurrency_is_the_most_spans_running_at_once_during_each():
    #  a: 0-10, b: 2-4, c: 3-5, d: 10-12 (touches a: not together), e: 20-21
    spans = [(0, 10), (2, 4), (3, 5), (10, 12), (20, 21)]
    assert concurrency(spans) == [3, 3, 3, 1, 1]
    assert concurrency([]) == [] and concurrency([(1, 2)]) == [1]


def _outcome(run_id: str, node: str, span: tuple[float, float], status: str = FINISHED) -> Outcome:
    point = GridPoint(1, RunConfig(), "cpu")
    return Outcome(point, status, run_id=run_id, span=span, tags={names.TAG_RAY_NODE: node})


def test_concurrency_counts_within_each_node_only():
    outcomes = [
        _outcome("a", "n1", (0, 10)),
        _outcome("b", "n1", (5, 15)),
        _outcome("c", "n2", (0, 10)),
        _outcome("d", "n1", (5, 6), status=DONE),
        Outcome(GridPoint(2, RunConfig(), "x"), FINISHED, run_id="e"),
    ]
    assert concurrency_by_node(outcomes) == {"a": 2, "b": 2, "c": 1}


def test_the_threshold_is_a_share_users_can_set_and_a_bad_one_is_one_line(
    write_grid, data_dir, tracking_uri, monkeypatch
):
    start = CpuSample(0.0, 0.0, 0.0)
    end = CpuSample(10.0, 14.0, 10.0)  # others: 4 CPU seconds of 20 on 2 cores = 20%
    assert not measure(start, end, 2, 0.0).contended  # under the default quarter
    monkeypatch.setenv(contention.SHARE_VARIABLE, "0.1")
    assert contention.contended_share() == 0.1 and measure(start, end, 2, 0.0, 0.1).contended
    grid = write_grid("experiment: share\ngrid:\n  device: [cpu]\n")
    for bad in ("0", "1.5", "lots"):
        monkeypatch.setenv(contention.SHARE_VARIABLE, bad)
        out = invoke("run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", tracking_uri)
        assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1, out.output
        assert f"PIPELINE_CONTENDED_SHARE={bad}" in out.output and "(0, 1]" in out.output
    assert runs_of(tracking_uri, "share") == []  # nothing was created
