"""Locating, verifying and decoding IDX files, and batches built by indexing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_idx, requires_real_data
from pipeline.errors import UserError
from pipeline.training import idx
from pipeline.training.data import batches, load
from pipeline.training.idx import FILES, locate


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("torchvision_layout", [False, True])
def test_loads_flat_or_torchvision_layout_gz_or_not(tmp_path, gz, torchvision_layout):
    folder = make_idx(tmp_path / "d", 40, 20, gz=gz, torchvision_layout=torchvision_layout)
    ds = load(folder)
    assert ds.train.images.shape == (40, 1, 28, 28) and ds.train.images.dtype == torch.uint8
    assert ds.test.labels.shape == (20,) and ds.test.labels.dtype == torch.int64
    assert not ds.verified and "not the canonical" in ds.description
    assert str(folder.resolve()) in ds.description


def test_subset_sizes_take_the_first_examples(tmp_path):
    folder = make_idx(tmp_path / "d", 40, 20)
    full, head = load(folder), load(folder, train_size=10, test_size=5)
    assert len(head.train) == 10 and len(head.test) == 5
    assert torch.equal(head.train.images, full.train.images[:10])
    with pytest.raises(UserError, match="data.train_size: 41 is more than the 40"):
        load(folder, train_size=41)


def test_a_folder_is_decoded_once_per_process_however_it_is_named(tmp_path, monkeypatch):
    folder = make_idx(tmp_path / "d", 40, 20)
    decoded = []

    def counted(*args):
        decoded.append(args[0])
        return decode(*args)

    decode = idx._decode
    monkeypatch.setattr(idx, "_decode", counted)
    monkeypatch.chdir(tmp_path)
    first = load("d")  # a relative spelling
    second = load(folder.resolve(), train_size=10)  # as a point's job names it: absolute
    assert len(decoded) == 1
    assert first.train.images.data_ptr() == second.train.images.data_ptr()  # shared, not copied
    idx.forget()
    fresh = load(folder)
    assert len(decoded) == 2
    assert torch.equal(fresh.train.images, first.train.images) and torch.equal(fresh.test.labels, first.test.labels)


def test_a_failure_to_decode_is_not_kept(tmp_path):
    folder = make_idx(tmp_path / "d", 10, 10)
    good = (folder / (FILES["train_images"] + ".gz")).read_bytes()
    (folder / (FILES["train_images"] + ".gz")).write_bytes(good[: len(good) // 2])
    with pytest.raises(UserError, match="corrupt"):
        load(folder)
    (folder / (FILES["train_images"] + ".gz")).write_bytes(good)
    assert len(load(folder).train) == 10  # the failure was not cached


def test_search_order(tmp_path, monkeypatch):
    env_dir = make_idx(tmp_path / "env", 10, 10)
    make_idx(tmp_path / "data", 12, 10)  # ./data (the tests run in tmp_path)
    assert locate()[0] == (tmp_path / "data").resolve()
    monkeypatch.setenv("PIPELINE_DATA_DIR", str(env_dir))
    assert locate()[0] == env_dir.resolve()
    explicit = make_idx(tmp_path / "explicit", 14, 10)
    assert locate(explicit)[0] == explicit.resolve()


def test_missing_data_lists_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(idx, "SYSTEM_DIR", tmp_path / "not-installed")
    monkeypatch.setenv("PIPELINE_DATA_DIR", str(tmp_path / "env"))
    with pytest.raises(UserError) as info:
        locate()
    message = str(info.value)
    for fragment in (
        "env ($PIPELINE_DATA_DIR)",
        "data (./data)",
        "not-installed",
        "apt-get install dataset-fashion-mnist",
    ):
        assert fragment in message
    with pytest.raises(UserError, match=r"nowhere \(--data-dir"):
        locate(tmp_path / "nowhere")


def test_corrupt_files_are_named(tmp_path):
    folder = make_idx(tmp_path / "d", 10, 10, gz=False)
    labels = folder / FILES["train_labels"]
    labels.write_bytes(labels.read_bytes()[:-3])
    with pytest.raises(UserError, match="truncated"):
        load(folder)

    folder = make_idx(tmp_path / "e", 10, 10, gz=False)
    (folder / FILES["test_images"]).write_bytes(b"\x00\x00\x08\x01" + b"\x00" * 20)
    with pytest.raises(UserError, match="magic number 2051"):
        load(folder)

    folder = make_idx(tmp_path / "f", 10, 10)
    (folder / (FILES["train_images"] + ".gz")).write_bytes(b"not gzip at all")
    with pytest.raises(UserError, match="corrupt"):
        load(folder)


def test_image_label_count_mismatch(tmp_path):
    folder = make_idx(tmp_path / "d", 10, 10, gz=False)
    make_idx(tmp_path / "other", 11, 10, gz=False)
    (folder / FILES["train_labels"]).write_bytes((tmp_path / "other" / FILES["train_labels"]).read_bytes())
    with pytest.raises(UserError, match="10 images but 11 labels"):
        load(folder)


def test_canonical_sizes_must_match_the_checksums(tmp_path, monkeypatch):
    # Files with Fashion-MNIST's sizes but other content (MNIST, a corrupt copy) are rejected.
    monkeypatch.setattr(idx, "CANONICAL_SIZES", {"train": 30, "test": 10})
    folder = make_idx(tmp_path / "d", 30, 10)
    with pytest.raises(UserError, match="do not match Fashion-MNIST's checksums"):
        load(folder)
    assert not load(folder, verify=False).verified  # generated benchmark data of the same size


@requires_real_data
def test_real_fashion_mnist_is_verified():
    ds = load()
    assert ds.verified and len(ds.train) == 60_000 and len(ds.test) == 10_000
    assert torch.bincount(ds.train.labels).tolist() == [6000] * 10


def test_batches_cover_the_split_by_indexing(tmp_path):
    split = load(make_idx(tmp_path / "d", 50, 10)).train
    seen = []
    for images, labels in batches(split, 16, shuffle=True, seed=3):
        assert images.dtype == torch.uint8 and images.shape[1:] == (1, 28, 28)
        assert len(images) == len(labels) <= 16
        seen.append(labels)
    assert [len(x) for x in seen] == [16, 16, 16, 2]
    assert sorted(torch.cat(seen).tolist()) == sorted(split.labels.tolist())


def test_shuffle_is_seeded_and_independent_of_workers(tmp_path):
    split = load(make_idx(tmp_path / "d", 64, 10)).train

    def order(seed, workers):
        return [labels.tolist() for _, labels in batches(split, 8, shuffle=True, seed=seed, num_workers=workers)]

    assert order(1, 0) == order(1, 0) == order(1, 1)
    assert order(1, 0) != order(2, 0)
    unshuffled = torch.cat([labels for _, labels in batches(split, 8)])
    assert torch.equal(unshuffled, split.labels)


@pytest.mark.parametrize("n", [64, 70, 5])
def test_the_batch_image_grid_is_torchvisions_layout(n):
    """image_grid (no torchvision import) draws what torchvision's make_grid draws: 8 wide, white
    padding of 2, at most 64 images; grey, which make_grid repeats in three equal channels."""
    from torchvision.utils import make_grid

    from pipeline.training.data import image_grid

    images = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8)
    red, green, blue = make_grid(images[:64], nrow=8, padding=2, pad_value=255).numpy()
    assert np.array_equal(red, green) and np.array_equal(red, blue)
    assert np.array_equal(image_grid(images), red)


class _BrokenTorchvision:
    """An import hook that fails `import torchvision` as a torchvision built for another torch does
    (beside torch's CPU builds: `operator torchvision::nms does not exist`)."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torchvision":
            raise RuntimeError("operator torchvision::nms does not exist")
        return None


@pytest.mark.parametrize("broken", ["runtime", "missing"])
def test_download_says_in_one_line_that_torchvision_cannot_be_imported(monkeypatch, broken):
    import sys

    from click.testing import CliRunner

    from pipeline.cli import main

    for name in [m for m in sys.modules if m.partition(".")[0] == "torchvision"]:
        monkeypatch.delitem(sys.modules, name)
    if broken == "runtime":
        monkeypatch.setattr(sys, "meta_path", [_BrokenTorchvision(), *sys.meta_path])
    else:
        monkeypatch.setitem(sys.modules, "torchvision", None)  # import raises ImportError
    result = CliRunner().invoke(main, ["data", "--download"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: --download needs torchvision, which cannot be imported here")
    assert ("RuntimeError: operator torchvision::nms" if broken == "runtime" else "ModuleNotFoundError") in lines[0]


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_split_of_zero_images_is_refused_at_load(tmp_path, split):
    """Zero images would reach training and divide by zero: refused when the files are read, naming the file."""
    sizes = {"train": 0 if split == "train" else 10, "test": 0 if split == "test" else 10}
    folder = make_idx(tmp_path / "d", sizes["train"], sizes["test"])
    with pytest.raises(UserError, match=rf"{FILES[f'{split}_images']}\.gz: holds 0 images"):
        load(folder)


def test_a_subset_size_of_zero_is_refused_by_the_grid():
    from pipeline.settings.config import load_grid

    for key in ("train_size", "test_size"):
        with pytest.raises(UserError, match=f"{key}: got 0"):
            load_grid({"data": {key: 0}, "grid": {"device": ["cpu"]}})
