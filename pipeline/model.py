"""The tutorial's Fashion-MNIST CNN, with its exact layer names and shapes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


class Network(nn.Module):
    """conv1 → pool → conv2 → pool → fc1 → fc2 → out; input (N, 1, 28, 28) floats in [0, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels=1, out_channels=6, kernel_size=5)
        self.conv2 = nn.Conv2d(in_channels=6, out_channels=12, kernel_size=5)
        self.fc1 = nn.Linear(in_features=12 * 4 * 4, out_features=120)
        self.fc2 = nn.Linear(in_features=120, out_features=60)
        self.out = nn.Linear(in_features=60, out_features=10)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        t = F.max_pool2d(F.relu(self.conv1(t)), kernel_size=2, stride=2)
        t = F.max_pool2d(F.relu(self.conv2(t)), kernel_size=2, stride=2)
        t = F.relu(self.fc1(t.flatten(start_dim=1)))
        t = F.relu(self.fc2(t))
        return self.out(t)


def summary(model: nn.Module) -> str:
    """The tutorial's add_graph and named_parameters listing, as text: layers, then every
    parameter's name, shape, size and the device it lives on."""
    rows = [(name, tuple(p.shape), p.numel(), str(p.device)) for name, p in model.named_parameters()]
    lines = [repr(model), "", f"{'parameter':<14} {'shape':<16} {'numel':>7}  device"]
    lines += [f"{name:<14} {str(shape):<16} {numel:>7}  {device}" for name, shape, numel, device in rows]
    lines.append(f"{'total':<14} {'':<16} {sum(r[2] for r in rows):>7}")
    return "\n".join(lines) + "\n"
