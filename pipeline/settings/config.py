"""Grid files: YAML → frozen, validated config objects. Never imports torch or mlflow.

A grid file has these top-level keys, all optional (see DESIGN.md):

    experiment: fashion-devices    # defaults to the file's stem
    data: {root: null, train_size: null, test_size: null}
    grid: {lr: [0.01], batch_size: [1000, 10000], device: [cuda, cpu], ...}
    checkpoint: false              # save state each epoch; an interrupted point resumes from it
    repeats: 1                     # train each point N times, interleaved (pipeline run --repeats N);
                                   # `auto`: rounds until each speedup is clear (max_repeats, half_width)
    max_repeats: 8                 # with repeats: auto, the most rounds it trains
    half_width: 0.05               # with repeats: auto, optional: stop once every speedup's 95% interval
                                   # is within this share of its estimate (0.05: within 5%)
    quality_margin: 0.005          # a faster setting wins only if its test accuracy is at most this much
                                   # below the other's (absolute)
    target: {test_accuracy: 0.85}  # time each run to this quality (target.py); optional
    stop_at_target: false          # end a run at the epoch that reaches the target (epochs: the cap)

Every error names the file, the key and what is allowed, so the CLI can print it on one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
import re
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.base.names import MIN_RUNS, experiment_name_problem
from pipeline.errors import UserError
from pipeline.measures.target import Target
from pipeline.measures.target import parse as parse_target

DEVICE_PATTERN = re.compile(r"^(cpu|mps|auto|cuda(:\d+)?)$")
DEVICE_CHOICES = "cpu, cuda, cuda:N, mps or auto"
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class DataConfig:
    root: str | None = None
    train_size: int | None = None
    test_size: int | None = None


@dataclass(frozen=True)
class GridSpec:
    """A validated grid file: each grid key maps to a non-empty tuple of values, in file order."""

    path: Path
    experiment: str
    data: DataConfig = field(default_factory=DataConfig)
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    checkpoint: bool = False  # save model and optimizer state each epoch, resume from it
    repeats: int = 1  # each point trained this many times, every point's first repeat before any second
    # `repeats: auto`: `repeats` (MIN_RUNS) rounds first, then one more at a time until every speedup
    # is significant or within `half_width`, or `max_repeats` rounds ran. None: `repeats` is fixed.
    max_repeats: int | None = None
    half_width: float | None = None
    quality_margin: float = 0.005  # the accuracy a faster setting may lose and still win (absolute)
    target: Target | None = None  # the quality each run is timed to (time_to_target_s)
    stop_at_target: bool = False  # a run ends at the epoch that reaches the target; epochs is its cap
    overrides: tuple[str, ...] = ()  # `--set KEY=VALUE` items applied over the file, in order
    from_file: bool = True  # False for a mapping (pipeline.api): `path` is then a name, not a file

    @property
    def auto_repeats(self) -> bool:
        return self.max_repeats is not None

    @property
    def most_repeats(self) -> int:
        """The most rounds the sweep may train: `max_repeats` with `repeats: auto`, else `repeats`."""
        return self.max_repeats if self.max_repeats is not None else self.repeats

    @property
    def stop_at(self) -> Target | None:
        """The target runs stop at, when they do: the one part of the target that changes what is
        trained (and so joins the run key)."""
        return self.target if self.stop_at_target else None


# --- value checks --------------------------------------------------------------------------------
# Each check is called with the raw YAML (or CLI) value and returns the coerced value, or raises
# ValueError with `allowed`: what it accepts, in words. `schema()` says the same in JSON Schema's
# words (`pipeline schema`: an editor's check while a grid is written). One object holds the bounds
# that the check, its error, the docs' key tables and the schema read, so they cannot drift apart.

# YAML 1.1 (PyYAML, the loader) reads `1e-3` as text, and the checks turn text into a number
# deliberately; an editor reads YAML 1.2, where it is a number. A schema accepts numbers written as
# text, and leaves their bounds to the loader.
NUMBER_TEXT = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"


def number_schema(
    minimum: float | None = None,
    exclusive_minimum: float | None = None,
    maximum: float | None = None,
    exclusive_maximum: float | None = None,
    integer: bool = False,
) -> dict[str, Any]:
    """A JSON Schema for a number within bounds (None: no bound there), or a number written as text."""
    bounds = {
        "minimum": minimum,
        "exclusiveMinimum": exclusive_minimum,
        "maximum": maximum,
        "exclusiveMaximum": exclusive_maximum,
    }
    number = {"type": "integer" if integer else "number", **{k: v for k, v in bounds.items() if v is not None}}
    return {"anyOf": [number, {"type": "string", "pattern": NUMBER_TEXT}]}


def any_case(word: str) -> str:
    """A regex for `word` in any case: the checks lower-case words (`CPU` is `cpu`), and JSON
    Schema's regexes (ECMA 262) have no case-insensitive flag."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in word)


def text_schema(*alternatives: str) -> dict[str, Any]:
    """A JSON Schema for a string matching one of the regexes, with the blanks around it the checks strip."""
    return {"type": "string", "pattern": rf"^\s*({'|'.join(alternatives)})\s*$"}


def words_schema(*words: str) -> dict[str, Any]:
    """A JSON Schema for one of `words`, in any case."""
    return text_schema(*map(any_case, words))


def _plain(value: Any) -> Any:
    """A numpy scalar (np.int64(100), np.float32(0.01), np.bool_(True): what a DataFrame, np.arange or
    np.logspace hands the Python API) as the Python value it holds; anything else as it is. numpy is
    not imported here (nor needed): a numpy value names its module, and `.item()` is its own."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        plain = value.item()
        if isinstance(plain, float) and getattr(value, "itemsize", 8) < 8:
            # np.float32(0.01).item() is 0.009999999776...: the float32's shortest decimal (0.01) is
            # what the user wrote, and what run names and run keys should hold.
            return float(str(value))
        return plain
    return value


def _number(value: Any) -> float:
    # YAML 1.1 reads `1e-3` as a string and `yes`/`no` as booleans: coerce numbers deliberately.
    value = _plain(value)
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, numbers.Real):  # int, float, and any registered number type
        return float(value)
    if isinstance(value, str):
        return float(value.strip())
    raise ValueError


class Check(ABC):
    """A value's check: called with the raw value, it returns the coerced value or raises
    ValueError(self.allowed). A subclass says what it accepts in words (`allowed`, a str) and in
    JSON Schema's (`schema()`); one without a schema cannot be made, so neither can a grid key
    without bounds."""

    allowed: str

    @abstractmethod
    def __call__(self, value: Any) -> Any: ...

    @abstractmethod
    def schema(self) -> dict[str, Any]:
        """What the check accepts as JSON Schema (draft 7). It may accept more than the check, never less."""


@dataclass(frozen=True)
class Number(Check):
    """A finite number within the bounds given (None: none on that side)."""

    allowed: str  # the bounds in words, with examples: "a positive number, e.g. 0.01 or 1.0e-3"
    minimum: float | None = None
    exclusive_minimum: float | None = None
    maximum: float | None = None
    exclusive_maximum: float | None = None

    def __call__(self, value: Any) -> float:
        try:
            number = _number(value)
        except ValueError:
            raise ValueError(self.allowed) from None
        if not math.isfinite(number) or not self._within(number):
            raise ValueError(self.allowed)
        return number

    def _within(self, number: float) -> bool:
        return (
            (self.minimum is None or number >= self.minimum)
            and (self.exclusive_minimum is None or number > self.exclusive_minimum)
            and (self.maximum is None or number <= self.maximum)
            and (self.exclusive_maximum is None or number < self.exclusive_maximum)
        )

    def schema(self) -> dict[str, Any]:
        return number_schema(self.minimum, self.exclusive_minimum, self.maximum, self.exclusive_maximum)


def _positive_float(examples: str) -> Number:
    return Number(f"a positive number, e.g. {examples}", exclusive_minimum=0)


def _non_negative_float(examples: str) -> Number:
    return Number(f"a number >= 0, e.g. {examples}", minimum=0)


@dataclass(frozen=True)
class Integer(Check):
    """An integer in [minimum, maximum]. The upper bounds are what the loop accepts: torch's
    samplers and seeds take 32- or 64-bit integers, and a larger value would pass here only to fail
    the run later ("Overflow when unpacking long long")."""

    minimum: int
    maximum: int
    why: str = ""  # after the bounds in the error, in parentheses: why the minimum is what it is

    @property
    def allowed(self) -> str:  # type: ignore[override]  # a property for the base's attribute
        lower = "a positive integer" if self.minimum == 1 else f"an integer >= {self.minimum}"
        bounds = f"{lower} up to {self.maximum:,}"
        return f"{bounds} ({self.why})" if self.why else bounds

    def __call__(self, value: Any) -> int:
        value = _plain(value)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            number: float | int = int(value)  # exact: a float would round 2**63 and beyond
        else:
            try:
                number = _number(value)
            except ValueError:
                raise ValueError(self.allowed) from None
            if not math.isfinite(number) or not number.is_integer():
                raise ValueError(self.allowed)
        if not self.minimum <= number <= self.maximum:
            raise ValueError(self.allowed)
        return int(number)

    def schema(self) -> dict[str, Any]:
        return number_schema(minimum=self.minimum, maximum=self.maximum, integer=True)


class Device(Check):
    """A device name: cpu, mps, auto, cuda or cuda:N, in any case (kept lower-case)."""

    allowed = DEVICE_CHOICES

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str) or not DEVICE_PATTERN.match(value.strip().lower()):
            raise ValueError(self.allowed)
        return value.strip().lower()

    def schema(self) -> dict[str, Any]:
        return text_schema(*map(any_case, ("cpu", "mps", "auto")), any_case("cuda") + r"(:\d+)?")  # DEVICE_PATTERN


@dataclass(frozen=True)
class Choice(Check):
    """One of a few words, in any case (kept lower-case)."""

    words: tuple[str, ...]

    @property
    def allowed(self) -> str:  # type: ignore[override]  # a property for the base's attribute
        return ", ".join(self.words)

    def __call__(self, value: Any) -> str:
        text = str(value).strip().lower() if isinstance(value, str) else None
        if text not in self.words:
            raise ValueError(self.allowed)
        return text

    def schema(self) -> dict[str, Any]:
        return words_schema(*self.words)


class Boolean(Check):
    """true or false: YAML's booleans (and numpy's), never a word or a number that stands for one."""

    allowed = "true or false"

    def __call__(self, value: Any) -> bool:
        value = _plain(value)
        if not isinstance(value, bool):
            raise ValueError(self.allowed)
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


# --- the table of grid keys ----------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """What the pipeline knows about one grid key, kept as its RunConfig field's metadata. Every
    module that lists grid keys (validation and its errors, the schema, run keys, run names, twins,
    speedup axes, chart groups, registry tags, the `pipeline train` options, the docs' key tables,
    MLproject's test, compare's worded columns, the params a run records) reads them from KEYS, so
    adding a key is one field (tests/test_keys.py adds one)."""

    check: Check  # raw YAML or CLI value -> the coerced value, or ValueError(what is allowed); and its schema
    help: str  # what it does, in a line: `pipeline train --help`
    name: str | tuple[str, str]  # in run names: a prefix ("bs": bs1000; "": the value), or the words for true, false
    later: bool = False  # added after runs were recorded: joins a run key only when not at its default
    twin: bool = True  # speedups compare twins, runs equal in every twin key: runs that differ in it are not
    shown: Literal["always", "varying", "never"] = "varying"  # compare's table: "varying" when runs differ in it
    train: bool = True  # an option of `pipeline train` and a parameter of MLproject's train entry point
    chart_group: str = ""  # words for it on a chart's axis: the epoch chart groups its bars by the keys that have them
    # An axis compare measures a speedup along: (the reference value, the speedup's column). Twins that
    # differ only in this key, each against the one at the reference value.
    speedup: tuple[str, str] | tuple[()] = ()
    # A true-or-false key compare's table shows under a heading of its own, in words, once any run
    # sets it: (the heading, the words for true, the words for false).
    column: tuple[str, str, str] | tuple[()] = ()
    # The device type where the key means something ("cuda"): a run on another device does not
    # record it as a param. Empty: every run records it.
    device_only: str = ""


def _key(default: Any, **metadata: Any) -> Any:
    return field(default=default, metadata={"key": Key(**metadata)})


@dataclass(frozen=True)
class RunConfig:
    """The resolved settings of one training run (one grid point). Each field is a grid key; its Key
    says how it is checked, named, compared and offered (see KEYS)."""

    lr: float = _key(
        0.01, check=_positive_float("0.01 or 1.0e-3"), help="Adam's learning rate.", name="lr", shown="always"
    )
    batch_size: int = _key(
        100,
        check=Integer(1, 2**31 - 1),
        help="Training images per step.",
        name="bs",
        shown="always",
        chart_group="batch size",
    )
    num_workers: int = _key(
        0,
        check=Integer(0, 1024),
        help="DataLoader worker processes.",
        name="w",
        shown="always",
        chart_group="DataLoader workers",
    )
    # The device is the axis compared: twins are runs that differ in it (or in precision, compile).
    device: str = _key(
        "auto",
        check=Device(),
        help="cpu, cuda, cuda:N, mps or auto.",
        name="",
        twin=False,
        shown="always",
        speedup=("cpu", "speedup"),
    )
    epochs: int = _key(1, check=Integer(1, 1_000_000), help="Passes over the training set.", name="ep", shown="always")
    seed: int = _key(
        0,
        check=Integer(0, 2**32 - 1),  # numpy seeds DataLoader workers from it: 32 bits
        help="Seeds the weights and the shuffling.",
        name="seed",
    )
    shuffle: bool = _key(
        True, check=Boolean(), help="Shuffle training batches each epoch.", name=("shuffle", "noshuffle")
    )
    # Where a point runs under --executor ray, not what it trains: no twin key, no column, and one
    # `pipeline train` run has the machine to itself.
    gpus_per_run: float = _key(
        1.0,
        check=_positive_float("1, or 0.5 to share a GPU between two runs"),
        help="With --executor ray: the GPU share a cuda point asks for.",
        name="gpu",
        twin=False,
        shown="never",
        train=False,
        device_only="cuda",
    )
    # Settings added after runs were recorded (later=True): a run key includes them only when they
    # are not at their default, so runs made before they existed are still recognised as done.
    data_on_device: bool = _key(
        False,
        check=Boolean(),
        help="Upload the data once and index batches on the device (num_workers 0).",
        name=("ondevice", "hostdata"),
        later=True,
        shown="never",  # as itself: it has a column of its own
        column=("data path", "on device (no host data path)", "host"),
    )
    cuda_graph: bool = _key(
        False,
        check=Boolean(),
        help="Replay the training step as a CUDA graph (cuda only).",
        name=("graph", "eager"),
        later=True,
    )
    precision: str = _key(
        "fp32",
        check=Choice(PRECISIONS),
        help="fp32, or autocast to bf16 / fp16 (fp16 with a gradient scaler on CUDA).",
        name="",
        later=True,
        speedup=("fp32", "precision_speedup"),
    )
    compile: bool = _key(
        False,
        check=Boolean(),
        help="torch.compile the model; compiling is timed as compile_s.",
        name=("compiled", "eager"),
        later=True,
        speedup=("false", "compile_speedup"),
    )
    prefetch: bool = _key(
        False,
        check=Boolean(),
        help="Gather into rotating pinned buffers, copy ahead on a side stream (cuda, num_workers 0).",
        name=("prefetch", "noprefetch"),
        later=True,
    )
    weight_decay: float = _key(
        0.0,
        check=_non_negative_float("0, 1.0e-4 or 0.01"),
        help="Adam's weight decay: an L2 penalty on the weights, added to each gradient.",
        name="wd",
        later=True,
    )
    # torch's intra-op thread pool (torch.set_num_threads) for the run. On a machine shared with other
    # multithreaded work, a pool as wide as the cores waits on threads the neighbours hold: one
    # thread can be the fastest setting there (benchmarks/workers_under_load.py).
    threads: int = _key(
        0,
        check=Integer(0, 1024),
        help="torch's intra-op threads; 0: torch's default (the cores, or OMP_NUM_THREADS).",
        name="t",
        later=True,
    )

    def as_params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def identity(self) -> dict[str, Any]:
        """What a run key hashes: every setting, the later ones only when set."""
        return {k: v for k, v in self.as_params().items() if not KEYS[k].later or v != DEFAULTS[k]}


KEYS: dict[str, Key] = {f.name: f.metadata["key"] for f in dataclasses.fields(RunConfig)}
DEFAULTS: dict[str, Any] = RunConfig().as_params()
LATER_KEYS = tuple(name for name, key in KEYS.items() if key.later)


DATA_SIZE = Integer(1, 2**31 - 1)  # data.train_size and data.test_size: the first N images
# The `data:` keys and their checks.
DATA_KEYS: dict[str, Callable[[Any], Any]] = {
    "root": lambda v: _nonempty_string(v, "a folder path"),
    "train_size": DATA_SIZE,
    "test_size": DATA_SIZE,
}
_TOP_KEYS = (
    "experiment",
    "data",
    "grid",
    "checkpoint",
    "repeats",
    "max_repeats",
    "half_width",
    "target",
    "stop_at_target",
    "quality_margin",
)
MAX_REPEATS = 10_000  # far past any useful count; --max-points bounds the runs a sweep trains anyway
AUTO = "auto"
DEFAULT_MAX_REPEATS = 8  # `repeats: auto`'s cap when the grid names none
# `repeats: auto` judges after every round at its sequential design's confidence for that round
# (measures/sequential.py), so more rounds planned mean a stricter look each: at 100, 99.8% intervals.
MAX_AUTO_ROUNDS = 100
DEFAULT_QUALITY_MARGIN = 0.005
# The checks of the top-level settings that take a number (`repeats` also takes auto: check_repeats).
SETTING_CHECKS: dict[str, Check] = {
    "repeats": Integer(1, MAX_REPEATS),
    "max_repeats": Integer(
        MIN_RUNS,
        MAX_AUTO_ROUNDS,
        why=f"the comparison judges from {MIN_RUNS} runs a side; repeats: auto plans its looks for at most "
        f"{MAX_AUTO_ROUNDS} rounds, and repeats: N trains any count",
    ),
    "half_width": Number("a number above 0 and below 1, e.g. 0.05", exclusive_minimum=0, exclusive_maximum=1),
    "quality_margin": Number(
        "a number >= 0 and below 1, e.g. 0.005 (half a point of accuracy)", minimum=0, exclusive_maximum=1
    ),
}


def _nonempty_string(value: Any, allowed: str) -> str:
    value = _plain(value)
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or not str(value).strip():
        raise ValueError(allowed)
    return str(value).strip()


def check_repeats(value: Any, where: str = "") -> int | str:
    """A grid file's `repeats:` (or --repeats): an integer >= 1, or "auto"; UserError naming `where`
    otherwise."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        return SETTING_CHECKS["repeats"](value)
    except ValueError as exc:
        raise UserError(
            f"{where}repeats: got {value!r}; expected {exc}, or auto (rounds until the speedups are clear)"
        ) from None


def with_repeats(spec: GridSpec, repeats: int | str) -> GridSpec:
    """`spec` with `--repeats` applied: a count replaces the grid's (and its `auto`); `auto` keeps the
    grid's cap and half-width when it has them."""
    if repeats == AUTO:
        return dataclasses.replace(spec, repeats=MIN_RUNS, max_repeats=spec.max_repeats or DEFAULT_MAX_REPEATS)
    return dataclasses.replace(spec, repeats=int(repeats), max_repeats=None, half_width=None)


def _checked(key: str, check: Callable[[Any], Any], value: Any, where: str) -> Any:
    """`check(value)`, or UserError naming `where` and `key` with what is allowed."""
    try:
        return check(value)
    except ValueError as exc:
        raise UserError(f"{where}{key}: got {value!r}; expected {exc}") from None


def check_value(key: str, value: Any, where: str = "") -> Any:
    """Validate one grid value (used for CLI flags too, so both paths give the same message)."""
    try:
        return KEYS[key].check(value)
    except ValueError as exc:
        raise UserError(f"{where}{key}: got {value!r}; expected {exc}") from None


# --- YAML loading --------------------------------------------------------------------------------


# A grid file is a few lines: three levels deep (grid → key → list of values), tens of values. The
# bounds below are far past any real grid and stop pathological YAML while it is read, before
# anything walks it: 100000 nested `[` (PyYAML composes recursively: a RecursionError), an alias
# inside what it names (a loop), and aliases of aliases (a "billion laughs": a few lines that stand
# for 9**9 values, whose repr in an error message alone would take minutes and gigabytes).
MAX_GRID_FILE_BYTES = 1_000_000
MAX_DEPTH = 20
MAX_VALUES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of keeping the last one silently, and YAML
    nested past MAX_DEPTH, aliases that loop, or aliases that stand for more than MAX_VALUES values."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._open_anchors: set[str] = set()  # anchors of the collections being composed
        self._sizes: dict[int, int] = {}  # id(node) → how many nodes it stands for, aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise UserError(
                    f"line {line}: alias *{event.anchor} is inside the &{event.anchor} it names "
                    "(a loop); write the values out"
                )
            return super().compose_node(parent, index)  # its size is known: composed before
        if self._depth >= MAX_DEPTH:
            raise UserError(
                f"line {line}: nested more than {MAX_DEPTH} levels deep; a grid file needs three "
                "(grid → key → list of values)"
            )
        self._depth += 1
        if event.anchor is not None:
            self._open_anchors.add(event.anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open_anchors.discard(event.anchor)
        children = (
            node.value
            if isinstance(node, yaml.SequenceNode)
            else [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else []
        )
        size = 1 + sum(self._sizes[id(child)] for child in children)
        if size > MAX_VALUES:
            raise UserError(
                f"line {line}: its aliases (*name) stand for more than {MAX_VALUES} values; "
                "write the values out, without aliases"
            )
        self._sizes[id(node)] = size
        return node


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, Hashable):
            line = key_node.start_mark.line + 1
            raise UserError(f"line {line}: a key is a list or mapping; keys are names such as lr or batch_size")
        if key in mapping:
            line = key_node.start_mark.line + 1
            raise UserError(f"duplicate key {key!r} at line {line}; each key may appear once")
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _unknown_key(where: str, key: Any, allowed: tuple[str, ...] | list[str]) -> UserError:
    hint = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
    suggestion = f"did you mean {hint[0]!r}? " if hint else ""
    return UserError(f"{where}{key}: unknown key; {suggestion}allowed: {', '.join(allowed)}")


def _read_text(path: Path) -> str:
    """The grid file's text; UserError for what is no grid file: a folder, a huge or binary file,
    bytes that are not UTF-8. Reads at most MAX_GRID_FILE_BYTES + 1 bytes (/dev/zero ends too)."""
    try:
        # Before opening: opening a FIFO waits for a writer forever, and a device is no grid file.
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            raise UserError(
                f"{path}: {_special_kind(mode)}, not a regular file; save the grid to a file "
                "and pass that, e.g. experiments/quickstart.yaml"
            )
        with open(path, "rb") as handle:
            raw = handle.read(MAX_GRID_FILE_BYTES + 1)
    except FileNotFoundError:
        raise UserError(
            f"{path}: no such grid file; `pipeline init` writes the example grids into ./experiments"
        ) from None
    except IsADirectoryError:
        found = sorted(path.glob("*.yaml"))
        example = found[0] if found else Path("experiments") / "quickstart.yaml"
        raise UserError(f"{path}: is a folder, not a grid file; pass a YAML file, e.g. {example}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read grid file ({exc.strerror or exc.__class__.__name__})") from None
    if len(raw) > MAX_GRID_FILE_BYTES:
        raise UserError(
            f"{path}: more than {MAX_GRID_FILE_BYTES} bytes; a grid file is a few lines of YAML "
            "(`pipeline init` writes examples): is this the right file?"
        )
    if b"\0" in raw:
        raise UserError(
            f"{path}: binary data (a NUL byte at offset {raw.index(0)}), not a YAML grid file; "
            "pass a text file like experiments/quickstart.yaml"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UserError(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at line {line}); save the file as UTF-8"
        ) from None


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def _read_yaml(path: Path) -> Any:
    text = _read_text(path)
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{path}: YAML syntax error{at}: {problem}") from None


# Settings that feed batches without DataLoader workers, and how (the error when both are asked for).
WORKERLESS = {"data_on_device": "indexes batches on the device", "prefetch": "gathers batches in the main process"}


def load_grid(source: str | Path | Mapping[str, Any], overrides: Sequence[str] = (), *, name: str = "grid") -> GridSpec:
    """Read and validate a grid: a YAML file, or a mapping of the same shape (pipeline.api; `name`
    stands in for the file's stem). `overrides`: `KEY=VALUE` items (`pipeline run --set`), applied
    over the grid, each checked by the rules of the key it sets. Raises UserError naming the file (or
    `--set KEY`) and the key on any problem."""
    if isinstance(source, Mapping):
        path, raw, where = Path(f"{name}.yaml"), _copy(source), "grid dict: "
        from_file = False
    else:
        path = Path(source)
        raw, where, from_file = _read_yaml(path), f"{path}: ", True
    if not isinstance(raw, dict):
        raise UserError(f"{where}expected a mapping with keys {', '.join(_TOP_KEYS)}")
    for key in raw:
        if key not in _TOP_KEYS:
            raise _unknown_key(where, key, _TOP_KEYS)
    for item in overrides:
        _override(raw, item)
    if overrides:  # a clash between keys may come from a --set: the error names them beside the file
        keys = ", ".join(dict.fromkeys(str(item).partition("=")[0].strip() for item in overrides))
        where = f"{where.removesuffix(': ')} with --set {keys}: "
    spec = _spec(raw, path, where)
    return dataclasses.replace(spec, overrides=tuple(overrides), from_file=from_file)


def _copy(mapping: Mapping[str, Any]) -> Any:
    """A plain copy of a grid mapping (nested mappings and lists copied), so overrides never touch
    the caller's object."""
    if isinstance(mapping, Mapping):
        return {key: _copy(value) for key, value in mapping.items()}
    if isinstance(mapping, (list, tuple)):
        return [_copy(value) for value in mapping]
    return mapping


def _spec(raw: dict, path: Path, where: str) -> GridSpec:
    """The GridSpec of a grid mapping whose top-level keys are known."""
    experiment = raw.get("experiment")
    experiment = path.stem if experiment is None else _experiment(experiment, where)

    data_raw = raw.get("data") or {}
    if not isinstance(data_raw, dict):
        raise UserError(f"{where}data: expected a mapping with keys {', '.join(DATA_KEYS)}")
    data_values = {}
    for key, value in data_raw.items():
        if key not in DATA_KEYS:
            raise _unknown_key(f"{where}data.", key, list(DATA_KEYS))
        if value is not None:
            data_values[key] = _data_value(key, value, f"{where}data.")

    grid_raw = raw.get("grid")
    if grid_raw is None:
        grid_raw = {}
    if not isinstance(grid_raw, dict):
        raise UserError(f"{where}grid: expected a mapping of setting → list of values")
    axes = []
    for key, values in grid_raw.items():
        if key not in KEYS:
            raise _unknown_key(f"{where}grid.", key, list(KEYS))
        axes.append((key, _axis(key, values, f"{where}grid.")))
    values_of = dict(axes)
    for key, what in WORKERLESS.items():
        if True in values_of.get(key, ()) and any(n > 0 for n in values_of.get("num_workers", ())):
            raise UserError(
                f"{where}grid.{key}: true {what}, without DataLoader workers; set num_workers: [0], "
                f"or put the {key} points in a grid of their own"
            )

    checkpoint = _boolean_setting("checkpoint", raw.get("checkpoint", False), where)
    repeats, max_repeats, half_width = _repeat_settings(raw, where)
    quality_margin = _checked(
        "quality_margin", SETTING_CHECKS["quality_margin"], raw.get("quality_margin", DEFAULT_QUALITY_MARGIN), where
    )
    target = None if raw.get("target") is None else _target(raw["target"], where)
    stop_at_target = _boolean_setting("stop_at_target", raw.get("stop_at_target", False), where)
    if stop_at_target and target is None:
        raise UserError(
            f"{where}stop_at_target: true needs a target to stop at; add one, e.g. target: {{test_accuracy: 0.85}}"
        )
    if "root" in data_values and not Path(data_values["root"]).expanduser().is_absolute():
        # Relative to the grid file, so the grid means the same from any working directory.
        data_values["root"] = str(path.parent / data_values["root"])
    return GridSpec(
        path=path,
        experiment=experiment,
        data=DataConfig(**data_values),
        axes=tuple(axes),
        checkpoint=checkpoint,
        repeats=repeats,
        max_repeats=max_repeats,
        half_width=half_width,
        target=target,
        stop_at_target=stop_at_target,
        quality_margin=quality_margin,
    )


def _repeat_settings(raw: dict, where: str) -> tuple[int, int | None, float | None]:
    """`repeats`, `max_repeats` and `half_width` checked together: (rounds up front, the cap with
    `repeats: auto` else None, the half-width target or None). The cap and the half-width belong to
    `repeats: auto`; with a fixed count they are errors, not silently ignored."""
    repeats = check_repeats(raw.get("repeats", 1), where)
    if repeats != AUTO:
        for key in ("max_repeats", "half_width"):
            if raw.get(key) is not None:
                raise UserError(
                    f"{where}{key}: only with repeats: auto (repeats is {repeats}); set repeats: auto, or drop {key}"
                )
        return int(repeats), None, None
    max_repeats = raw.get("max_repeats")
    if max_repeats is None:
        max_repeats = DEFAULT_MAX_REPEATS
    else:
        max_repeats = _checked("max_repeats", SETTING_CHECKS["max_repeats"], max_repeats, where)
    half_width = raw.get("half_width")
    if half_width is not None:
        half_width = _checked("half_width", SETTING_CHECKS["half_width"], half_width, where)
    return MIN_RUNS, max_repeats, half_width


# --- one checker per setting: the file and `--set` give the same message, after their `where` ----


def _experiment(value: Any, where: str) -> str:
    try:
        name = _nonempty_string(value, "a non-empty name")
    except ValueError:
        raise UserError(f"{where}experiment: got {value!r}; expected a non-empty name") from None
    if experiment_name_problem(name):
        raise UserError(f"{where}experiment: {experiment_name_problem(name)}")
    return name


def _data_value(key: str, value: Any, where: str) -> Any:
    try:
        return DATA_KEYS[key](value)
    except ValueError as exc:
        raise UserError(f"{where}{key}: got {value!r}; expected {exc} or null") from None


def _axis(key: str, values: Any, where: str) -> tuple[Any, ...]:
    """One grid key's values, checked: a scalar is a one-element list; none empty, none repeated."""
    if not isinstance(values, list):
        values = [values]
    if not values:
        raise UserError(f"{where}{key}: empty list; give at least one value")
    checked = tuple(check_value(key, v, where) for v in values)
    if len(set(checked)) != len(checked):
        raise UserError(f"{where}{key}: repeated value in {list(checked)}; list each once")
    return checked


def _boolean_setting(key: str, value: Any, where: str) -> bool:
    value = _plain(value)
    if not isinstance(value, bool):
        raise UserError(f"{where}{key}: got {value!r}; expected true or false")
    return value


def _target(value: Any, where: str) -> Target:
    try:
        return parse_target(value)
    except ValueError as exc:
        raise UserError(f"{where}target: {exc}") from None


# --- overrides: `pipeline run GRID.yaml --set KEY=VALUE` -------------------------------------------

# The top-level settings --set takes beside every grid key, data.KEY and target.METRIC.
SETTABLE = ("experiment", "checkpoint", "repeats", "max_repeats", "half_width", "stop_at_target", "quality_margin")
_SET_EXAMPLES = "e.g. --set epochs=2, --set batch_size=100,1000 or --set repeats=3"


def settable_keys() -> list[str]:
    """What `--set` accepts, for its help and its "did you mean"."""
    return [*KEYS, *SETTABLE, *(f"data.{key}" for key in DATA_KEYS), "target.METRIC"]


def _override(raw: dict, item: str) -> None:
    """Apply one `KEY=VALUE` to the grid mapping `raw`, after checking the value by its key's rules.
    A grid key takes a comma-separated list (or a YAML list); each value is read as YAML, as in a file."""
    key, equals, text = item.partition("=")
    key = key.strip()
    if not equals or not key:
        raise UserError(f"--set {item}: expected KEY=VALUE, {_SET_EXAMPLES}")
    where = "--set "
    if key in KEYS:
        parts = [text] if text.strip().startswith("[") else text.split(",")
        values = [_set_value(part, key) for part in parts]
        values = values[0] if len(values) == 1 and isinstance(values[0], list) else values
        _axis(key, values, where)
        grid = raw.get("grid")
        raw["grid"] = {**(grid if isinstance(grid, dict) else {}), key: values}
        return
    value = _set_value(text, key)
    if key == "experiment":
        raw[key] = _experiment(value, where)
    elif key in ("checkpoint", "stop_at_target"):
        raw[key] = _boolean_setting(key, value, where)
    elif key == "repeats":
        raw[key] = check_repeats(value, where)
    elif key in ("max_repeats", "half_width", "quality_margin"):
        raw[key] = _checked(key, SETTING_CHECKS[key], value, where)
    elif key.startswith("data.") and key[len("data.") :] in DATA_KEYS:
        data = raw.get("data")
        data_key = key[len("data.") :]
        checked = None if value is None else _data_value(data_key, value, f"{where}data.")
        if data_key == "root" and checked is not None:  # from the shell: relative to where it is typed
            checked = str(Path(checked).expanduser().absolute())
        raw["data"] = {**(data if isinstance(data, dict) else {}), data_key: checked}
    elif key.startswith("target.") and len(key) > len("target."):
        target = {key[len("target.") :]: value}
        _target(target, where)
        raw["target"] = target
    else:
        raise _unknown_key(where, key, settable_keys())


def _set_value(text: str, key: str) -> Any:
    """One `--set` value read as YAML: the rules of a grid file (1.0e-3 a number, true a boolean)."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except (UserError, yaml.YAMLError) as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"--set {key}: {text!r} is not a YAML value ({problem}); {_SET_EXAMPLES}") from None


def effective_yaml(spec: GridSpec) -> str:
    """The grid a sweep trains, after its overrides, as a grid file (the parent run's grid/effective.yaml)."""
    data = {k: v for k, v in dataclasses.asdict(spec.data).items() if v is not None}
    document: dict[str, Any] = {"experiment": spec.experiment}
    if data:
        document["data"] = data
    document["grid"] = {key: list(values) for key, values in spec.axes}
    document.update(checkpoint=spec.checkpoint, repeats=AUTO if spec.auto_repeats else spec.repeats)
    if spec.auto_repeats:
        document["max_repeats"] = spec.max_repeats
        if spec.half_width is not None:
            document["half_width"] = spec.half_width
    document["quality_margin"] = spec.quality_margin
    if spec.target is not None:
        document["target"] = {spec.target.metric: spec.target.threshold}
        document["stop_at_target"] = spec.stop_at_target
    return yaml.safe_dump(document, sort_keys=False)
