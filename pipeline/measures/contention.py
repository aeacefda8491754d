"""How busy the machine was while a run trained: numbers that say whether its timings can be trusted.

A run's epoch times mean something only when the run had the machine it was timed on. Two figures,
measured over the training (warm-up and epochs) through psutil's public API:

- the share of all cores that *other* processes took: the system-wide busy CPU seconds (all of
  psutil.cpu_times() but idle and iowait) over the training, less this process's own CPU seconds and
  those of its children (DataLoader workers, recursively), divided by wall seconds x cores;
- the 1-minute load average per core, sampled at the end (it lags: a hint, not the measure).

A run whose others took CONTENDED_SHARE of the cores or more (or $PIPELINE_CONTENDED_SHARE, a share
in (0, 1], where set) is tagged as contended, with the figures in words; the comparison side leaves
such runs out of its speedups and the regression gate.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

from pipeline.base.names import LOAD_AVERAGE, OTHERS_CPU_SHARE, TAG_CONTENDED
from pipeline.errors import UserError

# Other processes using a quarter of the machine's cores or more: on 2 cores, one busy core's half.
# Below it the noise of a desktop or a shell is left alone; above it a run's timings can be off by
# far more than the differences the pipeline is asked to measure.
CONTENDED_SHARE = 0.25
SHARE_VARIABLE = "PIPELINE_CONTENDED_SHARE"  # another threshold, e.g. 0.5 on a machine that is never quiet


def contended_share() -> float:
    """The share of the cores others must take for a run to count as contended: $PIPELINE_CONTENDED_SHARE
    where set, else CONTENDED_SHARE. UserError for a value that is no share in (0, 1]."""
    text = os.environ.get(SHARE_VARIABLE, "").strip()
    if not text:
        return CONTENDED_SHARE
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0 < share <= 1:
        raise UserError(
            f"{SHARE_VARIABLE}={text}: expected a share of the cores in (0, 1], e.g. 0.25 (the default); "
            f"unset it to use the default"
        )
    return share


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds at one moment: the machine's busy time (every core) and this process tree's."""

    wall_s: float  # time.monotonic()
    busy_s: float  # the whole machine's non-idle CPU seconds since boot
    own_s: float  # this process's CPU seconds, its reaped children's and its live descendants'


@dataclass(frozen=True)
class Contention:
    """The machine's load over one run's training."""

    others_share: float  # share of all cores other processes took, 0-1
    load_average: float  # 1-minute load average per core, at the end
    cores: int

    threshold: float = CONTENDED_SHARE  # contended_share() when it was measured

    @property
    def contended(self) -> bool:
        return self.others_share >= self.threshold

    def words(self) -> str:
        """The figures as the contended tag says them."""
        return (
            f"other processes took {self.others_share:.0%} of {self.cores} cores; "
            f"load average {self.load_average:.1f} per core"
        )

    def metrics(self) -> dict[str, tuple[float, int]]:
        """Metric name → (value, step 0): run-level."""
        return {LOAD_AVERAGE: (self.load_average, 0), OTHERS_CPU_SHARE: (self.others_share, 0)}

    def tags(self) -> dict[str, str]:
        return {TAG_CONTENDED: self.words()} if self.contended else {}


def _busy_seconds() -> float:
    """The machine's non-idle CPU seconds: every field of cpu_times() but idle and iowait. On Linux
    guest time is already inside user (and guest_nice inside nice): counted once."""
    times = psutil.cpu_times()  # fields differ by platform: those a platform lacks count as 0
    total: float = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    busy: float = total - times.idle - getattr(times, "iowait", 0.0)  # psutil has no types: say it
    return busy


def _own_seconds() -> float:
    """CPU seconds of this process, of its children that ended (reaped: inside children_user and
    children_system), and of its live descendants (DataLoader workers while an epoch runs)."""
    me = psutil.Process()
    with me.oneshot():
        times = me.cpu_times()
        children = me.children(recursive=True)
    total: float = times.user + times.system + times.children_user + times.children_system  # psutil: untyped
    for child in children:
        try:
            child_times = child.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended between listing and reading; its time is in children_* once reaped
        total += child_times.user + child_times.system
    return total


def sample() -> CpuSample:
    """The CPU seconds now (call at the start and the end of what is measured)."""
    return CpuSample(time.monotonic(), _busy_seconds(), _own_seconds())


def measure(
    start: CpuSample, end: CpuSample, cores: int, load_average: float, threshold: float = CONTENDED_SHARE
) -> Contention:
    """Contention between two samples on a machine of `cores` cores whose 1-minute load average at
    the end was `load_average` (not yet per core). Clipped to [0, 1]: the counters tick at 10 ms
    and descendants that end unreaped drop out, so small negative or over-full shares are noise."""
    wall = end.wall_s - start.wall_s
    cores = max(cores, 1)
    if wall <= 0:
        share = 0.0
    else:
        others = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
        share = min(max(others / (wall * cores), 0.0), 1.0)
    return Contention(others_share=share, load_average=load_average / cores, cores=cores, threshold=threshold)


def since(start: CpuSample) -> Contention:
    """Contention from `start` until now, on this machine."""
    end = sample()
    cores = psutil.cpu_count() or os.cpu_count() or 1
    return measure(start, end, cores, psutil.getloadavg()[0], contended_share())
