"""How much arithmetic a run does, and how many bytes it moves: the FLOPs and the bytes of one
training step, counted by torch, and of an epoch.

A training step is the forward pass, the cross-entropy loss and the backward pass of the tutorial's
network (model.Network). FLOPs are counted with torch's public `torch.utils.flop_counter.FlopCounterMode`
on the meta device: shapes only, no data, no memory, the same count on any machine. It counts the
matrix multiplications and convolutions (a multiply-add is 2 FLOPs), which is where the arithmetic
is; the element-wise work (ReLU, pooling, the loss) and Adam's update (a few FLOPs per parameter,
about 30,000 parameters, against millions per image in the step) are left out, as model FLOPs
utilisation (MFU) conventionally leaves them. Precision, channels_last, compile and CUDA graphs
change how fast the step runs, not what it computes: the FLOP count is the same for all of them.

Bytes are counted on the step as eager PyTorch runs it, one kernel per operation: torch's public
`make_fx` traces the step (the uint8 batch turned to floats, forward, loss, and the gradients by
`torch.autograd.grad`) on fake tensors, which carry shapes and dtypes but no data, and each aten
operation in the trace counts the bytes of its tensor inputs and outputs (views and aliases move
nothing and count nothing). That is the traffic of the unfused step if no cache kept anything
between kernels: an upper bound on what memory carries. A cache that holds a batch's activations
(on a CPU a whole batch can sit in L2/L3, on a GPU a small one in L2) and compile's fusion (one
kernel for several operations, the intermediates never written) make the real traffic smaller, so a
bandwidth share built on the count is only told where it means something (peak.bandwidth_share).
Unlike FLOPs, bytes depend on precision: bf16 and fp16 runs are traced under torch.autocast at
their dtype, as train.autocast runs them (weights, gradients and the loss stay fp32, the
convolutions and linear layers and their activations run at 2 bytes, with the casts between them
counted). The trace uses the CPU's autocast, whose choices for this network's operations are those
of CUDA's. Adam's update is left out as it is from the FLOPs: fused, it reads and writes 28 bytes per
parameter, about 0.9 MB a step, 4% of a 100-image fp32 step's count (23 MB) and less for larger batches.

An epoch is every batch the loader gives (data.batches and its peers keep the last, smaller batch:
no drop_last): `train_size // batch_size` full batches and one of `train_size % batch_size` images
when that is not zero.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.fx

# A steady-state epoch time under this is not a time a FLOP rate can be read from.
_SHORTEST_EPOCH_S = 1e-9


@lru_cache(maxsize=64)
def step_flops(batch_size: int) -> int:
    """FLOPs of one training step (forward, loss, backward) of model.Network on `batch_size` images,
    as FlopCounterMode counts them. Counted once per batch size in a process."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline.model import Network

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    with torch.device("meta"):  # shapes only: nothing is allocated or computed
        model = Network()
        images = torch.empty(batch_size, 1, 28, 28)
        labels = torch.zeros(batch_size, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(images), labels).backward()
    return int(counter.get_total_flops())


def epoch_flops(train_size: int, batch_size: int) -> int:
    """FLOPs of one training epoch over `train_size` images in batches of `batch_size`: the full
    batches, then the last, smaller one where the size does not divide evenly (the loaders keep it)."""
    return _per_epoch(train_size, batch_size, step_flops)


def step_bytes(batch_size: int, precision: str = "fp32") -> int:
    """Bytes one eager training step (the batch's uint8 images to floats, forward, loss, backward) of
    model.Network on `batch_size` images at `precision` reads and writes, one kernel per operation
    and nothing kept in a cache (graph_bytes of its make_fx trace): an upper bound on its memory
    traffic. Every tensor of the step is either an image's (its size in proportion to the batch) or
    the weights' (a fixed size), so the count is affine in the batch size: traced at 1 and 2 images,
    once per precision in a process, it is exact at any size (tests/test_flops.py checks it against
    traced_step_bytes). A trace takes about half a second: a run no longer pays one per batch size."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    one, two = traced_step_bytes(1, precision), traced_step_bytes(2, precision)
    return one + (batch_size - 1) * (two - one)


@lru_cache(maxsize=8)
def traced_step_bytes(batch_size: int, precision: str = "fp32") -> int:
    """step_bytes by a make_fx trace of the step at `batch_size`, on fake tensors: the images are an
    uninitialised uint8 buffer that is never read."""
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    from pipeline.model import Network
    from pipeline.training.train import autocast

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be fp32, bf16 or fp16, not {precision!r}")
    model = Network()  # on the CPU: autocast has no meta device; 33,000 parameters, read as fakes
    names = [name for name, _ in model.named_parameters()]
    images = torch.empty(batch_size, 1, 28, 28, dtype=torch.uint8)
    labels = torch.empty(batch_size, dtype=torch.long)

    def step(images: torch.Tensor, labels: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # As train._train_step runs it: the batch normalised and the loss taken under autocast.
        with autocast(torch.device("cpu"), precision):
            logits = functional_call(model, dict(zip(names, weights)), (torch.div(images, 255),))
            loss = F.cross_entropy(logits, labels)
        return tuple(torch.autograd.grad(loss, weights))

    traced = make_fx(step, tracing_mode="fake")(images, labels, *model.parameters())
    return graph_bytes(traced)


def graph_bytes(traced: torch.fx.GraphModule) -> int:
    """Bytes a graph of aten operations (as make_fx traces them) moves when each operation is one
    kernel that reads its tensor inputs and writes its outputs whole: the sum, over the operations,
    of their inputs' and outputs' sizes (node.meta["val"]). A view (an operation whose schema says it
    aliases its input: t, view, alias) moves nothing, nor does picking one output of several."""
    total = 0
    for node in traced.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem or getattr(node.target, "is_view", False):
            continue
        total += sum(_nbytes(arg.meta.get("val")) for arg in node.all_input_nodes) + _nbytes(node.meta.get("val"))
    return total


def _nbytes(value: object) -> int:
    """The bytes of a tensor, or of the tensors in a tuple or list (an operation's several outputs)."""
    import torch

    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(item) for item in value)
    return 0


def epoch_bytes(train_size: int, batch_size: int, precision: str = "fp32") -> int:
    """Bytes of one training epoch (step_bytes), its batches counted as epoch_flops counts them."""
    return _per_epoch(train_size, batch_size, lambda batch: step_bytes(batch, precision))


def _per_epoch(train_size: int, batch_size: int, per_step: Callable[[int], int]) -> int:
    """`per_step` summed over an epoch's batches: the full ones, then the last, smaller one where
    `train_size` does not divide evenly (the loaders keep it)."""
    if train_size < 1:
        raise ValueError(f"train_size must be at least 1, not {train_size}")
    batch = min(batch_size, train_size)
    full, rest = divmod(train_size, batch)
    return full * per_step(batch) + (per_step(rest) if rest else 0)


def achieved_flops(flops_per_epoch: int, epoch_s: float) -> float | None:
    """FLOP/s of an epoch of `flops_per_epoch` that took `epoch_s` seconds (None when no time)."""
    if not epoch_s > _SHORTEST_EPOCH_S:
        return None
    return flops_per_epoch / epoch_s
