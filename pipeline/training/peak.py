"""What a device can do at most, measured: the FLOP/s of a large matrix multiplication at each
precision it supports, and the bytes per second of a large memory copy. The figure a run's `mfu`
(model FLOPs utilisation) divides by, and what `pipeline devices --peak` prints beside the vendor's
nominal figures (or, for a CPU, an estimate from its clock and vector width).

Only `pipeline devices --peak` measures (a few seconds of the whole machine): it caches the result
in a JSON file (`cache_file`), keyed by the host name, the hardware's name and what decides its
peak beyond the name (a CPU's vector and matrix extensions: one "AMD EPYC" name covers machines
with AVX2 only and with AVX-512; a GPU's memory), the torch version and, on a CPU, the torch threads
the matrix multiplication ran on (all logical CPUs unless OMP_NUM_THREADS, taskset or a Ray task
gave torch fewer). A run reads the cache and never writes it: a sweep benchmarks nothing and
writes nothing outside its store and its own files. A run whose key has no peak gets no `mfu`, and
its `pipeline.peak` tag says which key to measure. `--remeasure` measures again.

A measured peak is a best case of torch's own kernels on square matrices: the vendor's figure is the
hardware's, which torch reaches only on the largest shapes, and on a busy machine the measurement
is low (it takes the fastest of several calls to see past short interruptions). A peak measured
while other processes took a contended share of the cores (contention.py: the threshold that tags a
run as contended) is printed but never cached, so that a low peak does not make every later run's
mfu read high.

A run's `bandwidth_share` divides the bytes its eager step moves (flops.epoch_bytes, per second of
its steady epoch) by the measured copy bandwidth. That count is an upper bound, which caches and
fusion cut, so the share is told only where the count can stand for the memory's traffic: on a CUDA
GPU, with compile off (CUDA graphs replay the eager kernels: they count), and only where it comes to
at most 1. On a CPU a batch's activations sit in the caches between kernels, so the count says
nothing about its memory (bandwidth_share says why not, for each run).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.base.files import atomic_write
from pipeline.measures import contention

if TYPE_CHECKING:
    import torch

CACHE_ENV = "PIPELINE_CACHE_DIR"  # a folder for the pipeline's cache files (peaks.json)
CACHE_NAME = "peaks.json"
# The cache file's format; a file of another format is measured over, not read. 2: each peak records
# how busy the machine was (others_share); a format-1 peak may have been measured on a busy machine.
# 3: keyed by the vector units too (Peak.units); a format-2 peak may be another machine's of one name.
FORMAT = 3
TERA = 1e12

# One call of the matrix multiplication should take at least this long, so that the time is the
# kernel's and not the launch's or the timer's (_matmul); no longer than LONGEST_CALL_S to find a faster size.
CALL_S = 0.05
LONGEST_CALL_S = 0.25
BUDGET_S = 0.3  # then calls are repeated for about this long (at least MIN_CALLS): the fastest counts
MIN_CALLS = 3
MAX_SIDE = {"cpu": 2048, "cuda": 16384, "mps": 8192}
COPY_BYTES = {"cpu": 64 * 2**20, "cuda": 2**30, "mps": 256 * 2**20}


@dataclass(frozen=True)
class Nominal:
    """A vendor's datasheet figures for one device (dense arithmetic, no sparsity), or an estimate."""

    label: str  # what the figures are for, e.g. "NVIDIA H200 SXM (datasheet)"
    matmul: dict[str, float]  # precision -> FLOP/s
    copy_bytes_per_s: float | None  # memory bandwidth, bytes/s
    estimate: bool = False  # worked out here (a CPU), not a vendor's figure


# Vendors' nominal peaks, dense (the datasheets' "with sparsity" figures halved), fp32 without TF32.
# First match wins: a more specific name comes before a shorter one.
_NVIDIA = (
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: FP32 67 TF, BF16/FP16 1,979 TF sparse, 4.8 TB/s)
    ("H200", Nominal("NVIDIA H200 SXM (datasheet)", {"fp32": 67e12, "bf16": 989.5e12, "fp16": 989.5e12}, 4.8e12)),
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 PCIe: FP32 51 TF, BF16/FP16 1,513 TF sparse, 2 TB/s)
    ("H100 PCIe", Nominal("NVIDIA H100 PCIe (datasheet)", {"fp32": 51e12, "bf16": 756.5e12, "fp16": 756.5e12}, 2.0e12)),
    # same page (H100 SXM: FP32 67 TF, BF16/FP16 1,979 TF sparse, 3.35 TB/s)
    ("H100", Nominal("NVIDIA H100 SXM (datasheet)", {"fp32": 67e12, "bf16": 989.5e12, "fp16": 989.5e12}, 3.35e12)),
    # https://www.nvidia.com/en-us/data-center/a100/ (FP32 19.5 TF, BF16/FP16 312 TF dense; 80GB SXM 2,039 GB/s)
    ("A100", Nominal("NVIDIA A100 80GB SXM (datasheet)", {"fp32": 19.5e12, "bf16": 312e12, "fp16": 312e12}, 2.039e12)),
    # https://www.nvidia.com/en-us/data-center/l4/ (FP32 30.3 TF, BF16/FP16 242 TF sparse, 300 GB/s)
    ("L4", Nominal("NVIDIA L4 (datasheet)", {"fp32": 30.3e12, "bf16": 121e12, "fp16": 121e12}, 300e9)),
    # https://www.nvidia.com/en-us/data-center/tesla-t4/ (FP32 8.1 TF, FP16 mixed 65 TF, 320 GB/s; no bf16)
    ("T4", Nominal("NVIDIA T4 (datasheet)", {"fp32": 8.1e12, "fp16": 65e12}, 320e9)),
    # https://www.nvidia.com/en-us/data-center/v100/ (SXM2: FP32 15.7 TF, tensor 125 TF, 900 GB/s; no bf16)
    ("V100", Nominal("NVIDIA V100 SXM2 (datasheet)", {"fp32": 15.7e12, "fp16": 125e12}, 900e9)),
)

# fp32 FLOPs per cycle per core: 2 FMA units x lanes x 2 (a fused multiply-add is two FLOPs).
# AVX-512 parts with a single FMA unit reach half the first figure.
_FP32_PER_CYCLE = (("avx512f", 64), ("avx2", 32), ("avx", 16), ("sse2", 8))
# bf16 FLOPs per cycle per core where the CPU has bf16 arithmetic: AMX's tile unit (1,024 per cycle,
# Intel's figure), AVX512_BF16's dot products (twice fp32's). Without either, bf16 is emulated: no estimate.
_BF16_PER_CYCLE = (("amx_bf16", 1024), ("avx512_bf16", 128))


@dataclass(frozen=True)
class Peak:
    """One device's measured peaks."""

    device: str  # "cpu", "cuda:0"
    hardware: str  # CPU model or GPU name
    host: str
    torch_version: str
    threads: int | None  # CPU: torch's threads during the matrix multiplication
    matmul: dict[str, float]  # precision -> FLOP/s, the fastest call of a square matrix multiplication
    matmul_side: dict[str, int]  # precision -> the matrices' side it was measured at
    copy_bytes_per_s: float  # a large copy: bytes read plus bytes written per second
    measured_at: str  # ISO 8601, UTC
    seconds: float  # how long measuring took
    others_share: float | None = None  # the share of the cores other processes took while measuring
    units: str = ""  # what decides the peak beyond the name: a CPU's vector extensions, a GPU's memory

    @property
    def busy(self) -> str:
        """Why the machine was too busy for this peak to stand ('' where it was quiet enough)."""
        if self.others_share is None or self.others_share < contention.contended_share():
            return ""
        return f"measured while other processes took {self.others_share:.0%} of the cores"

    @property
    def key(self) -> str:
        return cache_key(self.host, self.hardware, self.torch_version, self.threads, self.units)


@dataclass(frozen=True)
class Found:
    """A device's peak and where it came from."""

    peak: Peak
    reused: bool  # read from the cache file, not measured now
    cache: Path
    cache_error: str = ""  # why the peak measured now was not cached ('' when it was, or was reused)


@dataclass(frozen=True)
class Share:
    """A run's share of its device's measured matmul peak at its precision."""

    mfu: float | None  # achieved / peak, in (0, 1]; None where it cannot be told (note says why)
    peak_flops: float | None  # the peak it divides by
    note: str  # where the peak came from, or why there is no mfu


@dataclass(frozen=True)
class Bandwidth:
    """A run's share of its device's measured copy bandwidth, and that bandwidth (a roofline's slope)."""

    share: float | None  # counted bytes per second / copy bandwidth, in (0, 1]; None where not told (note says why)
    copy_bytes_per_s: float | None  # the measured copy bandwidth it divides by
    note: str  # where the bandwidth came from, or why there is no share


def cache_file() -> Path:
    """Where measured peaks are kept: $PIPELINE_CACHE_DIR/peaks.json, else the user's cache folder
    ($XDG_CACHE_HOME, default ~/.cache) under pipeline/."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        return Path(chosen) / CACHE_NAME
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pipeline" / CACHE_NAME


def cache_key(host: str, hardware: str, torch_version: str, threads: int | None, units: str = "") -> str:
    parts = [host, f"{hardware} ({units})" if units else hardware, f"torch {torch_version}"]
    if threads is not None:
        parts.append(f"{threads} threads")
    return " | ".join(parts)


def identity(device: torch.device) -> tuple[str, str, str, int | None, str]:
    """What a peak is cached by: host name, hardware name, torch version, torch's threads on a CPU,
    and the units that decide the peak beyond the name (units)."""
    import torch

    from pipeline.training.device import hardware_name

    threads = torch.get_num_threads() if device.type == "cpu" else None
    return socket.gethostname(), hardware_name(device), torch.__version__, threads, units(device)


def units(device: torch.device, cpuinfo: str | None = None) -> str:
    """What decides `device`'s peak beyond its name: a CPU's vector and matrix extensions (the flags
    _FP32_PER_CYCLE and _BF16_PER_CYCLE read, from /proc/cpuinfo or `cpuinfo`), a CUDA GPU's memory
    (one name is sold with several); '' where there is nothing to read."""
    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_properties(device).total_memory / 2**30:.0f} GiB"
    if device.type != "cpu":
        return ""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            return ""
    flags = _cpuinfo_fields(cpuinfo)["flags"]
    return " ".join(flag for flag, _ in (*reversed(_FP32_PER_CYCLE), *reversed(_BF16_PER_CYCLE)) if flag in flags)


def _read(path: Path) -> dict[str, Any]:
    """The cache file's peaks by key; {} when there is none, it cannot be read or it is another format."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(content, dict) or content.get("format") != FORMAT or not isinstance(content.get("peaks"), dict):
        return {}
    peaks: dict[str, Any] = content["peaks"]
    return peaks


def cached(device: torch.device) -> Peak | None:
    """The cached peak of `device` on this host, hardware and units, torch version (and CPU threads), if any."""
    entry = _read(cache_file()).get(cache_key(*identity(device)))
    if not isinstance(entry, dict):
        return None
    try:
        return Peak(**{**entry, "device": str(device)})
    except TypeError:  # an entry written by another version of this module
        return None


def _store(peak: Peak) -> str:
    """Add `peak` to the cache file (atomically: a reader never sees half a file); '' or why not."""
    path = cache_file()
    peaks = _read(path)
    peaks[peak.key] = asdict(peak)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"format": FORMAT, "peaks": peaks}, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        return f"could not write {path}: {exc.strerror or exc}"
    return ""


def find(device: torch.device, remeasure: bool = False) -> Found:
    """`device`'s peak for `pipeline devices --peak`: the cached one, else (or with `remeasure`)
    measured now and cached, unless the machine was too busy for it to stand (Peak.busy): then it
    is not cached, and says why."""
    if not remeasure and (peak := cached(device)) is not None:
        return Found(peak, reused=True, cache=cache_file())
    peak = measure(device)
    if peak.busy:
        why = f"{peak.busy}; measure again when it is quieter"
        return Found(peak, reused=False, cache=cache_file(), cache_error=why)
    return Found(peak, reused=False, cache=cache_file(), cache_error=_store(peak))


def not_measured(device: torch.device) -> str:
    """Why a run on `device` has no mfu when the cache has no peak for it: which key to measure, and how."""
    host, hardware, version, threads, extensions = identity(device)
    on = f"{hardware} ({extensions})" if extensions else hardware
    with_threads = f" with {threads} torch threads" if threads is not None else ""
    fix = f"OMP_NUM_THREADS={threads} pipeline devices --peak" if threads is not None else "pipeline devices --peak"
    return (
        f"no mfu: no peak measured for {on}{with_threads}, torch {version}, on {host}; `{fix}` "
        "measures it (a few seconds), and later runs use it"
    )


def precisions(device: torch.device) -> list[str]:
    """The precisions measured on `device`: fp32 everywhere, bf16 where the device has it (on a CPU
    without bf16 arithmetic torch emulates it, slowly: measured all the same, it is what a bf16 run
    there gets), fp16 on GPUs (the pipeline trains fp16 on GPUs only)."""
    import torch

    if device.type == "cuda":
        return ["fp32", *(["bf16"] if torch.cuda.is_bf16_supported() else []), "fp16"]
    if device.type == "mps":
        return ["fp32", "fp16"]
    return ["fp32", "bf16"]


def _sync(device: torch.device) -> Callable[[], None]:
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return lambda: torch.mps.synchronize()
    return lambda: None


def _fastest(call: Callable[[], object], sync: Callable[[], None]) -> float:
    """The shortest time of `call` over at least MIN_CALLS calls and about BUDGET_S seconds."""
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < MIN_CALLS or time.perf_counter() - started < BUDGET_S:
        before = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - before)
    return min(times)


def _matmul(device: torch.device, precision: str) -> tuple[float, int]:
    """FLOP/s of the fastest square matrix multiplication at `precision`, and the side it took. The
    side doubles from 256 while one call takes under CALL_S, or while doubling still raised the rate
    by a tenth and a call takes under LONGEST_CALL_S (up to MAX_SIDE): a slow precision (bf16
    emulated on a CPU, as fast at 256 as at 1024) stays short, and a fast device gets matrices big
    enough to fill it."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    sync, side, largest = _sync(device), 256, MAX_SIDE.get(device.type, 4096)
    rate = 0.0
    while True:  # made on the device: a 16384-square matrix drawn on a CPU would take seconds
        a = torch.randn(side, side, device=device, dtype=dtype)
        b = torch.randn(side, side, device=device, dtype=dtype)
        out = torch.empty(side, side, device=device, dtype=dtype)
        torch.mm(a, b, out=out)  # the first call pays for choosing and loading the kernel
        sync()
        before = time.perf_counter()
        torch.mm(a, b, out=out)
        sync()
        seconds = time.perf_counter() - before
        rate, previous = 2 * side**3 / seconds, rate
        rising = previous > 0 and rate > 1.1 * previous and seconds < LONGEST_CALL_S
        if side >= largest or (seconds >= CALL_S and not rising):
            break
        side *= 2
    seconds = _fastest(lambda: torch.mm(a, b, out=out), sync)
    return 2 * side**3 / seconds, side


def _copy(device: torch.device) -> float:
    """Bytes per second of the fastest copy of a large buffer on `device`, read and write counted."""
    import torch

    size = COPY_BYTES.get(device.type, 64 * 2**20)
    source = torch.ones(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    sync = _sync(device)
    target.copy_(source)
    sync()
    return 2 * size / _fastest(lambda: target.copy_(source), sync)


def measure(device: torch.device) -> Peak:
    """Measure `device`'s peaks now: a matrix multiplication at each of its precisions, and a copy."""
    import torch

    host, hardware, version, threads, vector_units = identity(device)
    started, cpu = time.perf_counter(), contention.sample()
    matmul, sides = {}, {}
    with torch.no_grad():
        for precision in precisions(device):
            matmul[precision], sides[precision] = _matmul(device, precision)
        copy = _copy(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the measurement's buffers are no run's
    return Peak(
        device=str(device),
        hardware=hardware,
        host=host,
        torch_version=version,
        threads=threads,
        matmul=matmul,
        matmul_side=sides,
        copy_bytes_per_s=copy,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        seconds=round(time.perf_counter() - started, 2),
        others_share=round(contention.since(cpu).others_share, 3),
        units=vector_units,
    )


def nominal(hardware: str) -> Nominal | None:
    """The vendor's datasheet figures for a GPU this module knows by name, else None."""
    for name, figures in _NVIDIA:
        if name in hardware:
            return figures
    return None


def cpu_estimate(threads: int, cpuinfo: str | None = None) -> Nominal | None:
    """An estimate of a CPU's peak on `threads` threads (at most its physical cores): clock x cores x
    FLOPs per cycle from its vector width (_FP32_PER_CYCLE, _BF16_PER_CYCLE), read from /proc/cpuinfo
    (or `cpuinfo`); None where it lacks the clock or the flags. The clock is the "cpu MHz" it reports,
    which may be below the turbo clock the cores reach: an estimate, labelled as one."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            return None
    fields = _cpuinfo_fields(cpuinfo)
    if not fields["mhz"] or not fields["flags"]:
        return None
    hz = max(fields["mhz"]) * 1e6
    cores = min(threads, fields["cores"] or threads)
    flags = fields["flags"]
    fp32 = next((per for flag, per in _FP32_PER_CYCLE if flag in flags), None)
    if fp32 is None:
        return None
    width = next(flag for flag, per in _FP32_PER_CYCLE if per == fp32)
    matmul = {"fp32": hz * cores * fp32}
    if (bf16 := next((per for flag, per in _BF16_PER_CYCLE if flag in flags), None)) is not None:
        matmul["bf16"] = hz * cores * bf16
    label = f"estimate: {hz / 1e9:.2f} GHz x {cores} cores x {fp32} fp32 FLOPs/cycle ({width})"
    return Nominal(label, matmul, None, estimate=True)


def _cpuinfo_fields(text: str) -> dict[str, Any]:
    """From /proc/cpuinfo's text: each processor's "cpu MHz", the flags, and the physical cores
    (distinct physical id and core id pairs; 0 where they are not listed)."""
    mhz: list[float] = []
    flags: set[str] = set()
    cores: set[tuple[str, str]] = set()
    for block in text.split("\n\n"):
        entry = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in block.splitlines())}
        if "cpu MHz" in entry:
            with contextlib.suppress(ValueError):  # a field a hypervisor left blank
                mhz.append(float(entry["cpu MHz"]))
        flags.update(entry.get("flags", "").split())
        if "core id" in entry:
            cores.add((entry.get("physical id", "0"), entry["core id"]))
    return {"mhz": [m for m in mhz if m > 0 and math.isfinite(m)], "flags": flags, "cores": len(cores)}


def reference(peak: Peak) -> Nominal | None:
    """The figures a measured peak is read against: the vendor's for a known GPU, an estimate for a CPU."""
    if peak.threads is not None:
        return cpu_estimate(peak.threads)
    return nominal(peak.hardware)


def share(peak: Peak, precision: str, achieved_flops: float) -> Share:
    """A run's MFU: `achieved_flops` over `peak`'s matmul peak at `precision`. Where the run was
    faster than the peak, or the precision was not measured, there is no mfu, and the note says why:
    never a value clamped to 1."""
    top = peak.matmul.get(precision)
    if top is None:
        return Share(None, None, f"no mfu: {precision} matmul was not measured on {peak.hardware}")
    where = f"{precision} matmul peak {top / TERA:.4g} TFLOP/s measured {peak.measured_at} on {peak.hardware}" + (
        f", {peak.threads} torch threads" if peak.threads else ""
    )
    if achieved_flops > top:
        return Share(
            None,
            top,
            f"no mfu: the run's {achieved_flops / TERA:.4g} TFLOP/s is above the {where}; "
            "the peak measurement is in doubt (`pipeline devices --peak --remeasure` on a quiet "
            "machine)",
        )
    return Share(achieved_flops / top, top, where)


def copy_share(peak: Peak, bytes_per_epoch: int, epoch_s: float, compiled: bool) -> Bandwidth:
    """A run's bandwidth share: `bytes_per_epoch` (the eager count, flops.epoch_bytes) over `epoch_s`
    seconds, over `peak`'s measured copy bandwidth. Told only on a CUDA GPU, for a run that was not
    compiled, and never above 1: where the counted bytes came faster than the memory can copy, caches
    served part of them and the count is no measure of the traffic. Elsewhere there is no share, and
    the note says why: never a value clamped to 1. The bandwidth is returned in every case: the
    roofline's slope for the device."""
    copy = peak.copy_bytes_per_s
    kind = peak.device.partition(":")[0]
    where = f"copy bandwidth {copy / 1e9:,.1f} GB/s measured {peak.measured_at} on {peak.hardware}"
    if kind != "cuda":
        return Bandwidth(
            None,
            copy,
            f"no bandwidth_share on {kind}: the bytes are counted as if no cache kept anything between "
            "kernels, and here a batch's activations stay in the caches, so the count says nothing about "
            f"what the memory carried ({where})",
        )
    if compiled:
        return Bandwidth(
            None,
            copy,
            "no bandwidth_share: compiled, the step fuses operations and moves fewer bytes than the eager "
            f"count ({where})",
        )
    rate = bytes_per_epoch / epoch_s
    if rate > copy:
        return Bandwidth(
            None,
            copy,
            f"no bandwidth_share: the eager count's {rate / 1e9:,.1f} GB/s is above the {where}: caches "
            "served part of it, so the count is no measure of the memory's traffic",
        )
    return Bandwidth(rate / copy, copy, f"{where}; bytes: the eager step's count, an upper bound")
