"""The reference: the source tutorial's training loop, reimplemented faithfully.

torchvision's FashionMNIST dataset with ToTensor (one PIL conversion per image), a DataLoader with
the run's batch size and workers, `.to(device)` for every batch, Adam, cross-entropy, and
`loss.item()` / `.item()` accuracy bookkeeping every step, as the tutorial's RunManager did. The
network is the same class as the pipeline's (identical layers), so only the loop differs.
"""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.model import Network

RAW = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def torchvision_root(files: dict[str, Path], folder: Path) -> Path:
    """A torchvision FashionMNIST root (FashionMNIST/raw/, uncompressed) holding `files`."""
    raw = folder / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for path in files.values():
        target = raw / path.name.removesuffix(".gz")
        if target.exists():
            continue
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copy(path, target)
    return folder


def train_set(root: Path, train: bool = True):
    from torchvision import datasets, transforms

    return datasets.FashionMNIST(root=str(root), train=train, download=False, transform=transforms.ToTensor())


def epoch(
    dataset,
    batch_size: int,
    num_workers: int,
    device: torch.device,
    lr: float = 0.01,
    network: Network | None = None,
    optimizer=None,
) -> tuple[float, Network, torch.optim.Optimizer]:
    """One training epoch of the tutorial's loop; returns (seconds, network, optimizer)."""
    torch.manual_seed(0)
    network = network or Network().to(device)
    optimizer = optimizer or torch.optim.Adam(network.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    total_loss, total_correct = 0.0, 0
    start = time.perf_counter()
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        preds = network(images)
        loss = F.cross_entropy(preds, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * batch_size
        total_correct += preds.argmax(dim=1).eq(labels).sum().item()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, network, optimizer


@torch.no_grad()
def test_accuracy(network: Network, dataset, device: torch.device) -> float:
    loader = torch.utils.data.DataLoader(dataset, batch_size=1000)
    correct = 0
    network.eval()
    for images, labels in loader:
        correct += network(images.to(device)).argmax(dim=1).eq(labels.to(device)).sum().item()
    network.train()
    return correct / len(dataset)
