"""Energy per epoch where the hardware tells it, read from cumulative counters; absent, never zero.

cuda: NVML's total energy counter of the run's GPU (millijoules since the driver loaded; Volta and
later), found by the GPU's UUID so CUDA_VISIBLE_DEVICES and NVML's own numbering cannot mix cards up.
cpu: the kernel's RAPL counters (/sys/class/powercap/intel-rapl:N/energy_uj, one per CPU package;
AMD's are under the same name), where the user may read them; they wrap at max_energy_range_uj.
Both count the whole card or package, other processes included: on a shared machine that is an
upper bound for the run. Elsewhere, or when a counter cannot be read, the reading is None and the
metric is not logged.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

RAPL = Path("/sys/class/powercap")


class EnergyMeter:
    def __init__(self, device) -> None:
        self._read, self.why_not = _counter(device)
        self._start: float | None = None

    def start(self) -> None:
        self._start = self._safe_read()

    def joules(self) -> float | None:
        """Energy since start(), or None where it cannot be told."""
        end = self._safe_read()
        if self._start is None or end is None:
            return None
        return end - self._start

    def _safe_read(self) -> float | None:
        if self._read is None:
            return None
        try:
            return self._read()
        except (OSError, ValueError, RuntimeError):
            return None


def energy_source(device) -> str:
    """What a run's energy_j counts, or why it has none (the run's pipeline.energy tag)."""
    read, why_not = _counter(device)
    if read is None:
        return f"not measured: {why_not}"
    return "NVML total energy of the whole GPU" if device.type == "cuda" else "RAPL, every CPU package"


def _counter(device):
    """A function returning a cumulative reading in joules, and why there is none ('' when there is)."""
    return _found(device, RAPL)


@cache
def _found(device, rapl_root: Path):
    """Found once per device and process: a run's tag and its meter share it (readings are
    cumulative, so meters that take differences can share one counter)."""
    if device.type == "cuda":
        return _nvml(device)
    if device.type == "cpu":
        return _rapl(rapl_root)
    return None, f"no energy counter for {device.type}"


def _nvml(device):
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # raises on GPUs without the counter
    except Exception as exc:  # no NVML, no driver, an older GPU: no energy, and the reason
        return None, f"NVML energy counter unavailable ({exc.__class__.__name__})"
    return (lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000), ""


class _Rapl:
    """The sum of every package's counter, each unwrapped against its previous reading."""

    def __init__(self, zones: list[Path]) -> None:
        self.zones = zones
        self.ranges = [int((zone / "max_energy_range_uj").read_text()) for zone in zones]
        self.last = [int((zone / "energy_uj").read_text()) for zone in zones]
        self.total_uj = 0

    def __call__(self) -> float:
        for i, zone in enumerate(self.zones):
            now = int((zone / "energy_uj").read_text())
            self.total_uj += now - self.last[i] if now >= self.last[i] else now + self.ranges[i] - self.last[i]
            self.last[i] = now
        return self.total_uj / 1e6


def _rapl(root: Path):
    zones = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1) if root.is_dir() else []
    if not zones:
        return None, "no RAPL energy counters on this machine (/sys/class/powercap)"
    try:
        return _Rapl(zones), ""
    except (OSError, ValueError):
        return None, "RAPL energy counters are not readable by this user (root-only since Linux 5.10)"
