"""The training loop on the CPU, through the real data loader."""

from __future__ import annotations

import pytest
import torch

from pipeline.settings.config import RunConfig
from pipeline.training.data import PinnedPrefetch, batches, load
from pipeline.training.device import DeviceUnavailable, resolve
from pipeline.training.train import Diverged, Hooks, evaluate, fit


class Recorder(Hooks):
    def __init__(self):
        self.starts, self.steps, self.ends = [], 0, []

    def epoch_start(self, epoch, steps):
        self.starts.append((epoch, steps))

    def step(self):
        self.steps += 1

    def epoch_end(self, stats):
        self.ends.append(stats)


def test_fit_learns_and_reports_every_epoch(data_dir):
    dataset = load(data_dir)
    hooks = Recorder()
    result = fit(RunConfig(lr=0.01, batch_size=64, epochs=3, device="cpu"), dataset, torch.device("cpu"), hooks)
    assert hooks.starts == [(1, 8), (2, 8), (3, 8)] and hooks.steps == 24
    assert [s.epoch for s in hooks.ends] == [1, 2, 3] and result.epochs == hooks.ends
    assert result.final.test_accuracy > 0.8  # the synthetic classes are easy; chance is 0.1
    assert result.epochs[-1].train_loss < result.epochs[0].train_loss
    assert all(s.epoch_duration_s > 0 and s.images_per_s > 0 for s in result.epochs)
    assert result.duration_s >= sum(s.epoch_duration_s for s in result.epochs)
    loss, accuracy = evaluate(result.model, dataset.test, torch.device("cpu"))
    assert accuracy == pytest.approx(result.final.test_accuracy) and loss == pytest.approx(result.final.test_loss)


def test_same_seed_same_result_with_or_without_workers(data_dir):
    dataset = load(data_dir)
    runs = [fit(RunConfig(batch_size=128, num_workers=w, seed=5), dataset, torch.device("cpu")) for w in (0, 1, 0)]
    assert runs[0].final.train_loss == pytest.approx(runs[1].final.train_loss, rel=1e-5)
    assert runs[0].final.test_accuracy == runs[1].final.test_accuracy == runs[2].final.test_accuracy
    other = fit(RunConfig(batch_size=128, seed=6), dataset, torch.device("cpu"))
    assert other.final.train_loss != runs[0].final.train_loss


def test_divergence_is_an_error(data_dir):
    with pytest.raises(Diverged, match="diverged at epoch 1"):
        fit(RunConfig(lr=1e30, batch_size=64), load(data_dir), torch.device("cpu"))


def test_device_resolution_on_this_machine():
    assert resolve("cpu") == torch.device("cpu")
    assert resolve("auto").type in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailable, match="cuda is not available"):
            resolve("cuda")
    with pytest.raises(DeviceUnavailable, match=r"cuda:99 is not available"):
        resolve("cuda:99")


@pytest.mark.parametrize("num_workers", [0, 1])
def test_time_buckets_account_for_the_epoch(data_dir, num_workers):
    """data + transfer + compute must be within 15% of the epoch's duration."""
    result = fit(RunConfig(batch_size=32, epochs=2, num_workers=num_workers), load(data_dir), torch.device("cpu"))
    for stats in result.epochs:
        buckets = stats.data_time_s + stats.transfer_time_s + stats.compute_time_s
        assert min(stats.data_time_s, stats.transfer_time_s, stats.compute_time_s) >= 0
        assert stats.compute_time_s > 0 and stats.data_time_s > 0
        assert abs(buckets - stats.epoch_duration_s) <= 0.15 * stats.epoch_duration_s, stats


def test_cuda_runs_record_their_arithmetic(monkeypatch):
    """TF32 convolutions, cuDNN's choices and the physical GPU are tags of every cuda run."""
    from types import SimpleNamespace

    from pipeline.training.device import arithmetic_tags

    assert arithmetic_tags(torch.device("cpu")) == {}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(uuid="GPU-1234"))
    tags = arithmetic_tags(torch.device("cuda", 0))
    assert tags["pipeline.gpu_uuid"] == "GPU-1234"
    assert tags["pipeline.cudnn_tf32"] == str(torch.backends.cudnn.allow_tf32).lower()
    assert tags["pipeline.matmul_tf32"] == str(torch.backends.cuda.matmul.allow_tf32).lower()
    assert {"pipeline.cudnn_version", "pipeline.cudnn_benchmark", "pipeline.cudnn_deterministic"} <= set(tags)


class _Slow:
    """The loader, each batch handed over `delay` seconds late: time the clock must charge to data."""

    def __init__(self, loader, delay):
        self.loader, self.delay, self.sampler = loader, delay, loader.sampler

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        import time

        for batch in self.loader:
            time.sleep(self.delay)
            yield batch


def test_the_clock_charges_waiting_to_data_and_work_to_compute(data_dir, monkeypatch):
    """A broken clock (buckets swapped, a bucket never charged, one clock read for both) fails here:
    100 ms of waiting per batch must land in data, 100 ms of loss per step in compute. Only lower
    bounds: sleeps never take less, while a busy machine (a parallel test worker) can stretch
    anything else."""
    import time

    from pipeline.training import train

    real_batches, real_loss = train.batches, train.F.cross_entropy
    config, dataset, delay = RunConfig(batch_size=128, epochs=1), load(data_dir), 0.1
    injected = 0.75 * delay * -(-len(dataset.train) // config.batch_size)

    monkeypatch.setattr(train, "batches", lambda *a, **k: _Slow(real_batches(*a, **k), delay))
    (slow_data,) = fit(config, dataset, torch.device("cpu")).epochs
    monkeypatch.setattr(train, "batches", real_batches)

    def slow_loss(*args, **kwargs):
        time.sleep(delay)
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(train.F, "cross_entropy", slow_loss)
    (slow_compute,) = fit(config, dataset, torch.device("cpu")).epochs
    assert slow_data.data_time_s >= injected and slow_compute.compute_time_s >= injected
    assert slow_compute.enqueue_time_s == pytest.approx(slow_compute.compute_time_s)  # nothing async on a CPU
    for stats in (slow_data, slow_compute):
        assert stats.transfer_time_s + stats.compute_time_s <= stats.epoch_duration_s


def test_warm_up_is_untimed_and_changes_nothing(data_dir):
    """The warm-up trains a copy: the run's weights and torch's random stream are as they were, so a
    seed gives the same run with or without it; fit reports its time apart from the epochs'."""
    from pipeline.model import Network
    from pipeline.training import train

    config, dataset = RunConfig(batch_size=128, epochs=1, seed=3), load(data_dir)
    torch.manual_seed(config.seed)
    model = Network()
    weights, stream = {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()
    assert train._warm_up(model, config, dataset, torch.device("cpu")) > 0
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert torch.equal(stream, torch.get_rng_state())
    assert fit(config, dataset, torch.device("cpu")).warmup_s > 0


def test_peak_memory_on_the_cpu_is_the_footprint_of_the_pass():
    from pipeline.training.device import PeakMemory

    memory = PeakMemory(torch.device("cpu"))
    memory.start()
    if not memory.per_pass:
        pytest.skip("this kernel does not let a process reset its peak resident set (/proc/self/clear_refs)")
    before = memory.read()
    assert before > 10  # the process itself (Python, torch): a footprint, never the growth's 0
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, written: resident
    del block
    peak = memory.read()
    assert before + 60 <= peak < before + 1024
    memory.start()
    assert memory.read() < peak - 60  # reset: the earlier block is not counted again
    assert PeakMemory(torch.device("mps")).read() is None  # unknown is None, never zero


def test_every_epoch_records_its_peak_memory_and_host_time(data_dir):
    result = fit(RunConfig(batch_size=256, epochs=2), load(data_dir), torch.device("cpu"))
    for stats in result.epochs:
        assert stats.peak_memory_mb is None or stats.peak_memory_mb >= 0
        assert 0 < stats.enqueue_time_s <= stats.epoch_duration_s


def _ops(function, *args, device="cpu"):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        out = function(*args)
        if device == "cuda":
            torch.cuda.synchronize()
    return out, prof.key_averages()


def test_normalising_is_one_division_with_the_same_numbers():
    """One aten::div from uint8 to float32 (on CUDA the cast happens inside that one kernel; on the
    CPU aten casts first), not a float() copy followed by an in-place div_."""
    from pipeline.training.train import _normalise

    images = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8)
    out, ops = _ops(_normalise, images)
    calls = {e.key: e.count for e in ops}
    assert calls.get("aten::div") == 1 and "aten::div_" not in calls, calls
    assert out.dtype == torch.float32 and torch.equal(out, images.float() / 255)


def test_cuda_uses_fused_adam_and_the_cpu_does_not():
    from pipeline.model import Network
    from pipeline.training.train import make_optimizer as make

    model = Network()
    assert make(model.parameters(), RunConfig(), torch.device("cuda")).defaults["fused"] is True
    assert not make(model.parameters(), RunConfig(), torch.device("cpu")).defaults["fused"]


def test_prefetch_serves_the_loaders_batches_through_rotating_buffers(data_dir):
    """The prefetching path off CUDA (no pinning, no stream): the same batches in the same order as
    the DataLoader, the last one smaller, each gathered into one of DEPTH + 1 reused buffers."""
    split = load(data_dir).train  # 512 examples: 5 batches of 100 and one of 12
    expected = [(images.clone(), labels.clone()) for images, labels in batches(split, 100, shuffle=True, seed=3)]
    prefetch = PinnedPrefetch(split, 100, True, 3, torch.device("cpu"))
    got, storages = [], []
    for images, labels in prefetch:
        images, labels = prefetch.take(images, labels)
        got.append((images.clone(), labels.clone()))
        storages.append(images.untyped_storage().data_ptr())
    assert len(got) == len(expected) == len(prefetch) == 6 and got[-1][0].shape == (12, 1, 28, 28)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, expected))
    assert len(set(storages)) == PinnedPrefetch.DEPTH + 1
    assert storages[: PinnedPrefetch.DEPTH + 1] == storages[PinnedPrefetch.DEPTH + 1 : 2 * (PinnedPrefetch.DEPTH + 1)]


@pytest.mark.parametrize("path", ["prefetch", "data_on_device"])
def test_other_data_paths_learn_the_same_numbers(data_dir, path):
    """The same sampler gives the same batches in the same order without a DataLoader: through the
    prefetching loader, or gathered on the device (whose upload is a one-off cost of its own)."""
    dataset = load(data_dir)
    host = fit(RunConfig(batch_size=128, epochs=2, seed=4), dataset, torch.device("cpu"))
    other = fit(RunConfig(batch_size=128, epochs=2, seed=4, **{path: True}), dataset, torch.device("cpu"))
    assert [e.train_loss for e in other.epochs] == [e.train_loss for e in host.epochs]
    assert other.final.test_accuracy == host.final.test_accuracy
    assert ("upload_s" in other.one_off) == (path == "data_on_device") and "upload_s" not in host.one_off
