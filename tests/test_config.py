"""Grid files: validation messages, coercion and deterministic expansion. No torch needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalogue import BAD_GRID_FILES, BAD_GRIDS
from pipeline.errors import UserError
from pipeline.settings.config import GridSpec, RunConfig, load_grid
from pipeline.settings.grid import check_size, config_hash, expand, grid_size, iter_points

TUTORIAL = """
experiment: fashion-devices
grid:
  lr: [0.01]
  batch_size: [1000, 10000, 20000]
  num_workers: [0, 1]
  device: [cuda, cpu]
  epochs: [1]
"""


def test_tutorial_grid_expands_in_file_key_order(write_grid):
    spec = load_grid(write_grid(TUTORIAL))
    assert spec.experiment == "fashion-devices"
    assert grid_size(spec) == 12
    points = expand(spec)
    assert [p.index for p in points] == list(range(1, 13))
    # itertools.product order: the last key (device) varies fastest.
    combos = [(p.config.batch_size, p.config.num_workers, p.config.device) for p in points[:4]]
    assert combos == [(1000, 0, "cuda"), (1000, 0, "cpu"), (1000, 1, "cuda"), (1000, 1, "cpu")]
    assert points[0].name == "cuda bs1000 w0"
    assert all(p.config.lr == 0.01 and p.config.epochs == 1 for p in points)
    # Keys the file leaves out take the defaults.
    assert points[0].config.seed == RunConfig().seed and points[0].config.shuffle is True


def test_order_follows_the_file_not_the_alphabet(write_grid):
    spec = load_grid(write_grid("grid:\n  device: [cpu, auto]\n  batch_size: [10, 20]\n"))
    assert [(p.config.device, p.config.batch_size) for p in expand(spec)] == [
        ("cpu", 10),
        ("cpu", 20),
        ("auto", 10),
        ("auto", 20),
    ]


def test_scalars_numbers_and_defaults(write_grid):
    spec = load_grid(write_grid("grid:\n  lr: 1e-3\n  batch_size: 64\n  shuffle: no\n  device: CUDA:1\n"))
    (point,) = expand(spec)
    # YAML 1.1 reads 1e-3 as a string: the loader coerces it deliberately.
    assert point.config.lr == pytest.approx(0.001)
    assert point.config.batch_size == 64 and point.config.shuffle is False and point.config.device == "cuda:1"
    assert spec.experiment == "grid"  # default: the file's stem
    assert point.name == "cuda:1 lr0.001 bs64 noshuffle"


def test_empty_grid_is_one_point_of_defaults(write_grid):
    spec = load_grid(write_grid("experiment: x\n"))
    assert [p.config for p in expand(spec)] == [RunConfig()]


def test_data_section(write_grid, tmp_path):
    spec = load_grid(write_grid("data:\n  root: /some/where\n  train_size: 100\n  test_size: null\n"))
    assert (spec.data.root, spec.data.train_size, spec.data.test_size) == ("/some/where", 100, None)
    # A relative root is relative to the grid file, not to the working directory.
    spec = load_grid(write_grid("data:\n  root: fashion\n", "sub.yaml"))
    assert spec.data.root == str(tmp_path / "fashion")


@pytest.mark.parametrize(
    "text, expected", [(text, fragments) for _, text, fragments in BAD_GRIDS], ids=[name for name, _, _ in BAD_GRIDS]
)
def test_bad_grids_name_file_key_and_fix(write_grid, text, expected):
    path = write_grid(text)
    with pytest.raises(UserError) as info:
        load_grid(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert "\n" not in message
    for fragment in expected:
        assert fragment in message, message


@pytest.mark.parametrize(
    "content, expected",
    [(content, fragments) for _, content, fragments in BAD_GRID_FILES],
    ids=[name for name, _, _ in BAD_GRID_FILES],
)
def test_files_that_are_no_grid_text_name_the_file_and_fix(tmp_path, content, expected):
    path = tmp_path / "grid.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(UserError) as info:
        load_grid(path)
    message = str(info.value)
    assert message.startswith(str(path)) and "\n" not in message, message
    for fragment in expected:
        assert fragment in message, message


def test_aliases_that_stay_small_are_read(write_grid):
    spec = load_grid(write_grid("grid:\n  seed: &s [1, 2]\n  epochs: *s\n"))
    assert spec.axes == (("seed", (1, 2)), ("epochs", (1, 2)))


def test_a_grid_of_a_million_points_is_counted_and_its_first_points_listed_without_expanding(write_grid):
    """sklearn's ParameterGrid: the size is a product of lengths, and the points come one at a time."""
    import time

    started = time.perf_counter()
    spec = load_grid(write_grid(MILLION))
    assert grid_size(spec) == 1_000_000
    first = expand(spec, limit=3)
    assert [p.index for p in first] == [1, 2, 3] and [p.config.batch_size for p in first] == [1, 2, 3]
    assert next(iter(iter_points(spec))).name == first[0].name
    assert time.perf_counter() - started < 2  # expanding a million points takes tens of seconds
    with pytest.raises(UserError) as info:
        check_size(spec)
    assert str(info.value).startswith(
        f"{spec.path}: 1000000 grid points is more than --max-points 10000; pass --max-points 1000000"
    )
    assert check_size(spec, max_points=1_000_000) == 1_000_000


MILLION = (
    "grid:\n  lr: [" + ", ".join(f"0.{i + 1:03d}" for i in range(100)) + "]\n"
    "  seed: [" + ", ".join(str(i) for i in range(100)) + "]\n"
    "  batch_size: [" + ", ".join(str(i + 1) for i in range(100)) + "]\n  device: [cpu]\n"
)


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="no such grid file"):
        load_grid(tmp_path / "nope.yaml")


def test_settings_added_later_keep_the_run_keys_of_older_grids():
    """Hashes computed by the code before data_on_device existed: a grid that does not set it must
    keep its run keys, or every earlier run would be trained again."""
    assert config_hash(RunConfig(), train_size=None, test_size=None, host="h", hardware="cpu") == "af5240294045b60d"
    old = RunConfig(lr=0.001, batch_size=1000, device="cuda", epochs=3)
    assert config_hash(old, host="h") == "7d77702e1518721c"
    assert config_hash(RunConfig(data_on_device=True)) != config_hash(RunConfig())


def test_config_hash_is_stable_and_sensitive():
    a = config_hash(RunConfig(lr=0.01), train_size=10)
    assert a == config_hash(RunConfig(lr=0.01), train_size=10)
    assert a != config_hash(RunConfig(lr=0.02), train_size=10)
    assert a != config_hash(RunConfig(lr=0.01), train_size=11)


def test_shipped_grids_are_valid():
    from conftest import REPO

    sizes = {p.stem: grid_size(load_grid(p)) for p in (REPO / "experiments").glob("*.yaml")}
    assert sizes["devices"] == 12 and sizes["quickstart"] >= 2 and len(sizes) >= 3
    devices = expand(load_grid(REPO / "experiments" / "devices.yaml"))
    assert {(p.config.lr, p.config.batch_size, p.config.num_workers, p.config.device) for p in devices} == {
        (0.01, b, w, d) for b in (1000, 10000, 20000) for w in (0, 1) for d in ("cuda", "cpu")
    }


def test_a_cuda_graph_point_needs_a_cuda_device():
    from pipeline.execution.executors import plan

    spec = GridSpec(Path("g.yaml"), "g", axes=(("cuda_graph", (True, False)), ("device", ("cpu",))))
    graph, eager = plan(expand(spec))
    assert graph.device is None and graph.reason == "cuda_graph needs a CUDA device, and this point runs on cpu"
    assert eager.device is not None and [graph.point.name, eager.point.name] == ["cpu graph", "cpu eager"]


def test_a_prefetch_point_needs_a_cuda_device_and_the_host_data_path():
    from pipeline.execution.executors import plan

    spec = GridSpec(Path("g.yaml"), "g", axes=(("prefetch", (True, False)), ("device", ("cpu",))))
    prefetch, plain = plan(expand(spec))
    assert prefetch.device is None and prefetch.reason == (
        "prefetch copies batches ahead on a CUDA stream, and this point runs on cpu"
    )
    assert plain.device is not None and prefetch.point.name == "cpu prefetch"
    both = GridSpec(
        Path("g.yaml"), "g", axes=(("prefetch", (True,)), ("data_on_device", (True,)), ("device", ("cpu",)))
    )
    assert "prefetch" in plan(expand(both))[0].reason  # skipped, whichever reason comes first


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "/dev/null", "/dev/stdin"])
def test_a_grid_that_is_no_regular_file_is_refused_before_it_is_opened(tmp_path, special):
    """A FIFO would block the open until a writer comes (forever); a device is no grid file."""
    import os
    import threading

    path = tmp_path / "grid.yaml"
    if special == "fifo":
        os.mkfifo(path)
    else:
        path = special
    result: list = []
    # In a thread with a deadline: a test of a hang must not hang the suite.
    worker = threading.Thread(target=lambda: result.append(_error_of(path)), daemon=True)
    worker.start()
    worker.join(30)
    assert result, f"load_grid({path}) hung"
    assert "not a regular file" in result[0] and str(path) in result[0], result[0]


def _error_of(path) -> str:
    try:
        load_grid(path)
    except UserError as exc:
        return str(exc)
    return "no error"


def test_numpy_scalars_are_their_python_values():
    """The Python API is handed numpy scalars (a DataFrame's column, np.arange, np.logspace): each is
    taken as the Python value it holds, so the point, its name and its run key are the plain grid's."""
    np = pytest.importorskip("numpy")
    plain = load_grid(
        {
            "grid": {"batch_size": [100, 1000], "lr": 0.01, "shuffle": False, "epochs": [2], "device": ["cpu"]},
            "repeats": 3,
        }
    )
    numpy = load_grid(
        {
            "grid": {
                "batch_size": list(np.array([100, 1000])),
                "lr": np.float32(0.01),
                "shuffle": np.bool_(False),
                "epochs": [np.uint8(2)],
                "device": [np.str_("cpu")],
            },
            "repeats": np.int64(3),
        }
    )
    assert numpy.axes == plain.axes and numpy.repeats == 3

    def value_types(grid):
        return [type(v) for _, values in grid.axes for v in values]

    assert value_types(numpy) == value_types(plain)
    assert [config_hash(p.config) for p in expand(numpy)] == [config_hash(p.config) for p in expand(plain)]
    assert [p.name for p in expand(numpy)] == [p.name for p in expand(plain)]


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("batch_size", "np.float64(1.5)", "batch_size: got np.float64(1.5); expected a positive integer"),
        ("batch_size", "np.int64(0)", "batch_size: got np.int64(0); expected a positive integer"),
        ("batch_size", "np.bool_(True)", "batch_size: got np.True_; expected a positive integer"),
        ("shuffle", "np.int64(1)", "shuffle: got np.int64(1); expected true or false"),
        ("lr", "np.float32('nan')", "lr: got np.float32(nan); expected a positive number"),
    ],
)
def test_numpy_scalars_are_checked_like_their_python_values(key, value, expected):
    np = pytest.importorskip("numpy")
    with pytest.raises(UserError) as raised:
        load_grid({"grid": {key: [eval(value, {"np": np})]}})
    assert expected in str(raised.value)


def test_config_takes_numpy_values_without_importing_numpy():
    """numpy stays optional for the grid modules: they know a numpy scalar by its type's module."""
    import subprocess
    import sys

    code = (
        "import sys; import pipeline.settings.config, pipeline.settings.grid; "
        "assert 'numpy' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
