"""`cuda_graph: true`: the training step captured once as a CUDA graph and replayed every step.

At batch size 1000 a big GPU is launch-bound: Python launches about 60 kernels per step (forward,
backward, Adam) in more time than the GPU takes to run them. A replayed graph launches them all at
once. Every batch is still moved to the device at every step, as the tutorial teaches: it is
copied into the graph's fixed input buffers (that copy is the step's transfer). A batch of another
size (the epoch's last) takes the ordinary eager step on the same model and optimizer.

Capture needs a few warm-up steps on a side stream; they change the weights and the optimizer's
moments, so both are put back afterwards (in place: the graph holds their addresses). Adam runs
fused and `capturable` (its step counter lives on the GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_WARMUP_STEPS = 3


class GraphStep:
    def __init__(self, model, optimizer, batch_size: int, device: torch.device, normalise) -> None:
        self.batch_size = batch_size
        self.images = torch.zeros((batch_size, 1, 28, 28), dtype=torch.uint8, device=device)
        self.labels = torch.zeros(batch_size, dtype=torch.long, device=device)
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        moments = {p: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for p, s in optimizer.state.items()}
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_STEPS):
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(normalise(self.images)), self.labels).backward()
                optimizer.step()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self.logits = model(normalise(self.images))
            self.loss = F.cross_entropy(self.logits, self.labels)
            self.loss.backward()
            optimizer.step()
        # The outputs' memory is what each replay writes; detached, they no longer keep the captured
        # autograd graph alive, whose gradient nodes belong to the capture stream (an eager step on
        # the last, smaller batch would otherwise warn and synchronise with that stream).
        self.logits, self.loss = self.logits.detach(), self.loss.detach()
        with torch.no_grad():
            for key, value in model.state_dict().items():
                value.copy_(weights[key])
            for param, state in optimizer.state.items():
                for key, value in state.items():
                    if not torch.is_tensor(value):
                        continue
                    if param in moments:  # resumed from a checkpoint: its moments
                        value.copy_(moments[param][key])
                    else:  # a fresh optimizer: no moments yet, step 0
                        value.zero_()

    def feed(self, images: torch.Tensor, labels: torch.Tensor):
        """The step's transfer: a full batch into the graph's buffers, any other moved as usual."""
        if labels.size(0) != self.batch_size:
            return images.to(self.images.device, non_blocking=True), labels.to(self.labels.device, non_blocking=True)
        self.images.copy_(images, non_blocking=True)
        self.labels.copy_(labels, non_blocking=True)
        return self.images, self.labels

    def replay(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The captured step on what feed() copied in: (logits, loss), valid until the next replay."""
        self.graph.replay()
        return self.logits, self.loss
