"""Peaks measured: `pipeline devices --peak` on the CPU through the real CLI, its cache file, the
vendor table and the CPU estimate, and an MFU that is never clamped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest
import torch

from conftest import invoke
from pipeline.measures import contention
from pipeline.training import peak

# Two logical CPUs on one core (SMT) and one on another, as /proc/cpuinfo lists them.
CPUINFO = """processor\t: 0
model name\t: Some CPU
cpu MHz\t\t: 3000.000
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512_bf16

processor\t: 1
cpu MHz\t\t: 2000.000
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512_bf16

processor\t: 2
cpu MHz\t\t: 3000.000
physical id\t: 0
core id\t\t: 1
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512_bf16
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of this test's own: the first measurement here is made here."""
    monkeypatch.setenv(peak.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / peak.CACHE_NAME


def _entries(path) -> dict:
    return json.loads(path.read_text())["peaks"]


def test_devices_peak_measures_caches_and_then_reuses(cache):
    first = invoke("devices", "--peak")
    assert first.exit_code == 0, first.output
    assert "measured now in" in first.output and str(cache) in " ".join(first.output.split())
    ((key, entry),) = _entries(cache).items()
    assert key == peak.cache_key(
        entry["host"], entry["hardware"], torch.__version__, torch.get_num_threads(), entry["units"]
    )
    assert set(entry["matmul"]) == {"fp32", "bf16"} and all(v > 0 for v in entry["matmul"].values())
    assert entry["copy_bytes_per_s"] > 0 and entry["torch_version"] == torch.__version__
    assert "fp32 matmul TFLOP/s" in first.output and "copy GB/s" in first.output

    written = cache.read_text()
    second = invoke("devices", "--peak")
    assert second.exit_code == 0, second.output
    said = " ".join(second.output.split())
    assert f"reused the peaks measured {entry['measured_at']}" in said and "--remeasure measures again" in said
    assert "measured now" not in said
    assert cache.read_text() == written  # read, not written again

    again = invoke("devices", "--peak", "--remeasure")
    assert again.exit_code == 0, again.output
    assert "measured now in" in again.output
    (remeasured,) = _entries(cache).values()
    assert remeasured["seconds"] > 0 and remeasured["measured_at"] >= entry["measured_at"]


def test_devices_without_peak_measures_nothing(cache):
    out = invoke("devices")
    assert out.exit_code == 0, out.output
    assert "matmul" not in out.output and not cache.exists()


def test_remeasure_without_peak_is_a_usage_error():
    out = invoke("devices", "--remeasure")
    assert out.exit_code == 2 and "--remeasure goes with --peak" in out.output


def test_the_cpus_measured_matmul_peak_is_within_2x_of_its_estimate(cache):
    threads = torch.get_num_threads()
    estimate = peak.cpu_estimate(threads)
    if estimate is None:
        pytest.skip("/proc/cpuinfo gives no clock (cpu MHz) or no vector flags: nothing to estimate from")
    cores = len(os.sched_getaffinity(0))
    if os.getloadavg()[0] > 1.5 * cores:
        pytest.skip(
            f"the machine is busy (load {os.getloadavg()[0]:.1f} on {cores} cores): a peak measured now "
            "says nothing about the CPU"
        )
    found = peak.find(torch.device("cpu"))
    measured, expected = found.peak.matmul["fp32"], estimate.matmul["fp32"]
    assert expected / 2 <= measured <= expected * 2, (measured, expected, estimate.label)


def test_the_cpu_estimate_counts_physical_cores_clock_and_vector_width():
    estimate = peak.cpu_estimate(8, CPUINFO)
    # 2 physical cores (8 threads asked), the highest clock, AVX-512: 2 FMA units x 16 lanes x 2.
    assert estimate.matmul["fp32"] == 3.0e9 * 2 * 64
    assert estimate.matmul["bf16"] == 3.0e9 * 2 * 128
    assert estimate.estimate and estimate.label.startswith("estimate: 3.00 GHz x 2 cores x 64")
    assert peak.cpu_estimate(1, CPUINFO).matmul["fp32"] == 3.0e9 * 64
    avx2 = CPUINFO.replace(" avx512f avx512_bf16", "")
    assert peak.cpu_estimate(2, avx2).matmul == {"fp32": 3.0e9 * 2 * 32}  # bf16 emulated: no estimate
    assert peak.cpu_estimate(2, CPUINFO.replace("cpu MHz", "cpu speed")) is None


def test_known_gpus_get_their_datasheet_figures():
    assert peak.nominal("NVIDIA H200").matmul["fp32"] == 67e12
    assert peak.nominal("NVIDIA H100 PCIe").label.startswith("NVIDIA H100 PCIe")
    assert peak.nominal("NVIDIA H100 80GB HBM3").label.startswith("NVIDIA H100 SXM")
    assert "bf16" not in peak.nominal("Tesla T4").matmul
    assert peak.nominal("Some Other GPU") is None


def _fake(cache, fp32: float, units: str | None = None) -> None:
    """A cached CPU peak of `fp32` FLOP/s for this host (or for other vector `units`), as if
    measured on a very busy machine."""
    host, hardware, version, threads, own_units = peak.identity(torch.device("cpu"))
    units = own_units if units is None else units
    entry = peak.Peak(
        "cpu",
        hardware,
        host,
        version,
        threads,
        {"fp32": fp32, "bf16": fp32},
        {"fp32": 256, "bf16": 256},
        1.0,
        "2026-01-01T00:00:00+00:00",
        1.0,
        units=units,
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"format": peak.FORMAT, "peaks": {entry.key: entry.__dict__}}))


def test_one_cpu_name_with_other_vector_units_is_another_peak(cache):
    """Two machines sold under one CPU name, one with AVX-512 and one with AVX2 only, never share a
    peak: the cache key names the units (a peak cached for other units is measured over)."""
    avx2 = CPUINFO.replace(" avx512f avx512_bf16", "")
    assert peak.units(torch.device("cpu"), CPUINFO) == "sse2 avx avx2 avx512f avx512_bf16"
    assert peak.units(torch.device("cpu"), avx2) == "sse2 avx avx2"
    host, hardware, version, threads, units = peak.identity(torch.device("cpu"))
    assert peak.cache_key(host, hardware, version, threads, "sse2 avx avx2") != peak.cache_key(
        host, hardware, version, threads, "sse2 avx avx2 avx512f"
    )
    _fake(cache, fp32=1e12, units="another machine's units")
    assert peak.cached(torch.device("cpu")) is None
    _fake(cache, fp32=1e12)
    assert peak.cached(torch.device("cpu")).matmul["fp32"] == 1e12


def test_an_mfu_above_1_is_never_clamped_nor_measured_over(cache):
    _fake(cache, fp32=1e6)  # 1 MFLOP/s: far below any CPU
    before = cache.read_text()
    share = peak.share(peak.cached(torch.device("cpu")), "fp32", 1e8)
    assert share.mfu is None and share.peak_flops == 1e6
    assert share.note.startswith("no mfu: the run's 0.0001 TFLOP/s is above the fp32 matmul peak")
    assert share.note.endswith("(`pipeline devices --peak --remeasure` on a quiet machine)")
    assert cache.read_text() == before  # a run reads the cache; only devices --peak measures
    good = peak.share(peak.cached(torch.device("cpu")), "fp32", 5e5)
    assert good.mfu == 0.5 and good.note.startswith("fp32 matmul peak 1e-06 TFLOP/s measured 2026-01-01")
    assert peak.share(_gpu_peak(1e12), "fp16", 1e6).note.startswith("no mfu: fp16 matmul was not measured")


def _spin_elsewhere() -> psutil.Process:
    """A process that spins on a core and is not this one's descendant (contention counts a
    process's own children as its own work): started by a child that exits at once."""
    # The spinner's output goes nowhere: holding the pipe open, it would keep run() waiting.
    code = (
        "import subprocess, sys; d = subprocess.DEVNULL; "
        "print(subprocess.Popen([sys.executable, '-c', 'while True: pass'], stdin=d, stdout=d, stderr=d).pid)"
    )
    pid = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    return psutil.Process(pid)


def test_a_peak_measured_on_a_busy_machine_is_never_cached(cache, monkeypatch):
    """Another process spins on a core while the peak is measured: `devices --peak` prints the peak
    and why it is not cached, and nothing is cached, so that no run divides by it and the next
    measurement, on a quiet machine, is the one kept."""
    # One spinning process takes about one core of the machine's: a threshold well below that share.
    monkeypatch.setenv(contention.SHARE_VARIABLE, str(0.3 / (psutil.cpu_count() or 1)))
    spinner = _spin_elsewhere()
    try:
        out = invoke("devices", "--peak")
    finally:
        spinner.kill()
    assert out.exit_code == 0, out.output
    said = " ".join(out.output.split())
    assert "not cached: measured while other processes took" in said and "measure again when it is quieter" in said
    assert "fp32 matmul TFLOP/s" in said
    assert not cache.exists() and peak.cached(torch.device("cpu")) is None

    monkeypatch.setenv(contention.SHARE_VARIABLE, "1")  # quiet enough, whatever the machine does
    found = peak.find(torch.device("cpu"))
    assert not found.reused and not found.cache_error and len(_entries(cache)) == 1


def test_a_cache_file_of_another_format_is_measured_over(cache):
    cache.parent.mkdir(parents=True)
    cache.write_text('{"format": 0, "peaks": {"x": 1}}')
    found = peak.find(torch.device("cpu"))
    assert not found.reused and json.loads(cache.read_text())["format"] == peak.FORMAT
    cache.write_text("not json")
    assert not peak.find(torch.device("cpu")).reused


def _gpu_peak(copy_bytes_per_s: float) -> peak.Peak:
    """A CUDA GPU's peaks as `pipeline devices --peak` would have cached them there."""
    return peak.Peak(
        "cuda:0",
        "NVIDIA H200",
        "gpu-host",
        torch.__version__,
        None,
        {"fp32": 50e12},
        {"fp32": 16384},
        copy_bytes_per_s,
        "2026-01-01T00:00:00+00:00",
        1.0,
    )


def test_a_bandwidth_share_is_told_on_cuda_eager_and_never_above_1():
    gpu = _gpu_peak(4e12)  # 4 TB/s
    eager = peak.copy_share(gpu, bytes_per_epoch=10**12, epoch_s=1.0, compiled=False)  # 1 TB/s counted
    assert eager.share == pytest.approx(0.25) and eager.copy_bytes_per_s == 4e12
    assert eager.note.startswith("copy bandwidth 4,000.0 GB/s measured 2026-01-01T00:00:00+00:00 on NVIDIA H200")
    # Counted bytes faster than the memory copies: caches served them; no share, and why.
    cached = peak.copy_share(gpu, bytes_per_epoch=8 * 10**12, epoch_s=1.0, compiled=False)
    assert cached.share is None and cached.copy_bytes_per_s == 4e12
    assert cached.note.startswith("no bandwidth_share: the eager count's 8,000.0 GB/s is above the copy bandwidth")
    compiled = peak.copy_share(gpu, bytes_per_epoch=10**12, epoch_s=1.0, compiled=True)
    assert compiled.share is None and compiled.note.startswith("no bandwidth_share: compiled, the step fuses")


def test_no_bandwidth_share_on_the_cpu_whatever_the_figures(cache):
    found = peak.find(torch.device("cpu")).peak
    measured = peak.copy_share(found, bytes_per_epoch=1, epoch_s=1.0, compiled=False)
    assert measured.share is None and measured.copy_bytes_per_s == found.copy_bytes_per_s
    assert measured.note.startswith("no bandwidth_share on cpu: the bytes are counted as if no cache kept anything")
