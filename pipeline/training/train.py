"""Fit and evaluate the CNN on one device. Never imports mlflow or click: numbers leave through hooks.

The loop follows the tutorial: the network lives on `device` and every batch is moved there at every
step. Batches arrive as uint8 and are normalised on the device, so a CUDA copy moves 4x fewer bytes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn.functional as F

from pipeline.base.names import CAPTURE, COMPILE, UPLOAD, WARMUP
from pipeline.measures.target import Target
from pipeline.model import Network
from pipeline.settings.config import RunConfig
from pipeline.training.clock import Clock, sync
from pipeline.training.cuda_graph import GraphStep
from pipeline.training.data import Dataset, DeviceBatches, PinnedPrefetch, Split, batches
from pipeline.training.device import PeakMemory
from pipeline.training.energy import EnergyMeter

EVAL_BATCH_SIZE = 1000  # evaluation batch size does not change results, only speed


class Diverged(RuntimeError):
    """The training loss became NaN or infinite."""


class CompileFailed(RuntimeError):
    """torch.compile could not compile the model (the full error is the exception's cause)."""


@dataclass(frozen=True)
class EpochStats:
    epoch: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    epoch_duration_s: float  # the training pass, data loading included; evaluation excluded
    images_per_s: float
    # Where the epoch's time went (see clock.Clock); together they account for epoch_duration_s.
    data_time_s: float = 0.0
    transfer_time_s: float = 0.0
    compute_time_s: float = 0.0
    enqueue_time_s: float = 0.0  # host time in the compute calls (on CUDA: launching kernels)
    peak_memory_mb: float | None = None  # see device.PeakMemory; None where it cannot be told
    energy_j: float | None = None  # the training pass, from hardware counters (energy.py); None: no counter
    # Wall seconds from the start of the run's fit (model built, warm-up or compile, upload, capture)
    # to the end of this epoch's evaluation: every epoch and evaluation before it counted. None: not
    # known (a resumed run whose checkpoint was written before it was kept).
    wall_clock_s: float | None = None


@dataclass
class FitResult:
    model: Network
    epochs: list[EpochStats] = field(default_factory=list)
    duration_s: float = 0.0  # every epoch's training and evaluation (the warm-up excluded)
    # Costs paid once per run before epoch 1, by metric name: warmup_s, and upload_s with data_on_device.
    one_off: dict[str, float] = field(default_factory=dict)
    threads: int = 0  # torch's intra-op threads the run trained with (torch_threads)

    @property
    def warmup_s(self) -> float:
        return self.one_off.get(WARMUP, 0.0)

    @property
    def final(self) -> EpochStats:
        return self.epochs[-1]


class Hooks:
    """Override what you need; the loop calls these and nothing else."""

    def model_ready(self, model: Network) -> None:
        """Called once the network is on its device, before the first epoch."""

    def before_training(self, one_off: dict[str, float]) -> None:
        """Called before the first epoch with the run's one-off costs (FitResult.one_off)."""

    def epoch_start(self, epoch: int, steps: int) -> None: ...

    def step(self) -> None: ...

    def epoch_end(self, stats: EpochStats) -> None: ...

    # Checkpointing: when `checkpointing` is True, save_state gets everything needed to resume
    # after each epoch (fit(resume=state) continues from it).
    checkpointing = False

    def save_state(self, state: dict) -> None: ...


def _to_device(images: torch.Tensor, labels: torch.Tensor, device: torch.device, non_blocking: bool):
    """Copy a uint8 batch to the device (4x fewer bytes than float32); normalise it there."""
    images = images.to(device, non_blocking=non_blocking)
    return images, labels.to(device, non_blocking=non_blocking)


def _normalise(images: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    images = torch.div(images, 255)  # uint8 in, float32 out, in one kernel
    return images.contiguous(memory_format=torch.channels_last) if channels_last else images


_LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: str):
    """Forward and loss at `precision`: fp32 as written, bf16/fp16 through torch.autocast (weights,
    gradients and Adam stay fp32; autocast picks which ops run low)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_LOW[precision])


def uses_channels_last(device: torch.device) -> bool:
    """channels_last convolutions take about 0.5-0.65x the time of NCHW on x86 CPUs for this
    network (benchmarks/); on CUDA in fp32 the default layout is kept."""
    return device.type == "cpu"


def torch_threads(config: RunConfig) -> int:
    """The size of the main process's thread pool for a run of `config`: the grid key `threads` where
    set; else torch's current pool (the cores, OMP_NUM_THREADS, or what a Ray task was given),
    shrunk only when the DataLoader workers alone fill the machine. Worker processes run one thread
    each (DataLoader sets that); measured on 2 cores, giving a thread up to one mostly idle indexing
    worker costs up to 1.6x at batch size 1000."""
    if config.threads:
        return config.threads
    cores = os.cpu_count() or 1
    if config.num_workers >= cores:
        return max(1, cores - config.num_workers // 2)
    return torch.get_num_threads()


@contextlib.contextmanager
def _torch_threads(config: RunConfig):
    """The run's thread pool (torch_threads) for the block, torch's previous one restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(torch_threads(config))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, split: Split, device: torch.device, precision: str = "fp32"
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over `split`, in eval mode, at the run's precision."""
    model.eval()
    cuda, channels_last = device.type == "cuda", uses_channels_last(device)
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    for images, labels in batches(split, EVAL_BATCH_SIZE, pin_memory=cuda):
        images, labels = _to_device(images, labels, device, cuda)
        with autocast(device, precision):
            logits = model(_normalise(images, channels_last))
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum")
        correct += (logits.argmax(dim=1) == labels).sum()
    n = max(len(split), 1)
    return loss_sum.item() / n, correct.item() / n


def fit(
    config: RunConfig,
    data: Dataset,
    device: torch.device,
    hooks: Hooks | None = None,
    resume: dict | None = None,
    stop_at: Target | None = None,
) -> FitResult:
    """Train `config.epochs` epochs with Adam and cross-entropy; evaluate on the test set each epoch.

    `resume` is a state from Hooks.save_state: training continues after its last epoch, with the
    same weights, optimizer moments and shuffling order it would have had without the break.
    `stop_at`: training ends after the first epoch whose metric reaches this target (a grid's
    `stop_at_target`); `config.epochs` is then the cap.
    """
    # On cuda:N, N is the current device for the whole fit, so that CUDA events are recorded on
    # N's stream rather than GPU 0's.
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with _torch_threads(config), on_device:
        result = _fit(config, data, device, hooks or Hooks(), resume, stop_at)
        result.threads = torch.get_num_threads()
        return result


def _train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Adam,
    images: torch.Tensor,
    labels: torch.Tensor,
    device: torch.device,
    precision: str,
    channels_last: bool,
    scaler: torch.amp.GradScaler | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One eager training step on a batch already on the device: forward and loss at `precision`,
    then backward and Adam (through the scaler with fp16 on CUDA). Returns (logits, loss)."""
    with autocast(device, precision):
        logits = model(_normalise(images, channels_last))
        loss = F.cross_entropy(logits, labels)
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return logits, loss


def make_optimizer(parameters, config: RunConfig, device: torch.device, capturable: bool = False) -> torch.optim.Adam:
    """Adam at the run's lr and weight decay; fused on CUDA (one kernel for every parameter's update
    instead of several per tensor), and capturable (its step counter on the GPU) when a CUDA graph
    replays the step."""
    cuda = device.type == "cuda"
    return torch.optim.Adam(
        parameters, lr=config.lr, weight_decay=config.weight_decay, fused=cuda, capturable=cuda and capturable
    )


def _shapes(config: RunConfig, data: Dataset) -> list[tuple[int, bool]]:
    """(batch size, training?) of the batches the warm-up runs: the training and evaluation batch,
    and with compile also the smaller last batch of each, which torch.compile compiles again."""
    shapes = []
    for n, size, training in ((len(data.train), config.batch_size, True), (len(data.test), EVAL_BATCH_SIZE, False)):
        sizes = [max(min(size, n), 1)] + ([n % size] if config.compile and n > size and n % size else [])
        shapes += [(s, training) for s in sizes]
    return shapes


def _compiled(model: torch.nn.Module) -> torch.nn.Module:
    """torch.compile(model): a module with the same parameters (torch annotates it as any callable)."""
    return cast(torch.nn.Module, torch.compile(model, dynamic=False))


def _warm_up(model: Network, config: RunConfig, data: Dataset, device: torch.device) -> float:
    """Untimed training steps and evaluation batches at the run's shapes, on a copy of the model,
    so that epoch 1 does not time loading the device's libraries, choosing kernels, the allocator's
    first growth or (with compile) compiling. The run's own weights, optimizer and random streams
    are untouched (zero images: nothing drawn). Returns its duration."""
    start = time.perf_counter()
    shadow = copy.deepcopy(model)
    optimizer = make_optimizer(shadow.parameters(), config, device)
    # A compiled copy's code serves the run's model too: dynamo guards on the module's type and
    # the inputs' shapes, not on which instance is called.
    net = _compiled(shadow) if config.compile else shadow
    channels_last, pin = uses_channels_last(device), device.type == "cuda"
    for size, training in _shapes(config, data):
        images = torch.zeros((size, 1, 28, 28), dtype=torch.uint8)
        labels = torch.zeros(size, dtype=torch.long)
        if pin:
            images, labels = images.pin_memory(), labels.pin_memory()
        images, labels = _to_device(images, labels, device, pin)
        net.train(training)
        if training:
            _train_step(net, optimizer, images, labels, device, config.precision, channels_last)
        else:
            with torch.no_grad(), autocast(device, config.precision):
                net(_normalise(images, channels_last))
    sync(device)
    del shadow, optimizer, net
    return time.perf_counter() - start


def _timed(device: torch.device, make):
    """`make()` and the seconds it took, its device work included (a one-off cost of the run)."""
    start = time.perf_counter()
    value = make()
    sync(device)
    return value, time.perf_counter() - start


def _diverged(epoch: int, step: int | None = None) -> Diverged:
    where = f"epoch {epoch}" + (f", step {step}" if step is not None else "")
    return Diverged(f"diverged at {where}: the training loss became NaN or inf; try a lower lr")


@dataclass
class _Training:
    """What the epochs work with: the model on the device, what the steps call (the model, or its
    compiled form: the same parameters), Adam, the fp16 loss scaler, the batches of the run's data
    path, the captured CUDA graph, and the memory layout the device prefers."""

    model: Network
    net: torch.nn.Module
    optimizer: torch.optim.Adam
    scaler: torch.amp.GradScaler | None
    loader: DeviceBatches | PinnedPrefetch | torch.utils.data.DataLoader
    channels_last: bool
    graph: GraphStep | None = None


@dataclass
class _Start:
    """Where the epochs start: epoch 1 with nothing behind it, or after a checkpoint's epoch, with the
    training seconds and the wall clock the earlier process had reached."""

    epoch: int = 1
    earlier_s: float = 0.0
    earlier_wall_s: float | None = 0.0


def _fit(
    config: RunConfig, data: Dataset, device: torch.device, hooks: Hooks, resume: dict | None, stop_at: Target | None
) -> FitResult:
    fit_start = time.perf_counter()  # each epoch's wall_clock_s counts from here
    one_off: dict[str, float] = {}
    run = _build(config, data, device, one_off)
    result = FitResult(model=run.model, one_off=one_off)
    start = _resume(run, result, resume) if resume is not None else _Start()
    hooks.model_ready(run.model)
    _prepare(run, config, data, device, result)
    hooks.before_training(result.one_off)
    meters = PeakMemory(device), EnergyMeter(device)
    run_start = time.perf_counter()
    for epoch in range(start.epoch, config.epochs + 1):
        hooks.epoch_start(epoch, len(run.loader))
        stats = _epoch(run, config, data, device, epoch, hooks, meters)
        if start.earlier_wall_s is not None:
            stats = dataclasses.replace(stats, wall_clock_s=start.earlier_wall_s + time.perf_counter() - fit_start)
        result.epochs.append(stats)
        hooks.epoch_end(stats)
        if hooks.checkpointing:
            hooks.save_state(_state(run, result, epoch, start.earlier_s + time.perf_counter() - run_start))
        if stop_at is not None and stop_at.reached(getattr(stats, stop_at.metric)):
            break
    result.duration_s = start.earlier_s + time.perf_counter() - run_start
    return result


def _build(config: RunConfig, data: Dataset, device: torch.device, one_off: dict[str, float]) -> _Training:
    """The model (initialised on the CPU by the seed, then moved: the same weights on any device),
    Adam, the fp16 scaler on CUDA, and the batches of the run's data path (a one-off upload of the
    whole set with data_on_device, timed into `one_off`)."""
    torch.manual_seed(config.seed)
    model = Network().to(device)
    channels_last = uses_channels_last(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = make_optimizer(model.parameters(), config, device, capturable=config.cuda_graph)
    cuda = device.type == "cuda"
    # fp16 has too few exponent bits for small gradients: scale the loss up, unscale before the step.
    scaler = torch.amp.GradScaler("cuda") if cuda and config.precision == "fp16" else None
    loader: DeviceBatches | PinnedPrefetch | torch.utils.data.DataLoader
    if config.data_on_device:
        loader, one_off[UPLOAD] = _timed(
            device, lambda: DeviceBatches(data.train, config.batch_size, config.shuffle, config.seed, device)
        )
    elif config.prefetch:
        loader = PinnedPrefetch(data.train, config.batch_size, config.shuffle, config.seed, device)
    else:
        loader = batches(
            data.train,
            config.batch_size,
            shuffle=config.shuffle,
            seed=config.seed,
            num_workers=config.num_workers,
            pin_memory=cuda,
        )
    return _Training(model, model, optimizer, scaler, loader, channels_last)


def _resume(run: _Training, result: FitResult, resume: dict) -> _Start:
    """A checkpoint's weights, optimizer moments, shuffling order and epochs put back."""
    run.model.load_state_dict(resume["model"])
    run.optimizer.load_state_dict(resume["optimizer"])
    run.loader.sampler.generator.set_state(resume["generator"])
    if run.scaler is not None and "scaler" in resume:
        run.scaler.load_state_dict(resume["scaler"])
    result.epochs = [EpochStats(**e) for e in resume["epochs"]]
    # The wall clock goes on from the checkpointed epoch's: the time between the two processes
    # trained nothing, and this process's own set-up counts again.
    return _Start(resume["epoch"] + 1, resume["elapsed_s"], result.epochs[-1].wall_clock_s)


def _prepare(run: _Training, config: RunConfig, data: Dataset, device: torch.device, result: FitResult) -> None:
    """The one-off costs before epoch 1, each timed into `result`: compiling (with compile), the
    warm-up, and capturing the step as a CUDA graph (with cuda_graph)."""
    if config.compile:
        torch.compiler.reset()  # each run compiles (and is timed compiling) as if it were the first
        run.net = _compiled(run.model)
    try:
        result.one_off[COMPILE if config.compile else WARMUP] = _warm_up(run.model, config, data, device)
    except Exception as exc:
        if not config.compile or isinstance(exc, torch.OutOfMemoryError):
            raise
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [exc.__class__.__name__]
        raise CompileFailed(
            f"torch.compile failed ({lines[0][:300]}); set compile: false to train this point eagerly"
        ) from exc
    if config.cuda_graph:  # the planner only lets cuda points through
        run.graph, result.one_off[CAPTURE] = _timed(
            device,
            lambda: GraphStep(
                run.model,
                run.optimizer,
                min(config.batch_size, len(data.train)),
                device,
                lambda images: _normalise(images, run.channels_last),
            ),
        )


def _epoch(
    run: _Training,
    config: RunConfig,
    data: Dataset,
    device: torch.device,
    epoch: int,
    hooks: Hooks,
    meters: tuple[PeakMemory, EnergyMeter],
) -> EpochStats:
    """One epoch: every batch moved to the device and stepped, timed by where its time went (the
    data, the copy, the compute: Clock), then the test set evaluated."""
    cuda, cpu = device.type == "cuda", device.type == "cpu"
    memory, meter = meters
    run.net.train()
    clock = Clock(device)
    memory.start()
    meter.start()
    # Accumulate on the device; reading them once per epoch avoids a host sync per step.
    # Cross-entropy is never negative, so a NaN or inf loss stays in the sum: one check per epoch.
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    graph, loader = run.graph, run.loader
    epoch_start = waiting_since = time.perf_counter()
    for step, (images, labels) in enumerate(loader, start=1):
        waited_s = time.perf_counter() - waiting_since
        before_copy = clock.mark()
        if isinstance(loader, PinnedPrefetch):  # already copied on the side stream: wait for it (the exposed transfer)
            images, labels = loader.take(images, labels)
        images, labels = graph.feed(images, labels) if graph else _to_device(images, labels, device, cuda)
        after_copy = clock.mark()
        if graph is not None and images is graph.images:
            logits, loss = graph.replay()
        else:
            logits, loss = _train_step(
                run.net, run.optimizer, images, labels, device, config.precision, run.channels_last, run.scaler
            )
        loss_sum += loss.detach() * labels.size(0)
        correct += (logits.argmax(dim=1) == labels).sum()
        if cpu and not math.isfinite(loss.item()):  # free on the CPU: stop at the step it happened
            raise _diverged(epoch, step)
        clock.step(waited_s, before_copy, after_copy, clock.mark())
        hooks.step()
        waiting_since = time.perf_counter()
    sync(device)
    epoch_s = time.perf_counter() - epoch_start
    clock.finish(epoch_s)
    peak_mb, joules = memory.read(), meter.joules()
    n = len(data.train)
    train_loss = loss_sum.item() / n
    if not math.isfinite(train_loss):
        raise _diverged(epoch)
    test_loss, test_accuracy = evaluate(run.net, data.test, device, config.precision)  # .item(): synced
    return EpochStats(
        epoch=epoch,
        train_loss=train_loss,
        train_accuracy=correct.item() / n,
        test_loss=test_loss,
        test_accuracy=test_accuracy,
        epoch_duration_s=epoch_s,
        images_per_s=n / epoch_s if epoch_s > 0 else float("inf"),
        data_time_s=clock.data,
        transfer_time_s=clock.transfer,
        compute_time_s=clock.compute,
        enqueue_time_s=clock.enqueue,
        peak_memory_mb=peak_mb,
        energy_j=joules,
        wall_clock_s=None,  # set by _fit, which knows when the run began
    )


def _state(run: _Training, result: FitResult, epoch: int, elapsed_s: float) -> dict:
    """What a resumed run needs to go on as if never stopped (Hooks.save_state)."""
    return {
        "epoch": epoch,
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "generator": run.loader.sampler.generator.get_state(),
        **({"scaler": run.scaler.state_dict()} if run.scaler is not None else {}),
        "epochs": [dataclasses.asdict(e) for e in result.epochs],
        "elapsed_s": elapsed_s,
    }
