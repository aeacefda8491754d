"""Where a training epoch's time goes: data, transfer and compute, on the CPU and on CUDA."""

from __future__ import annotations

import time

import torch


def sync(device: torch.device) -> None:
    # Kernels run asynchronously on CUDA and MPS: wait for them before reading a clock.
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class Clock:
    """Charges each training step's time to data, transfer or compute.

    data: the host waiting for the next batch from the DataLoader (gathering, worker hand-off).
    transfer: the host-to-device copy of the batch. compute: normalisation, forward, backward and
    the optimizer step (with `prefetch` the copy runs ahead on a side stream, and transfer is only
    what the step still waits for it). On the CPU these are perf_counter intervals. On CUDA the work is
    asynchronous, so transfer and compute are GPU times from CUDA events recorded around them (read
    once, after the epoch's final synchronisation; no sync per step), and data is the rest of the
    epoch: the time the GPU sat waiting for the host. enqueue is the host's own time in the compute
    calls: on CUDA the time spent launching kernels (when it nears compute, the GPU waits on Python);
    on the CPU, where nothing is asynchronous, it equals compute.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.data = self.transfer = self.compute = self.enqueue = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event]] = []

    def mark(self) -> tuple[float, torch.cuda.Event | None]:
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        return time.perf_counter(), event

    def step(self, waited_s: float, before_copy, after_copy, after_compute) -> None:
        self.data += waited_s
        self.enqueue += after_compute[0] - after_copy[0]
        if self.cuda:
            self._events.append((before_copy[1], after_copy[1], after_compute[1]))
        else:
            self.transfer += after_copy[0] - before_copy[0]
            self.compute += after_compute[0] - after_copy[0]

    def finish(self, epoch_s: float) -> None:
        """Call after the epoch's synchronisation."""
        if self.cuda:
            self.transfer = sum(a.elapsed_time(b) for a, b, _ in self._events) / 1000
            self.compute = sum(b.elapsed_time(c) for _, b, c in self._events) / 1000
            self.data = max(epoch_s - self.transfer - self.compute, 0.0)
