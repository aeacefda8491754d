"""Small IDX files of Fashion-MNIST's shape and names, made for tests: numpy and pipeline.training.idx only,
so that the compat smoke (tests/compat/smoke.py, run in a venv without pytest) makes them too."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from pipeline.training.idx import FILES

SEEDS = {"train": 1, "test": 2}


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Learnable 28x28 images: class c lights a 5x5 block at a class-specific place, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        r, col = 3 + (c // 5) * 12, 1 + (c % 5) * 5
        images[i, r : r + 5, col : col + 5] = 250
    return images, labels


def write_idx(path: Path, array: np.ndarray, gz: bool = True) -> None:
    magic = 2051 if array.ndim == 3 else 2049
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def make_idx(
    folder: Path, n_train: int = 512, n_test: int = 256, gz: bool = True, torchvision_layout: bool = False
) -> Path:
    """Write the four Fashion-MNIST-named IDX files; returns the folder to pass as --data-dir. The
    test split is `synthetic(n_test, SEEDS["test"])`."""
    target = folder / "FashionMNIST" / "raw" if torchvision_layout else folder
    target.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        images, labels = synthetic(n, SEEDS[split])
        write_idx(target / FILES[f"{split}_images"], images, gz)
        write_idx(target / FILES[f"{split}_labels"], labels, gz)
    return folder
