"""Fit and evaluate the CNN on one device. Never imports mlflow or click: numbers leave through hooks.

The loop follows the tutorial: the network lives on `device` and every batch is moved there at every
step. Batches arrive as uint8 and are normalised on the device, so a CUDA copy moves 4x fewer bytes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from pipeline.config import RunConfig
from pipeline.data import Dataset, Split, batches
from pipeline.model import Network

EVAL_BATCH_SIZE = 1000  # evaluation batch size does not change results, only speed


class Diverged(RuntimeError):
    """The training loss became NaN or infinite."""


@dataclass(frozen=True)
class EpochStats:
    epoch: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    epoch_duration_s: float  # the training pass, data loading included; evaluation excluded
    images_per_s: float


@dataclass
class FitResult:
    model: Network
    epochs: list[EpochStats] = field(default_factory=list)
    duration_s: float = 0.0  # every epoch's training and evaluation

    @property
    def final(self) -> EpochStats:
        return self.epochs[-1]


class Hooks:
    """Override what you need; the loop calls these and nothing else."""

    def epoch_start(self, epoch: int, steps: int) -> None: ...

    def step(self) -> None: ...

    def epoch_end(self, stats: EpochStats) -> None: ...


def _to_device(images: torch.Tensor, labels: torch.Tensor, device: torch.device, non_blocking: bool):
    images = images.to(device, non_blocking=non_blocking).float().div_(255)
    return images, labels.to(device, non_blocking=non_blocking)


def _sync(device: torch.device) -> None:
    # Kernels run asynchronously on CUDA: wait for them before reading a clock.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def evaluate(model: Network, split: Split, device: torch.device) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over `split`, in eval mode."""
    model.eval()
    cuda = device.type == "cuda"
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    for images, labels in batches(split, max(EVAL_BATCH_SIZE, 1), pin_memory=cuda):
        images, labels = _to_device(images, labels, device, cuda)
        logits = model(images)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum")
        correct += (logits.argmax(dim=1) == labels).sum()
    n = max(len(split), 1)
    return loss_sum.item() / n, correct.item() / n


def fit(config: RunConfig, data: Dataset, device: torch.device, hooks: Hooks | None = None) -> FitResult:
    """Train `config.epochs` epochs with Adam and cross-entropy; evaluate on the test set each epoch."""
    hooks = hooks or Hooks()
    torch.manual_seed(config.seed)
    model = Network().to(device)  # initialised on the CPU by the seed, then moved: same weights anywhere
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    cuda = device.type == "cuda"
    loader = batches(
        data.train, config.batch_size, shuffle=config.shuffle, seed=config.seed,
        num_workers=config.num_workers, pin_memory=cuda,
    )
    result = FitResult(model=model)
    run_start = time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        hooks.epoch_start(epoch, len(loader))
        model.train()
        # Accumulate on the device; reading them once per epoch avoids a host sync per step.
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.long, device=device)
        epoch_start = time.perf_counter()
        for images, labels in loader:
            images, labels = _to_device(images, labels, device, cuda)
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * labels.size(0)
            correct += (logits.argmax(dim=1) == labels).sum()
            hooks.step()
        _sync(device)
        epoch_s = time.perf_counter() - epoch_start
        n = len(data.train)
        train_loss = loss_sum.item() / n
        if not math.isfinite(train_loss):
            raise Diverged(f"diverged at epoch {epoch}: training loss is {train_loss}; try a lower lr")
        test_loss, test_accuracy = evaluate(model, data.test, device)
        stats = EpochStats(
            epoch=epoch,
            train_loss=train_loss,
            train_accuracy=correct.item() / n,
            test_loss=test_loss,
            test_accuracy=test_accuracy,
            epoch_duration_s=epoch_s,
            images_per_s=n / epoch_s if epoch_s > 0 else float("inf"),
        )
        result.epochs.append(stats)
        hooks.epoch_end(stats)
    result.duration_s = time.perf_counter() - run_start
    return result
