"""Predict with a logged or registered model: image files, or a Fashion-MNIST split's accuracy.

Images are made to look like Fashion-MNIST before they reach the network: greyscale, the object
fitted into 28x28 with its aspect kept, light-on-dark (photos of dark objects on a white background
are inverted), scaled to [0, 1].
"""

from __future__ import annotations

import errno
import importlib.util
import os
import pickle  # its error type only: a damaged model file
import urllib.parse
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.base.uris import redact
from pipeline.errors import UserError
from pipeline.model import CLASSES
from pipeline.tracking.store import first_line, open_client
from pipeline.training.device import DeviceUnavailable, resolve

SIDE = 28
# Larger images are refused before they are decoded: 8000x8000 is past any photo of a garment, and a
# few kilobytes of PNG can claim 50000x50000 (2.5 gigapixels, gigabytes once decoded). PIL's own
# guard (Image.MAX_IMAGE_PIXELS) only warns below twice its 89 megapixels; it is left as it is.
MAX_PIXELS = 8000 * 8000


def check_inputs(device: str, images: tuple[Path, ...], split_options: bool) -> torch.device:
    """The device to predict on, once the request makes sense: image files, or a dataset split."""
    try:
        target = resolve(device)
    except DeviceUnavailable as exc:
        raise UserError(f"--device {device}: {exc}") from None
    if images and split_options:
        raise UserError("give image files, or --data-dir/--limit for a dataset split, not both")
    for path in images:
        if path.is_dir():
            raise UserError(f"{path}: is a folder; give the image files in it, e.g. {path / '*.png'}")
        if not path.is_file():
            raise UserError(f"{path}: no such image file")
    return target


# A model in remote storage is read by that storage's client library, which MLflow imports only when it
# downloads: without it, a traceback (s3, gs, azure) or a page of JVM loader lines (hdfs).
REMOTE_CLIENTS = {  # scheme: (the module MLflow imports, what to install)
    "s3": ("boto3", "boto3 (pip install boto3)"),
    "gs": ("google.cloud.storage", "google-cloud-storage (pip install google-cloud-storage)"),
    "wasbs": (
        "azure.storage.filedatalake",
        "azure-storage-file-datalake (pip install azure-storage-file-datalake azure-identity)",
    ),
    "abfss": (
        "azure.storage.filedatalake",
        "azure-storage-file-datalake (pip install azure-storage-file-datalake azure-identity)",
    ),
    "hdfs": (
        "pyarrow",
        "pyarrow (pip install pyarrow) with a Hadoop client (HADOOP_HOME, JAVA_HOME, and "
        "CLASSPATH=$(hadoop classpath --glob))",
    ),
    "viewfs": (
        "pyarrow",
        "pyarrow (pip install pyarrow) with a Hadoop client (HADOOP_HOME, JAVA_HOME, and "
        "CLASSPATH=$(hadoop classpath --glob))",
    ),
}


def check_remote_client(model_uri: str) -> None:
    """A model URI in remote storage (s3://, gs://, wasbs://, abfss://, hdfs://) needs that storage's
    client library: name the package to install (UserError) before anything is loaded."""
    scheme = urllib.parse.urlparse(model_uri).scheme.lower()
    if scheme not in REMOTE_CLIENTS:
        return
    module, package = REMOTE_CLIENTS[scheme]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package (google.cloud, azure.storage) is missing too
        found = False
    if module == "pyarrow":  # libhdfs is found through HADOOP_HOME (or ARROW_LIBHDFS_DIR), else the JVM search
        found = found and bool(os.environ.get("HADOOP_HOME") or os.environ.get("ARROW_LIBHDFS_DIR"))
    if not found:
        raise UserError(
            f"--model {redact(model_uri)}: reading {scheme}:// needs {package}; install it, or copy "
            "the model to a local folder and pass that path"
        )


def check_store(model_uri: str, tracking_uri: str) -> None:
    """A registered or logged model is read through the tracking store: fail in seconds (UserError)
    when it is absent (MLflow would create an empty one) or does not answer (MLflow retries for minutes).
    A model in remote storage needs its client library (check_remote_client)."""
    check_remote_client(model_uri)
    if model_uri.startswith(("models:/", "runs:/")):
        open_client(tracking_uri, must_exist=True)


def load(uri: str, device: torch.device) -> torch.nn.Module:
    """Any MLflow model URI (models:/name@alias, models:/m-..., runs:/id/model) as a torch module."""
    import tempfile

    import mlflow.pytorch
    from mlflow.exceptions import MlflowException

    try:
        # MLflow copies the model into a temporary folder it never removes: one of ours, which goes
        # once the weights are in memory, whether they load or not.
        with tempfile.TemporaryDirectory(prefix="pipeline-model-") as copy:
            model = mlflow.pytorch.load_model(uri, dst_path=copy, map_location=device)
    except MlflowException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise UserError(f"--model {redact(uri)}: {redact(first)}") from None
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EACCES, errno.EISDIR):  # the file itself is missing or barred
            raise UserError(f"--model {redact(uri)}: {redact(str(exc))}") from None
        raise _damaged(uri, exc) from None  # torch.load reading past a file cut short (EINVAL)
    except (RuntimeError, ValueError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, AttributeError) as exc:
        # What torch.load and pickle raise for a file cut short or not theirs, and what MLflow's loader
        # raises for an object that is no module (a state dict saved in its place)
        raise _damaged(uri, exc) from None
    if not isinstance(model, torch.nn.Module):
        raise _damaged(uri, TypeError(f"it holds a {type(model).__name__}, not a network"))
    return model.to(device).eval()


def _damaged(uri: str, exc: BaseException) -> UserError:
    return UserError(
        f"--model {redact(uri)}: its weights cannot be read ({exc.__class__.__name__}: "
        f"{redact(first_line(exc))[:160]}); the stored file is damaged or not a model: register it again"
    )


def image_tensor(path: Path) -> torch.Tensor:
    """A (1, 28, 28) float tensor in [0, 1] shaped like a Fashion-MNIST image."""
    import warnings

    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Past PIL's warning size the image is refused below: its warning would only repeat that.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as opened:  # reads the header only
                _check_size(path, *opened.size)
                image = ImageOps.exif_transpose(opened).convert("L")
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"{path}: no such image file") from None
    except Image.DecompressionBombError:  # claims more than twice PIL's limit: refused by PIL's open
        # PIL raises it only while MAX_IMAGE_PIXELS is a number (None turns the check off)
        megapixels = 2 * Image.MAX_IMAGE_PIXELS // 10**6  # type: ignore[operator]
        raise UserError(_too_large(path, f"over {megapixels} megapixels")) from None
    except UnidentifiedImageError:
        raise UserError(f"{path}: not an image file (no format it could be read as); give a PNG or JPEG file") from None
    except PermissionError:
        raise UserError(f"{path}: cannot read it (permission denied)") from None
    except (OSError, SyntaxError, ValueError) as exc:  # PIL's decoders: "image file is truncated", ...
        raise UserError(
            f"{path}: a damaged or truncated image ({first_line(exc)[:120]}); give a PNG or JPEG "
            "file that opens in an image viewer"
        ) from None
    pixels = np.asarray(image, dtype=np.float32)
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    if border.mean() > 127:  # dark object on a light background: Fashion-MNIST is the reverse
        image = ImageOps.invert(image)
    image = (
        ImageOps.pad(image, (SIDE, SIDE), method=Image.Resampling.LANCZOS, color=0)
        if image.size != (SIDE, SIDE)
        else image
    )
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).unsqueeze(0)


def _check_size(path: Path, width: int, height: int) -> None:
    if width * height > MAX_PIXELS:
        raise UserError(_too_large(path, f"{width}x{height} pixels"))


def _too_large(path: Path, size: str) -> str:
    return (
        f"{path}: {size}, more than this command decodes ({MAX_PIXELS // 10**6} megapixels, e.g. "
        "8000x8000); scale it down first (the network sees 28x28)"
    )


@dataclass(frozen=True)
class Prediction:
    path: Path
    label: int
    probability: float

    @property
    def class_name(self) -> str:
        return CLASSES[self.label]


def read_images(paths: list[Path]) -> torch.Tensor:
    """Every file as a (N, 1, 28, 28) batch, read before the model is loaded: a bad file is a
    one-line error (UserError) in a moment, not after seconds of loading."""
    return torch.stack([image_tensor(p) for p in paths])


@torch.no_grad()
def predict_files(
    model: torch.nn.Module, paths: list[Path], batch: torch.Tensor, device: torch.device
) -> list[Prediction]:
    probabilities = torch.softmax(model(batch.to(device)), dim=1).cpu()
    best, labels = probabilities.max(dim=1)
    return [Prediction(p, int(label), float(prob)) for p, label, prob in zip(paths, labels, best)]


@torch.no_grad()
def split_accuracy(
    model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device, batch_size: int = 1000
) -> tuple[float, list[tuple[str, int, float]]]:
    """Overall accuracy and (class, count, accuracy) per class over uint8 (N,1,28,28) images."""
    predicted = []
    for start in range(0, len(images), batch_size):
        chunk = images[start : start + batch_size].to(device).float().div_(255)
        predicted.append(model(chunk).argmax(dim=1).cpu())
    hits = torch.cat(predicted) == labels
    per_class = []
    for index, name in enumerate(CLASSES):
        mask = labels == index
        count = int(mask.sum())
        per_class.append((name, count, float(hits[mask].float().mean()) if count else float("nan")))
    return float(hits.float().mean()), per_class
