"""The one table of bad grid files, shared by the loader's, the CLI's and the bad-input tests.

Each entry is (id, grid file text, fragments): loading the file must fail with a one-line message
naming the file, and every fragment must appear in it. BAD_GRID_FILES holds the files that are no
text: (id, bytes, or None for a folder, fragments).
"""

from __future__ import annotations


def _billion_laughs() -> str:
    """Nine aliases of nine aliases ... of nine values: a few hundred bytes that stand for 9**9 values."""
    names = "abcdefghi"
    parts = ["&a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    parts += [f"&{names[i]} [" + ", ".join([f"*{names[i - 1]}"] * 9) + "]" for i in range(1, 9)]
    return "experiment: [" + ", ".join(parts) + "]\n"


BAD_GRIDS: list[tuple[str, str, tuple[str, ...]]] = [
    # unknown keys: the message suggests the nearest key and lists every allowed one
    ("unknown grid key", "grid:\n  batch_siz: [1]\n", ("grid.batch_siz", "unknown key", "did you mean 'batch_size'")),
    ("unknown grid key, misspelt", "grid:\n  batch_sise: [1]\n", ("did you mean 'batch_size'",)),
    ("unknown grid key, no underscore", "grid:\n  batchsize: [1]\n", ("did you mean 'batch_size'",)),
    (
        "unknown grid key lists all",
        "grid:\n  gpus: [1]\n",
        (
            "grid.gpus",
            "unknown key",
            "allowed: lr, batch_size, num_workers, device, epochs, seed, shuffle, gpus_per_run, data_on_device, "
            "cuda_graph, precision, compile, prefetch, weight_decay, threads",
        ),
    ),
    ("unknown grid key, Adam's other name", "grid:\n  weightdecay: [0.01]\n", ("did you mean 'weight_decay'",)),
    ("unknown top-level key", "experimnt: x\n", ("did you mean 'experiment'",)),
    ("misspelt grid section", "gird:\n  lr: [1]\n", ("gird", "unknown key", "did you mean 'grid'")),
    ("unknown data key", "data:\n  rot: x\n", ("did you mean 'root'",)),
    ("unknown data key, no underscore", "data:\n  trainsize: 5\n", ("data.trainsize", "did you mean 'train_size'")),
    # values
    ("lr not a number", "grid:\n  lr: [fast]\n", ("grid.lr: got 'fast'",)),
    ("lr quoted string", "grid:\n  lr: ['fast']\n", ("grid.lr",)),
    ("lr zero", "grid:\n  lr: [0]\n", ("grid.lr", "positive number")),
    ("lr boolean", "grid:\n  lr: [true]\n", ("grid.lr", "positive number")),
    ("gpus_per_run zero", "grid:\n  gpus_per_run: [0]\n", ("grid.gpus_per_run", "0.5 to share a GPU")),
    ("empty device list", "grid:\n  device: []\n", ("grid.device: empty list",)),
    ("empty lr list", "grid:\n  lr: []\n", ("grid.lr", "empty list")),
    ("empty epochs list", "grid:\n  epochs: []\n", ("empty list",)),
    ("unknown device gpu0", "grid:\n  device: [gpu0]\n", ("cpu, cuda, cuda:N, mps or auto",)),
    ("unknown device gpu", "grid:\n  device: [gpu]\n", ("grid.device", "'gpu'", "cpu, cuda, cuda:N, mps or auto")),
    ("unknown device tpu", "grid:\n  device: [tpu]\n", ("grid.device",)),
    ("zero batch size", "grid:\n  batch_size: [0]\n", ("grid.batch_size: got 0", "positive integer")),
    ("negative batch size", "grid:\n  batch_size: [-5]\n", ("grid.batch_size",)),
    ("fractional batch size", "grid:\n  batch_size: [12.5]\n", ("grid.batch_size", "positive integer")),
    ("batch size a word", "grid:\n  batch_size: ['many']\n", ("grid.batch_size", "'many'")),
    ("batch size past int64", "grid:\n  batch_size: [100000000000000000000]\n", ("grid.batch_size", "up to")),
    ("zero epochs", "grid:\n  epochs: [0]\n", ("grid.epochs",)),
    ("negative epochs", "grid:\n  epochs: [-1]\n", ("grid.epochs", "positive integer")),
    ("negative epochs -2", "grid:\n  epochs: [-2]\n", ("grid.epochs: got -2",)),
    ("ten million epochs", "grid:\n  epochs: [10000000]\n", ("grid.epochs",)),
    ("seed past 32 bits", "grid:\n  seed: [99999999999]\n", ("grid.seed",)),
    ("fractional workers", "grid:\n  num_workers: [0.5]\n", ("grid.num_workers",)),
    ("negative workers", "grid:\n  num_workers: [-1]\n", ("grid.num_workers", "integer >= 0")),
    ("shuffle not boolean", "grid:\n  shuffle: [maybe]\n", ("grid.shuffle", "true or false")),
    ("data_on_device not boolean", "grid:\n  data_on_device: [yes please]\n", ("grid.data_on_device", "true or false")),
    ("unknown precision", "grid:\n  precision: [fp8]\n", ("grid.precision", "'fp8'", "fp32, bf16, fp16")),
    ("cuda_graph not boolean", "grid:\n  cuda_graph: [1]\n", ("grid.cuda_graph", "true or false")),
    ("compile not boolean", "grid:\n  compile: [fast]\n", ("grid.compile", "'fast'", "true or false")),
    (
        "data_on_device with workers",
        "grid:\n  num_workers: [0, 2]\n  data_on_device: [true]\n",
        ("grid.data_on_device", "num_workers: [0]"),
    ),
    ("prefetch not boolean", "grid:\n  prefetch: [always]\n", ("grid.prefetch", "true or false")),
    (
        "prefetch with workers",
        "grid:\n  num_workers: [1]\n  prefetch: [false, true]\n",
        ("grid.prefetch", "main process", "num_workers: [0]"),
    ),
    ("weight_decay negative", "grid:\n  weight_decay: [-0.01]\n", ("grid.weight_decay: got -0.01", "a number >= 0")),
    (
        "weight_decay not a number",
        "grid:\n  weight_decay: [heavy]\n",
        ("grid.weight_decay: got 'heavy'", "a number >= 0"),
    ),
    ("weight_decay boolean", "grid:\n  weight_decay: [true]\n", ("grid.weight_decay: got True", "a number >= 0")),
    ("weight_decay infinite", "grid:\n  weight_decay: [.inf]\n", ("grid.weight_decay: got inf", "a number >= 0")),
    ("checkpoint not boolean", "checkpoint: sometimes\n", ("checkpoint: got 'sometimes'",)),
    ("empty experiment name", "experiment: ''\n", ("experiment", "non-empty")),
    ("zero train_size", "data:\n  train_size: 0\n", ("data.train_size", "positive integer")),
    # repeats
    ("repeated batch size", "grid:\n  batch_size: [8, 8]\n", ("repeated value",)),
    ("repeated lr", "grid:\n  lr: [0.1, 0.1]\n", ("grid.lr", "repeated value")),
    ("duplicate key", "grid:\n  lr: [0.1]\n  lr: [0.2]\n", ("duplicate key 'lr'", "line 3")),
    # file shape and YAML syntax
    ("grid a list", "grid: [lr, 0.1]\n", ("grid", "mapping")),
    ("file a flow list", "[1, 2, 3]\n", ("expected a mapping",)),
    ("file a block list", "- just\n- a list\n", ("expected a mapping",)),
    ("empty file", "", ("expected a mapping",)),
    ("unclosed list", "grid:\n  lr: [0.1\n", ("YAML syntax error", "line")),
    ("unclosed list of two", "grid:\n  lr: [0.1, 0.2\n", ("YAML syntax error at line",)),
    ("unclosed flow mapping", "grid: {lr: [0.1\n", ("YAML syntax error",)),
    # pathological YAML: stopped while it is read, before anything walks it
    ("100000 nested lists", "grid:\n  lr: " + "[" * 100_000 + "\n", ("line 2", "nested more than 20 levels")),
    ("deeply nested mappings", "grid: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n", ("nested more than 20 levels",)),
    ("alias inside its anchor", "grid:\n  lr: &a [0.1, *a]\n", ("alias *a is inside the &a", "a loop")),
    ("mapping that contains itself", "grid: &g {lr: *g}\n", ("alias *g", "a loop")),
    ("billion laughs", _billion_laughs(), ("line 1", "more than 100000 values", "without aliases")),
    ("list as a key", "grid: {[lr]: [0.1]}\n", ("a key is a list or mapping",)),
    # --- runside: repeats, target, stop_at_target (top-level keys; tests/test_repeats.py, test_target.py)
    ("repeats zero", "repeats: 0\n", ("repeats: got 0", "positive integer")),
    ("repeats fractional", "repeats: 2.5\n", ("repeats: got 2.5", "positive integer")),
    ("repeats a word", "repeats: many\n", ("repeats: got 'many'",)),
    ("repeats boolean", "repeats: true\n", ("repeats: got True",)),
    ("target unknown metric", "target: {test_acc: 0.8}\n", ("target: test_acc: unknown metric", "test_accuracy")),
    ("target two metrics", "target: {test_accuracy: 0.8, test_loss: 0.5}\n", ("target: got 2 metrics", "names one")),
    ("target not a mapping", "target: 0.85\n", ("target: got 0.85", "expected one metric and its threshold")),
    ("target accuracy above 1", "target: {test_accuracy: 85}\n", ("target: test_accuracy: got 85", "at most 1")),
    ("target accuracy zero", "target: {train_accuracy: 0}\n", ("target: train_accuracy: got 0", "above 0")),
    ("target loss negative", "target: {test_loss: -0.1}\n", ("target: test_loss: got -0.1", "a loss above 0")),
    ("target threshold a word", "target: {test_loss: low}\n", ("target: test_loss: got 'low'",)),
    (
        "stop_at_target not boolean",
        "target: {test_accuracy: 0.8}\nstop_at_target: yes please\n",
        ("stop_at_target: got 'yes please'", "true or false"),
    ),
    ("stop_at_target without target", "stop_at_target: true\n", ("stop_at_target: true needs a target",)),
    ("misspelt repeats", "repeat: 3\n", ("repeat: unknown key", "did you mean 'repeats'")),
    # --- verdicts: repeats: auto, its cap and half-width, the quality margin (tests/test_best.py, test_repeats.py)
    ("repeats auto misspelt", "repeats: automatic\n", ("repeats: got 'automatic'", "or auto")),
    (
        "max_repeats below the minimum",
        "repeats: auto\nmax_repeats: 1\n",
        ("max_repeats: got 1", "integer >= 2", "judges from 2 runs a side"),
    ),
    (
        "max_repeats past the design's plan",
        "repeats: auto\nmax_repeats: 101\n",
        ("max_repeats: got 101", "up to 100", "plans its looks for at most 100 rounds"),
    ),
    ("max_repeats without auto", "repeats: 3\nmax_repeats: 5\n", ("max_repeats: only with repeats: auto",)),
    ("half_width of 1", "repeats: auto\nhalf_width: 1\n", ("half_width: got 1", "above 0 and below 1")),
    ("half_width zero", "repeats: auto\nhalf_width: 0\n", ("half_width: got 0", "above 0 and below 1")),
    ("half_width without auto", "half_width: 0.05\n", ("half_width: only with repeats: auto",)),
    ("quality_margin negative", "quality_margin: -0.01\n", ("quality_margin: got -0.01", ">= 0 and below 1")),
    ("quality_margin of 1", "quality_margin: 1\n", ("quality_margin: got 1", ">= 0 and below 1")),
    ("quality_margin a word", "quality_margin: small\n", ("quality_margin: got 'small'",)),
]

BAD_GRID_FILES: list[tuple[str, bytes | None, tuple[str, ...]]] = [
    ("grid file a folder", None, ("is a folder, not a grid file", "pass a YAML file")),
    ("grid file binary", bytes(range(256)) * 4, ("binary data", "not a YAML grid file")),
    (
        "grid file not UTF-8",
        b"grid:\n  device: [\xe9t\xe9]\n",
        ("not UTF-8 text (byte 0xe9 at line 2)", "save the file as UTF-8"),
    ),
    ("grid file huge", b"# " + b"x" * 1_000_000 + b"\n", ("more than 1000000 bytes", "is this the right file")),
]
