"""Devices: resolve a grid's device name once per run, say why one is missing, describe hardware.

The device decides where tensors live and how they get there (pinned memory, non_blocking copies),
never what is computed.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from functools import lru_cache

import torch


class DeviceUnavailable(Exception):
    """The requested device does not exist on this machine; the message says why."""


def cuda_missing_reason() -> str:
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) was built without CUDA"
    return (
        f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, "
        "but no NVIDIA GPU or driver is visible (torch.cuda.is_available() is False)"
    )


def resolve(name: str) -> torch.device:
    """Turn cpu / cuda / cuda:N / mps / auto into a torch.device, or raise DeviceUnavailable."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceUnavailable("mps is not available (needs Apple silicon and a torch built with MPS)")
        return torch.device("mps")
    device = torch.device(name)  # cuda or cuda:N (syntax checked by config)
    if not torch.cuda.is_available():
        raise DeviceUnavailable(f"{name} is not available: {cuda_missing_reason()}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceUnavailable(
            f"{name} is not available: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}"
        )
    return torch.device("cuda", index)


@lru_cache(maxsize=1)
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def precision_missing(device: torch.device, precision: str) -> str:
    """Why `device` cannot train at `precision` ('' when it can)."""
    if precision == "fp16" and device.type == "cpu":
        return "precision fp16 is for GPUs (the CPU has no fast fp16 arithmetic); use bf16 or fp32 on the CPU"
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return f"precision bf16: {torch.cuda.get_device_name(device)} has no bf16 arithmetic; use fp16 or fp32"
    return ""


def compile_missing(device: torch.device) -> str:
    """Why torch.compile cannot build kernels for `device` ('' when it can), told before training:
    its default backend compiles C++ with the system's compiler ($CXX, else a c++ on the PATH) on
    the CPU, and Triton kernels on CUDA. A failure these checks miss still fails only its own point
    (train.CompileFailed names the cause)."""
    if device.type == "cpu" and not _cxx_compiler():
        return "compile on the CPU needs a C++ compiler (apt-get install g++, or set $CXX), or set compile: false"
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "compile on CUDA needs Triton (pip install triton), or set compile: false"
    return ""


def _cxx_compiler() -> str | None:
    chosen = os.environ.get("CXX")
    if chosen:
        return shutil.which(chosen.split()[0])
    return next(filter(None, (shutil.which(name) for name in ("g++", "c++", "clang++"))), None)


def hardware_name(device: torch.device) -> str:
    """CPU model or GPU name: what a timing result was measured on."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple MPS ({platform.machine()})"
    return cpu_name()


def arithmetic_tags(device: torch.device) -> dict[str, str]:
    """What decides a cuda run's arithmetic and speed, and which physical GPU it was: cuDNN runs
    convolutions in TF32 by default while matmuls stay IEEE fp32, and benchmark/deterministic
    change which kernels run. The UUID names the card whatever CUDA_VISIBLE_DEVICES renumbered."""
    if device.type != "cuda":
        return {}
    return {
        "pipeline.gpu_uuid": str(torch.cuda.get_device_properties(device).uuid),
        "pipeline.cudnn_version": str(torch.backends.cudnn.version()),
        "pipeline.cudnn_tf32": str(torch.backends.cudnn.allow_tf32).lower(),
        "pipeline.matmul_tf32": str(torch.backends.cuda.matmul.allow_tf32).lower(),
        "pipeline.cudnn_benchmark": str(torch.backends.cudnn.benchmark).lower(),
        "pipeline.cudnn_deterministic": str(torch.backends.cudnn.deterministic).lower(),
    }


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # cpu, cuda:0, mps
    hardware: str
    detail: str  # threads or memory
    works: bool
    error: str = ""


def _smoke(device: torch.device) -> str:
    """A tiny tensor op on the device; returns '' when it works, else the error."""
    try:
        x = torch.arange(4.0, device=device)
        if float((x @ x).item()) != 14.0:
            return "wrong result from a 4-element dot product"
    except Exception as exc:  # any failure here is the answer the user asked for
        return f"{exc.__class__.__name__}: {exc}"
    return ""


def survey() -> tuple[list[DeviceInfo], list[str]]:
    """Every device this machine offers, each smoke-tested, plus notes on what is missing."""
    cpu = torch.device("cpu")
    threads = f"{torch.get_num_threads()} torch threads, {os.cpu_count()} logical CPUs"
    error = _smoke(cpu)
    devices = [DeviceInfo("cpu", cpu_name(), threads, not error, error)]
    notes = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            device = torch.device("cuda", index)
            props = torch.cuda.get_device_properties(index)
            detail = f"{props.total_memory / 2**30:.1f} GiB, compute capability {props.major}.{props.minor}"
            error = _smoke(device)
            devices.append(DeviceInfo(str(device), props.name, detail, not error, error))
    else:
        notes.append(f"cuda: {cuda_missing_reason()}")
    if torch.backends.mps.is_available():
        error = _smoke(torch.device("mps"))
        devices.append(DeviceInfo("mps", hardware_name(torch.device("mps")), "unified memory", not error, error))
    return devices, notes


class PeakMemory:
    """The peak memory footprint of one training pass (an epoch) on its device, in MiB, or None where
    it cannot be told. A footprint, not growth: what was already held when the pass began counts.

    cuda: the peak torch allocated for tensors (torch.cuda.max_memory_allocated), reset at start();
    the caching allocator's reserve and the CUDA context are not counted.
    cpu: this process's peak resident set during the pass: start() resets the kernel's high-water
    mark (writing 5 to /proc/self/clear_refs, Linux 4.0+) and read() is the high-water mark since
    (VmHWM). That is the whole process (the decoded data, the model, Python and torch themselves);
    DataLoader worker processes are not included. Exact, not sampled. Where the reset is refused or
    there is no /proc, the process-lifetime peak (getrusage's ru_maxrss), which includes earlier
    epochs and runs of the same process.
    mps and other devices: None.
    """

    def __init__(self, device: torch.device) -> None:
        self.device, self.per_pass = device, False

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.device.type == "cpu":
            try:
                with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
                    f.write("5")
                self.per_pass = True
            except OSError:
                self.per_pass = False

    def read(self) -> float | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.device.type != "cpu":
            return None
        if self.per_pass:
            try:
                return _proc_status_kib("VmHWM") / 1024
            except OSError:
                pass
        return _lifetime_peak_mib()


def _lifetime_peak_mib() -> float | None:
    """This process's peak resident set since it started (ru_maxrss: KiB on Linux, bytes on macOS)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")
