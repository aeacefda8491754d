"""The training loop on the CPU, through the real data loader."""

from __future__ import annotations

import pytest
import torch

from conftest import requires_real_data
from pipeline.config import RunConfig
from pipeline.data import load
from pipeline.device import DeviceUnavailable, resolve
from pipeline.train import Diverged, Hooks, evaluate, fit


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(data_dir):
    dataset = load(data_dir)
    config = RunConfig(batch_size=64, epochs=2, seed=1)
    cpu = fit(config, dataset, torch.device("cpu"))
    gpu = fit(config, dataset, resolve("cuda"))
    assert next(gpu.model.parameters()).device.type == "cuda"
    assert gpu.final.test_accuracy == pytest.approx(cpu.final.test_accuracy, abs=0.05)


@requires_real_data
def test_full_data_reaches_the_known_accuracy():
    """The acceptance run: bs 100, lr 0.01, 3 epochs on the full data reaches about 0.85+."""
    result = fit(RunConfig(lr=0.01, batch_size=100, epochs=3, device="cpu"), load(), torch.device("cpu"))
    assert result.final.test_accuracy >= 0.85


@pytest.mark.parametrize("num_workers", [0, 1])
def test_time_buckets_account_for_the_epoch(data_dir, num_workers):
    """data + transfer + compute must be within 15% of the epoch's duration."""
    result = fit(RunConfig(batch_size=32, epochs=2, num_workers=num_workers), load(data_dir), torch.device("cpu"))
    for stats in result.epochs:
        buckets = stats.data_time_s + stats.transfer_time_s + stats.compute_time_s
        assert min(stats.data_time_s, stats.transfer_time_s, stats.compute_time_s) >= 0
        assert stats.compute_time_s > 0 and stats.data_time_s > 0
        assert abs(buckets - stats.epoch_duration_s) <= 0.15 * stats.epoch_duration_s, stats


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_time_buckets_account_for_the_epoch(data_dir):
    """On CUDA transfer/compute come from events and data is the rest: still within 15%."""
    result = fit(RunConfig(batch_size=32, epochs=2, num_workers=1), load(data_dir), resolve("cuda"))
    for stats in result.epochs:
        assert stats.transfer_time_s > 0 and stats.compute_time_s > 0 and stats.data_time_s >= 0
        buckets = stats.data_time_s + stats.transfer_time_s + stats.compute_time_s
        assert abs(buckets - stats.epoch_duration_s) <= 0.15 * stats.epoch_duration_s, stats


def test_cuda_runs_record_their_arithmetic(monkeypatch):
    """TF32 convolutions, cuDNN's choices and the physical GPU are tags of every cuda run."""
    from types import SimpleNamespace

    from pipeline.device import arithmetic_tags

    assert arithmetic_tags(torch.device("cpu")) == {}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(uuid="GPU-1234"))
    tags = arithmetic_tags(torch.device("cuda", 0))
    assert tags["pipeline.gpu_uuid"] == "GPU-1234"
    assert tags["pipeline.cudnn_tf32"] == str(torch.backends.cudnn.allow_tf32).lower()
    assert tags["pipeline.matmul_tf32"] == str(torch.backends.cuda.matmul.allow_tf32).lower()
    assert {"pipeline.cudnn_version", "pipeline.cudnn_benchmark", "pipeline.cudnn_deterministic"} <= set(tags)
