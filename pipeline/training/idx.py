"""Fashion-MNIST's IDX files: where they are, their bytes decoded and checked. numpy only, no torch.

Search order (DESIGN.md): an explicit folder (--data-dir / data.root), $PIPELINE_DATA_DIR, ./data,
/usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist). Each may hold the four files
directly or as a torchvision root (FashionMNIST/raw/).

A folder's files are decoded once per process (`read`), and the last few folders' arrays are kept.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import math
import os
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.errors import UserError

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
# sha256 of the *decoded* IDX bytes of the canonical Fashion-MNIST files. Hashing the decoded bytes
# (not the .gz) accepts any re-compression, e.g. Debian's package, whose .gz differ from upstream's.
CANONICAL_SHA256 = {
    "train_images": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train_labels": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "test_images": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "test_labels": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
CANONICAL_SIZES = {"train": 60_000, "test": 10_000}
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
HOW_TO_GET = (
    "install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist), "
    "or run `pipeline data --download` where a network is available, "
    "or point --data-dir at a folder with the four IDX files"
)
_IMAGE_MAGIC, _LABEL_MAGIC = 2051, 2049
_KEEP = 4  # decoded datasets kept per process (a test session reads many small folders)


@dataclass(frozen=True)
class Decoded:
    """The four files as arrays: images (N, 28, 28) uint8 and labels (N,) int64 per split."""

    arrays: dict[str, np.ndarray]
    verified: bool  # the decoded bytes match the canonical Fashion-MNIST
    checksums: dict[str, str] = field(default_factory=dict)  # sha256 of each file's decoded bytes, when verified


def candidates(explicit: str | os.PathLike | None) -> list[tuple[str, Path]]:
    """Where to look, in order, each with the reason it is on the list."""
    if explicit:
        return [("--data-dir / data.root", Path(explicit).expanduser())]
    found = []
    if os.environ.get("PIPELINE_DATA_DIR"):
        found.append(("$PIPELINE_DATA_DIR", Path(os.environ["PIPELINE_DATA_DIR"]).expanduser()))
    found.append(("./data", Path("data")))
    found.append(("dataset-fashion-mnist", SYSTEM_DIR))
    return found


def _places(folder: Path):
    """Each layout the four files may be in (`folder`, then torchvision's), as {key: [names to try,
    uncompressed first]}."""
    for base in (folder, folder / "FashionMNIST" / "raw"):
        yield {key: [base / stem, base / (stem + ".gz")] for key, stem in FILES.items()}


def _files_in(folder: Path) -> dict[str, Path] | None:
    """The four IDX files in `folder` or its torchvision layout, preferring uncompressed ones."""
    for place in _places(folder):
        found = {key: next((path for path in paths if path.is_file()), None) for key, paths in place.items()}
        if all(found.values()):
            return {key: path for key, path in found.items() if path is not None}
    return None


def _special_file(folder: Path) -> Path | None:
    """The first of the four names in `folder` (or its torchvision layout) that is there but is no
    regular file: a link to a device, a pipe, a socket. Reading /dev/zero would never end."""
    paths = (path for place in _places(folder) for names in place.values() for path in names)
    return next((path for path in paths if path.exists() and not path.is_file() and not path.is_dir()), None)


def locate(explicit: str | os.PathLike | None = None) -> tuple[Path, dict[str, Path]]:
    """Find the first folder holding all four files, or raise UserError listing where it looked. A
    name there that is a device, pipe or socket is refused by name, never read."""
    looked = []
    for label, folder in candidates(explicit):
        special = _special_file(folder)
        if special is not None:
            raise UserError(
                f"{special}: not a regular file ({_kind(special)}); put the IDX file itself there, "
                f"or point --data-dir at a folder that holds the four files"
            )
        files = _files_in(folder)
        if files:  # absolute paths, the decoding's cache key, whatever the working folder or spelling
            resolved = folder.resolve()
            return resolved, {key: resolved / path.relative_to(folder) for key, path in files.items()}
        looked.append(f"{folder} ({label})")
    raise UserError(f"Fashion-MNIST not found; looked in {'; '.join(looked)}. To get it: {HOW_TO_GET}")


def _kind(path: Path) -> str:
    mode = path.stat().st_mode
    kinds = {
        "a character device": stat.S_ISCHR,
        "a block device": stat.S_ISBLK,
        "a pipe": stat.S_ISFIFO,
        "a socket": stat.S_ISSOCK,
    }
    return next((kind for kind, test in kinds.items() if test(mode)), "a special file")


def _read_idx(path: Path, magic: int) -> tuple[np.ndarray, bytes]:
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)  # one call to zlib, which lets go of Python's lock meanwhile
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{path}: cannot read ({exc}); the file looks corrupt, get a fresh copy") from None
    if len(raw) < 8 or int.from_bytes(raw[:4], "big") != magic:
        raise UserError(f"{path}: not an IDX file of the expected kind (magic number {magic} expected)")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    header = 4 + 4 * ndim
    if len(raw) - header != math.prod(dims):
        raise UserError(f"{path}: truncated or padded: header says {dims}, found {len(raw) - header} bytes of data")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims), raw


def _decode(folder: Path, files: tuple[tuple[str, Path], ...], verify: bool) -> Decoded:
    arrays, raws = {}, {}
    for key, path in files:
        arrays[key], raws[key] = _read_idx(path, _IMAGE_MAGIC if key.endswith("images") else _LABEL_MAGIC)
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or images.shape[1:] != (28, 28):
            raise UserError(f"{dict(files)[f'{split}_images']}: images are {images.shape[1:]}, expected 28x28")
        if len(images) == 0:  # training would divide by zero; refused before anything is created
            raise UserError(
                f"{dict(files)[f'{split}_images']}: holds 0 images; a {split} split needs at least "
                f"one: get a complete copy ({HOW_TO_GET})"
            )
        if len(images) != len(labels):
            raise UserError(f"{folder}: {split} has {len(images)} images but {len(labels)} labels")
        if len(labels) and labels.max() > 9:
            raise UserError(f"{dict(files)[f'{split}_labels']}: label {labels.max()} found, expected 0..9")
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = images.copy(), labels.astype(np.int64)
    canonical = all(len(arrays[f"{s}_labels"]) == n for s, n in CANONICAL_SIZES.items())
    if not verify:
        return Decoded(arrays, False)
    # Once per process and folder. The canonical files are hashed to be checked anyway; other IDX
    # files (a subset someone made, the tests' small files) so that runs can name what they read.
    checksums = {k: hashlib.sha256(raw).hexdigest() for k, raw in raws.items()}
    if canonical:
        bad = [k for k, digest in checksums.items() if digest != CANONICAL_SHA256[k]]
        if bad:
            raise UserError(
                f"{folder}: {', '.join(FILES[k] for k in bad)} do not match Fashion-MNIST's checksums "
                "(another dataset such as MNIST, or a corrupt copy)"
            )
    return Decoded(arrays, canonical, checksums)


_decoded: collections.OrderedDict[tuple, Decoded] = collections.OrderedDict()


def read(explicit: str | os.PathLike | None = None, verify: bool = True) -> tuple[Path, Decoded]:
    """The folder `locate(explicit)` finds and its files decoded, once per process and folder."""
    folder, files = locate(explicit)
    key = (folder, tuple(sorted(files.items())), verify)
    if key in _decoded:
        _decoded.move_to_end(key)
    else:
        _decoded[key] = _decode(*key)
        while len(_decoded) > _KEEP:
            _decoded.popitem(last=False)
    return folder, _decoded[key]


def forget() -> None:
    """Drop what was decoded (tests that change the files or the canonical sizes)."""
    _decoded.clear()
