"""How much arithmetic a run does: the FLOPs of one training step, counted by torch, and of an epoch.

A training step is the forward pass, the cross-entropy loss and the backward pass of the tutorial's
network (model.Network), counted with torch's public `torch.utils.flop_counter.FlopCounterMode` on
the meta device: shapes only, no data, no memory, the same count on any machine. It counts the
matrix multiplications and convolutions (a multiply-add is 2 FLOPs), which is where the arithmetic
is; the element-wise work (ReLU, pooling, the loss) and Adam's update (a few FLOPs per parameter,
about 30,000 parameters, against millions per image in the step) are left out, as model FLOPs
utilisation (MFU) conventionally leaves them. Precision, channels_last, compile and CUDA graphs
change how fast the step runs, not what it computes: the count is the same for all of them.

An epoch is every batch the loader gives (data.batches and its peers keep the last, smaller batch:
no drop_last): `train_size // batch_size` full batches and one of `train_size % batch_size` images
when that is not zero.

Bytes moved are not counted. A count of the bytes each operation reads and writes ignores the caches
(on the CPU a whole batch of this network's activations can sit in L2/L3) and what compile fuses, so
it could not say what the memory actually carried, and a bandwidth share built on it could pass 100%.
"""

from __future__ import annotations

from functools import lru_cache

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
    if train_size < 1:
        raise ValueError(f"train_size must be at least 1, not {train_size}")
    batch = min(batch_size, train_size)
    full, rest = divmod(train_size, batch)
    return full * step_flops(batch) + (step_flops(rest) if rest else 0)


def achieved_flops(flops_per_epoch: int, epoch_s: float) -> float | None:
    """FLOP/s of an epoch of `flops_per_epoch` that took `epoch_s` seconds (None when no time)."""
    if not epoch_s > _SHORTEST_EPOCH_S:
        return None
    return flops_per_epoch / epoch_s
