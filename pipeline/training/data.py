"""Fashion-MNIST as tensors (the files are found, checked and decoded once by idx.py), served in
batches by indexing. `pipeline data --download` fetches the files with torchvision into ./data
where a network allows; nothing downloads implicitly.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from pipeline.errors import UserError
from pipeline.training import idx

WORKER_TIMEOUT_S = 300  # no batch of this dataset takes minutes; a worker that does has hung


@dataclass(frozen=True)
class Split:
    images: torch.Tensor  # (N, 1, 28, 28) uint8, normalised per batch on the target device
    labels: torch.Tensor  # (N,) int64

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int | None) -> Split:
        return self if n is None else Split(self.images[:n], self.labels[:n])


@dataclass(frozen=True)
class Dataset:
    train: Split
    test: Split
    folder: Path
    verified: bool  # True when the decoded bytes match the canonical Fashion-MNIST
    checksums: dict[str, str] = field(default_factory=dict)  # idx.Decoded's: sha256 of each file, when read verified

    @property
    def identity(self) -> dict:
        """What the data is, independent of where it was read from when it is the canonical set."""
        source = "fashion-mnist" if self.verified else str(self.folder)
        return {"source": source, "train_size": len(self.train), "test_size": len(self.test)}

    def digest(self, split: str) -> str:
        """What one split is, as a short digest (MLflow's dataset digest): the sha256 of its two files'
        checksums and the number of examples taken from them (a subset is its own data), 16 hex
        digits. Data read without checksums (verify=False) is named by its folder and size instead."""
        size = len(self.train if split == "train" else self.test)
        files = [self.checksums.get(f"{split}_{part}") for part in ("images", "labels")]
        named = files if all(files) else [str(self.folder)]
        return hashlib.sha256(":".join([*named, split, str(size)]).encode()).hexdigest()[:16]

    @property
    def description(self) -> str:
        if self.verified:
            what = "Fashion-MNIST (checksums verified)"
        else:
            what = "IDX files (not the canonical Fashion-MNIST; checksums not checked)"
        return f"{what} from {self.folder}: {len(self.train)} train / {len(self.test)} test images"


def load(
    explicit: str | os.PathLike | None = None,
    train_size: int | None = None,
    test_size: int | None = None,
    verify: bool = True,
) -> Dataset:
    """Locate, verify and decode (once per process and folder, see idx.py), then take the first N
    examples if asked.

    `verify=False` skips the checksum comparison (benchmarks on generated data of the same size).
    """
    folder, decoded = idx.read(explicit, verify)
    splits = []
    for split, size in (("train", train_size), ("test", test_size)):
        # from_numpy shares the decoded arrays' memory: every load of a process uses one copy
        full = Split(
            torch.from_numpy(decoded.arrays[f"{split}_images"]).unsqueeze(1),
            torch.from_numpy(decoded.arrays[f"{split}_labels"]),
        )
        if size is not None and size > len(full):
            raise UserError(f"data.{split}_size: {size} is more than the {len(full)} examples in {folder}")
        splits.append(full.head(size))
    train, test = splits
    return Dataset(train, test, folder, decoded.verified, decoded.checksums)


def download(root: str | os.PathLike = "data") -> Path:
    """Fetch Fashion-MNIST with torchvision into ROOT/FashionMNIST/raw (needs a network).

    torchvision is imported here alone: a torchvision built for another torch fails on import
    (beside torch's CPU builds, `operator torchvision::nms does not exist`), and nothing else needs it.
    """
    try:
        from torchvision.datasets import FashionMNIST
    except Exception as exc:  # ImportError, or the RuntimeError of a mismatched build
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UserError(
            f"--download needs torchvision, which cannot be imported here ({exc.__class__.__name__}: {reason}); "
            f"install the torchvision build that matches torch {torch.__version__}, or install Debian's "
            "dataset-fashion-mnist, or point --data-dir at a folder with the four IDX files"
        ) from None
    raw = Path(root) / "FashionMNIST" / "raw"
    # What this call makes, outermost first: removed again, with whatever it holds, if the download fails.
    made = [folder for folder in (Path(root), raw.parent, raw) if not folder.exists()]
    try:
        for train in (True, False):
            FashionMNIST(root=str(root), train=train, download=True)
    except Exception as exc:
        if made:
            shutil.rmtree(made[0], ignore_errors=True)
        cause = " ".join(str(exc).split())  # torchvision's message spans lines: the error is one
        raise UserError(f"download into {root} failed ({exc.__class__.__name__}: {cause}); {idx.HOW_TO_GET}") from None
    return raw


def image_grid(images: torch.Tensor, max_images: int = 64, columns: int = 8, pad: int = 2) -> np.ndarray:
    """An 8-wide grid of uint8 (N,1,28,28) images as an (H, W) grey uint8 array, for a PNG: the layout
    of torchvision's make_grid (white padding), without importing torchvision (whose import loads
    torch's compiler, about 2.5 s). Grey, where make_grid repeats it to RGB: a third of the pixels."""
    batch = images[:max_images, 0].numpy()
    n, height, width = batch.shape
    columns = min(columns, n)
    rows = math.ceil(n / columns)
    grid = np.full((rows * (height + pad) + pad, columns * (width + pad) + pad), 255, dtype=np.uint8)
    for i, image in enumerate(batch):
        top, left = pad + (i // columns) * (height + pad), pad + (i % columns) * (width + pad)
        grid[top : top + height, left : left + width] = image
    return grid


def png(image: np.ndarray) -> bytes:
    """An (H, W) grey or (H, W, 3) colour uint8 array as PNG bytes, at zlib's fastest level. The
    64-image grey grid: about 2 ms and 29 KB here, against 4.8 ms and 46 KB as RGB at the same level
    (and 10 ms, 55 KB at PIL's default level)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="png", compress_level=1)
    return buffer.getvalue()


# --- batches ---------------------------------------------------------------------------------------


class _BatchIndices(Sampler):
    """Yields one index tensor per batch: a permutation split into chunks, no per-sample Python."""

    def __init__(self, n: int, batch_size: int, shuffle: bool, seed: int) -> None:
        self.n, self.batch_size, self.shuffle = n, batch_size, shuffle
        self.generator = torch.Generator().manual_seed(seed)  # on the CPU: same order on any device

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def order(self) -> torch.Tensor:
        """The next epoch's order of the examples (draws a permutation when shuffling)."""
        return torch.randperm(self.n, generator=self.generator) if self.shuffle else torch.arange(self.n)

    def __iter__(self):
        # A generator function: the permutation is drawn on the first batch, not when iter() is
        # called. DataLoader calls iter() twice with workers, which would otherwise consume an
        # extra permutation and make the order depend on num_workers.
        yield from self.order().split(self.batch_size)


class _IndexedSplit(torch.utils.data.Dataset):
    """`dataset[index_tensor]` returns a whole batch: images and labels gathered by indexing."""

    def __init__(self, split: Split) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split.images[index], self.split.labels[index]


class DeviceBatches:
    """`data_on_device`: the split uploaded to `device` once, each batch gathered there by an index
    tensor; no DataLoader, no host data path. Same batches in the same order as batches() with the
    same seed (the same sampler), so runs with and without it learn the same numbers."""

    def __init__(self, split: Split, batch_size: int, shuffle: bool, seed: int, device: torch.device) -> None:
        self.sampler = _BatchIndices(len(split), batch_size, shuffle, seed)
        self.images, self.labels = split.images.to(device), split.labels.to(device)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        order = self.sampler.order().to(self.images.device)  # one small copy per epoch
        for index in order.split(self.sampler.batch_size):
            yield self.images[index], self.labels[index]


class PinnedPrefetch:
    """`prefetch`: each batch gathered by the main process straight into one of a few rotating
    page-locked (pinned) host buffers, and copied to the device on a side stream `DEPTH` steps ahead
    of the step that uses it, so the copy overlaps the GPU's work on earlier batches. Every batch
    still moves host to device at every step; only the waiting goes. Same sampler, so the same
    batches in the same order as batches() with the same seed.

    The consumer calls take() on each batch before using it: the device's current stream waits for
    that batch's copy (a GPU-side wait; the host does not block), and the caching allocator is told
    the tensors are used there. A host buffer is reused only after its previous copy has finished.
    Off CUDA (no pinned memory, no streams) the same rotation runs without the copy, which is how
    the CPU tests exercise it.
    """

    DEPTH = 2  # batches copied ahead of the one in use

    def __init__(self, split: Split, batch_size: int, shuffle: bool, seed: int, device: torch.device) -> None:
        self.sampler = _BatchIndices(len(split), batch_size, shuffle, seed)
        self.split, self.device = split, device
        self.cuda = device.type == "cuda"
        rows, slots = max(min(batch_size, len(split)), 1), self.DEPTH + 1
        self._images = [
            torch.empty((rows, *split.images.shape[1:]), dtype=split.images.dtype, pin_memory=self.cuda)
            for _ in range(slots)
        ]
        self._labels = [torch.empty(rows, dtype=split.labels.dtype, pin_memory=self.cuda) for _ in range(slots)]
        self._copied: list[torch.cuda.Event | None] = [None] * slots
        self._stream = torch.cuda.Stream(device) if self.cuda else None
        self._ready: torch.cuda.Event | None = None

    def __len__(self) -> int:
        return len(self.sampler)

    def _launch(self, step: int, index: torch.Tensor):
        slot = step % len(self._images)
        copied = self._copied[slot]
        if copied is not None:
            copied.synchronize()  # this buffer's last copy is done (long ago, in steady state)
        n = index.numel()
        images = torch.index_select(self.split.images, 0, index, out=self._images[slot][:n])
        labels = torch.index_select(self.split.labels, 0, index, out=self._labels[slot][:n])
        if not self.cuda:
            return images, labels, None
        # The copy reads only this host buffer and writes fresh device memory: it waits for nothing
        # the main stream does.
        with torch.cuda.stream(self._stream):
            images = images.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        self._copied[slot] = ready
        return images, labels, ready

    def __iter__(self):
        pending = collections.deque()
        indices = enumerate(self.sampler.order().split(self.sampler.batch_size))
        for step, index in itertools.islice(indices, self.DEPTH):
            pending.append(self._launch(step, index))
        while pending:
            images, labels, self._ready = pending.popleft()
            yield images, labels
            # The step on this batch is queued: gather and copy the next one while the GPU runs it.
            following = next(indices, None)
            if following is not None:
                pending.append(self._launch(*following))

    def take(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch just yielded, ready for use on the device's current stream."""
        if self._ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(self._ready)
            images.record_stream(current)  # allocated on the side stream, used on this one
            labels.record_stream(current)
        return images, labels


def batches(
    split: Split,
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    pin_memory: bool = False,
) -> DataLoader:
    """A DataLoader of uint8 (B,1,28,28) image batches and int64 labels, built by indexing.

    `num_workers` is the tutorial's knob: with K > 0, K worker processes gather the batches.
    """
    return DataLoader(
        _IndexedSplit(split),
        sampler=_BatchIndices(len(split), batch_size, shuffle, seed),
        batch_size=None,  # the sampler already yields whole batches
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        timeout=WORKER_TIMEOUT_S if num_workers > 0 else 0,  # a hung worker fails the run
    )
