"""The CUDA paths on a real GPU. Skipped without CUDA; `benchmarks/gpu_check.sh` runs them on a lent
GPU machine, which has torch and pytest but no mlflow: nothing here may need a tracking store."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

from pipeline.settings.config import RunConfig
from pipeline.training.data import load
from pipeline.training.device import PeakMemory, resolve
from pipeline.training.train import Hooks, _normalise, _warm_up, fit

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_cuda_matches_cpu(data_dir):
    dataset = load(data_dir)
    config = RunConfig(batch_size=64, epochs=2, seed=1)
    cpu = fit(config, dataset, torch.device("cpu"))
    gpu = fit(config, dataset, resolve("cuda"))
    assert next(gpu.model.parameters()).device.type == "cuda"
    assert gpu.final.test_accuracy == pytest.approx(cpu.final.test_accuracy, abs=0.05)


def test_cuda_time_buckets_fit_in_the_epoch(data_dir):
    """transfer and compute are GPU times from events; data is the rest of the epoch."""
    result = fit(RunConfig(batch_size=32, epochs=2, num_workers=1), load(data_dir), resolve("cuda"))
    for stats in result.epochs:
        assert stats.transfer_time_s > 0 and stats.compute_time_s > 0 and stats.data_time_s >= 0
        assert stats.transfer_time_s + stats.compute_time_s <= stats.epoch_duration_s
        assert 0 < stats.enqueue_time_s <= stats.epoch_duration_s
        assert stats.peak_memory_mb is not None and stats.peak_memory_mb > 0


def test_resume_on_cuda_continues_where_it_stopped(data_dir, tmp_path):
    """The checkpoint loads on the CPU (generator state stays a CPU ByteTensor) and the run goes on."""
    from pipeline.execution.point import _load_checkpoint

    path, dataset, device = tmp_path / "point.pt", load(data_dir), resolve("cuda")

    class Save(Hooks):
        checkpointing = True

        def save_state(self, state):
            torch.save(state, path)

    fit(RunConfig(batch_size=128, epochs=1, seed=2), dataset, device, Save())
    resumed = fit(RunConfig(batch_size=128, epochs=2, seed=2), dataset, device, resume=_load_checkpoint(path))
    straight = fit(RunConfig(batch_size=128, epochs=2, seed=2), dataset, device)
    assert [e.epoch for e in resumed.epochs] == [1, 2]
    assert resumed.final.train_loss == pytest.approx(straight.final.train_loss, rel=1e-3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_n_is_timed_on_its_own_device(data_dir):
    """Events on cuda:1 are recorded on cuda:1's stream; the current device is restored after."""
    before = torch.cuda.current_device()
    result = fit(RunConfig(batch_size=64), load(data_dir), torch.device("cuda", 1))
    assert next(result.model.parameters()).device == torch.device("cuda", 1)
    assert result.final.compute_time_s > 0 and torch.cuda.current_device() == before


def test_warm_up_leaves_the_model_and_streams_untouched(data_dir):
    from pipeline.model import Network

    device = resolve("cuda")
    torch.manual_seed(0)
    model = Network().to(device)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.cuda.get_rng_state(device), torch.get_rng_state()
    seconds = _warm_up(model, RunConfig(batch_size=256), load(data_dir), device)
    assert seconds > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng[0], torch.cuda.get_rng_state(device)) and torch.equal(rng[1], torch.get_rng_state())


def test_out_of_memory_fails_the_run_and_the_next_one_trains(data_dir):
    """After the exception is gone, the failed run's model and activations are released."""
    from pipeline.execution.point import _failure_reason, _free_device_memory

    device, dataset = resolve("cuda"), load(data_dir)
    baseline = torch.cuda.memory_allocated(device)
    torch.cuda.set_per_process_memory_fraction(0.0001, device)
    try:
        with pytest.raises(torch.OutOfMemoryError) as caught:
            fit(RunConfig(batch_size=512), dataset, device)
        reason = _failure_reason(caught.value, 512)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    del caught
    _free_device_memory(device)
    assert reason.startswith("CUDA out of memory at batch_size 512")
    assert torch.cuda.memory_allocated(device) == baseline
    assert fit(RunConfig(batch_size=64), dataset, device).final.test_accuracy > 0


def test_normalising_on_cuda_launches_one_kernel():
    from torch.profiler import ProfilerActivity, profile

    images = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8, device="cuda")
    _normalise(images)  # load the kernel outside the profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out = _normalise(images)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum(e.count for e in kernels) == 1, [(e.key, e.count) for e in kernels]
    # CUDA divides by a scalar as a multiplication by its reciprocal: equal up to float32 rounding
    torch.testing.assert_close(out.cpu(), images.cpu().float() / 255)


def test_peak_memory_on_cuda_is_what_torch_allocated():
    device = resolve("cuda")
    memory = PeakMemory(device)
    memory.start()
    block = torch.ones(64 * 2**20 // 4, device=device)
    del block
    gc.collect()
    assert 64 <= memory.read() < 1024


def test_the_cuda_graph_step_learns_what_the_eager_step_learns(data_dir):
    """Replayed from a graph, with the last (smaller) batch taken eagerly: the same training, so the
    same losses up to cuDNN's run-to-run differences; the capture is its own one-off cost. No
    warning either: the eager last batch once met gradient nodes the capture kept alive on its
    side stream (torch warned of a stream mismatch and synchronised)."""
    dataset, device = load(data_dir), resolve("cuda")
    config = RunConfig(batch_size=100, epochs=2, seed=3)  # 512 examples: 5 full batches and one of 12
    eager = fit(config, dataset, device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = fit(RunConfig(batch_size=100, epochs=2, seed=3, cuda_graph=True), dataset, device)
    for a, b in zip(eager.epochs, graph.epochs):
        assert b.train_loss == pytest.approx(a.train_loss, rel=1e-3)
        assert b.test_accuracy == pytest.approx(a.test_accuracy, abs=0.01)
    assert graph.one_off["capture_s"] > 0 and "capture_s" not in eager.one_off


def test_prefetch_on_cuda_learns_what_the_dataloader_path_learns(data_dir):
    """Pinned rotating buffers copied ahead on a side stream, alone and feeding a CUDA graph: the
    same batches, so the same losses up to cuDNN's run-to-run differences; the wait for the copy
    (the exposed transfer) fits in the epoch."""
    dataset, device = load(data_dir), resolve("cuda")
    plain = fit(RunConfig(batch_size=100, epochs=2, seed=3), dataset, device)
    for extra in ({}, {"cuda_graph": True}):
        prefetched = fit(RunConfig(batch_size=100, epochs=2, seed=3, prefetch=True, **extra), dataset, device)
        for a, b in zip(plain.epochs, prefetched.epochs):
            assert b.train_loss == pytest.approx(a.train_loss, rel=1e-3)
            assert 0 <= b.transfer_time_s + b.compute_time_s <= b.epoch_duration_s


def test_fp16_trains_with_a_gradient_scaler(data_dir):
    dataset, device = load(data_dir), resolve("cuda")
    fp32 = fit(RunConfig(batch_size=64, epochs=2, seed=1), dataset, device)
    fp16 = fit(RunConfig(batch_size=64, epochs=2, seed=1, precision="fp16"), dataset, device)
    assert next(fp16.model.parameters()).dtype == torch.float32
    assert fp16.final.test_accuracy == pytest.approx(fp32.final.test_accuracy, abs=0.05)


def test_nvml_counts_the_energy_of_a_busy_gpu():
    from pipeline.training import energy

    meter = energy.EnergyMeter(torch.device("cuda", 0))
    assert meter.why_not == ""
    meter.start()
    x = torch.randn(8192, 8192, device="cuda")
    for _ in range(50):
        x = x @ x / 8192
    torch.cuda.synchronize()
    assert meter.joules() > 0


def test_compile_on_cuda_compiles_in_the_warm_up_and_learns_like_eager(data_dir):
    """Triton kernels for every shape the run sees are built before epoch 1 (nothing compiles in
    the epochs), and the compiled run learns what the eager one learns."""
    dataset, device = load(data_dir), resolve("cuda")

    class NoCompilingInTheEpochs(Hooks):  # any compiling from epoch 1 on raises
        def before_training(self, one_off):
            torch.compiler.set_stance("fail_on_recompile")

    try:
        compiled = fit(
            RunConfig(batch_size=100, epochs=2, seed=1, compile=True), dataset, device, NoCompilingInTheEpochs()
        )
    finally:
        torch.compiler.set_stance("default")
    assert compiled.one_off["compile_s"] > 0
    eager = fit(RunConfig(batch_size=100, epochs=2, seed=1), dataset, device)
    assert compiled.final.test_accuracy == pytest.approx(eager.final.test_accuracy, abs=0.05)


def test_the_gpus_measured_peaks_are_within_2x_of_its_datasheet(tmp_path, monkeypatch):
    """`pipeline devices --peak`'s measurement on a real card: each matmul precision and the copy
    bandwidth within 2x of the datasheet's figures (no higher than them, give or take a tenth)."""
    from pipeline.training import peak

    monkeypatch.setenv(peak.CACHE_ENV, str(tmp_path))
    found = peak.find(resolve("cuda"))
    assert not found.reused and (tmp_path / peak.CACHE_NAME).exists()
    assert set(found.peak.matmul) == set(peak.precisions(resolve("cuda")))
    nominal = peak.nominal(found.peak.hardware)
    if nominal is None:
        pytest.skip(f"{found.peak.hardware} is not in peak.py's datasheet table")
    for precision, flops in found.peak.matmul.items():
        if (expected := nominal.matmul.get(precision)) is not None:
            assert expected / 2 <= flops <= expected * 1.1, (precision, flops, expected)
    assert nominal.copy_bytes_per_s / 2 <= found.peak.copy_bytes_per_s <= nominal.copy_bytes_per_s * 1.1


def test_a_cuda_runs_mfu_is_a_share_of_the_measured_peak(data_dir, tmp_path, monkeypatch):
    """What point._utilisation logs for a cuda run, without a tracking store: the epoch's FLOPs over
    its steady epoch, over the card's measured fp32 matmul peak, in (0, 1]."""
    from pipeline.measures.timing import steady_median
    from pipeline.training import flops, peak

    monkeypatch.setenv(peak.CACHE_ENV, str(tmp_path))
    dataset, device = load(data_dir), resolve("cuda")
    result = fit(RunConfig(batch_size=128, epochs=3), dataset, device)
    per_epoch = flops.epoch_flops(len(dataset.train), 128)
    achieved = flops.achieved_flops(per_epoch, steady_median([e.epoch_duration_s for e in result.epochs]))
    share = peak.share(peak.find(device).peak, "fp32", achieved)  # as `devices --peak` measures it
    assert share.mfu is not None and 0 < share.mfu <= 1, share.note
    assert share.note.startswith("fp32 matmul peak ")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_byte_count_under_cpu_autocast_is_cudas(precision):
    """flops.step_bytes traces a half-precision step under the CPU's autocast (it has no meta device):
    the same step traced on CUDA tensors under CUDA's autocast moves the same bytes."""
    import torch.nn.functional as F
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    from pipeline.model import Network
    from pipeline.training import flops
    from pipeline.training.train import autocast

    device = resolve("cuda")
    model = Network().to(device)
    names = [name for name, _ in model.named_parameters()]

    def step(images, labels, *weights):
        with autocast(device, precision):
            logits = functional_call(model, dict(zip(names, weights)), (torch.div(images, 255),))
            loss = F.cross_entropy(logits, labels)
        return tuple(torch.autograd.grad(loss, weights))

    images = torch.empty(100, 1, 28, 28, dtype=torch.uint8, device=device)
    labels = torch.empty(100, dtype=torch.long, device=device)
    traced = make_fx(step, tracing_mode="fake")(images, labels, *model.parameters())
    assert flops.graph_bytes(traced) == flops.step_bytes(100, precision)


def test_a_cuda_runs_bandwidth_share_is_at_most_1_or_says_why_not(data_dir, tmp_path, monkeypatch):
    """What point._utilisation logs for an eager cuda run: its counted bytes per second over the card's
    measured copy bandwidth, in (0, 1], or no share where the count came faster than the memory copies."""
    from pipeline.measures.timing import steady_median
    from pipeline.training import flops, peak

    monkeypatch.setenv(peak.CACHE_ENV, str(tmp_path))
    dataset, device = load(data_dir), resolve("cuda")
    result = fit(RunConfig(batch_size=1000, epochs=3), dataset, device)
    moved = flops.epoch_bytes(len(dataset.train), 1000)
    epoch_s = steady_median([e.epoch_duration_s for e in result.epochs])
    bandwidth = peak.copy_share(peak.find(device).peak, moved, epoch_s, compiled=False)
    assert bandwidth.copy_bytes_per_s is not None and bandwidth.copy_bytes_per_s > 0
    if bandwidth.share is None:
        assert bandwidth.note.startswith("no bandwidth_share: the eager count's"), bandwidth.note
        assert moved / epoch_s > bandwidth.copy_bytes_per_s
    else:
        assert 0 < bandwidth.share <= 1 and bandwidth.note.startswith("copy bandwidth "), bandwidth.note
