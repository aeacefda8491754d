"""Predict with a logged or registered model: image files, or a Fashion-MNIST split's accuracy.

Images are made to look like Fashion-MNIST before they reach the network: greyscale, the object
fitted into 28x28 with its aspect kept, light-on-dark (photos of dark objects on a white background
are inverted), scaled to [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.errors import UserError
from pipeline.model import CLASSES

SIDE = 28


def check_inputs(device: str, images: tuple[Path, ...], split_options: bool) -> torch.device:
    """The device to predict on, once the request makes sense: image files, or a dataset split."""
    from pipeline.device import DeviceUnavailable, resolve

    try:
        target = resolve(device)
    except DeviceUnavailable as exc:
        raise UserError(f"--device {device}: {exc}") from None
    if images and split_options:
        raise UserError("give image files, or --data-dir/--limit for a dataset split, not both")
    for path in images:
        if not path.is_file():
            raise UserError(f"{path}: no such image file")
    return target


def load(uri: str, device: torch.device) -> torch.nn.Module:
    """Any MLflow model URI (models:/name@alias, models:/m-..., runs:/id/model) as a torch module."""
    import mlflow.pytorch
    from mlflow.exceptions import MlflowException

    try:
        model = mlflow.pytorch.load_model(uri, map_location=device)
    except MlflowException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise UserError(f"--model {uri}: {first}") from None
    except OSError as exc:
        raise UserError(f"--model {uri}: {exc}") from None
    return model.to(device).eval()


def image_tensor(path: Path) -> torch.Tensor:
    """A (1, 28, 28) float tensor in [0, 1] shaped like a Fashion-MNIST image."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image = ImageOps.exif_transpose(image).convert("L")
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"{path}: no such image file") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise UserError(f"{path}: not a readable PNG or JPEG ({exc.__class__.__name__})") from None
    pixels = np.asarray(image, dtype=np.float32)
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    if border.mean() > 127:  # dark object on a light background: Fashion-MNIST is the reverse
        image = ImageOps.invert(image)
    image = ImageOps.pad(image, (SIDE, SIDE), method=Image.Resampling.LANCZOS, color=0) \
        if image.size != (SIDE, SIDE) else image
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).unsqueeze(0)


@dataclass(frozen=True)
class Prediction:
    path: Path
    label: int
    probability: float

    @property
    def class_name(self) -> str:
        return CLASSES[self.label]


@torch.no_grad()
def predict_files(model: torch.nn.Module, paths: list[Path], device: torch.device) -> list[Prediction]:
    batch = torch.stack([image_tensor(p) for p in paths]).to(device)
    probabilities = torch.softmax(model(batch), dim=1).cpu()
    best, labels = probabilities.max(dim=1)
    return [Prediction(p, int(label), float(prob)) for p, label, prob in zip(paths, labels, best)]


@torch.no_grad()
def split_accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                   device: torch.device, batch_size: int = 1000) -> tuple[float, list[tuple[str, int, float]]]:
    """Overall accuracy and (class, count, accuracy) per class over uint8 (N,1,28,28) images."""
    predicted = []
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size].to(device).float().div_(255)
        predicted.append(model(chunk).argmax(dim=1).cpu())
    hits = torch.cat(predicted) == labels
    per_class = []
    for index, name in enumerate(CLASSES):
        mask = labels == index
        count = int(mask.sum())
        per_class.append((name, count, float(hits[mask].float().mean()) if count else float("nan")))
    return float(hits.float().mean()), per_class
