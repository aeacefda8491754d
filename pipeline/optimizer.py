"""Adam, built and stepped without loading torch's compiler when nothing is compiled.

torch.optim wraps its methods (the constructor's add_param_group, zero_grad, state_dict, the
functional update) so that torch.compile never traces them, and Adam.step so that it inserts a graph
break; both wrappers import torch._dynamo on their first call. That import is about 2.5 s of every
pipeline process on a 2-core machine (a fifth of a one-point sweep) and buys nothing in eager mode,
where no graph exists to break or to keep out. So, while torch._dynamo is not loaded:
- each such wrapper is handed its own function as the one it calls (what it caches after the import);
- step() runs Adam's update itself, under no_grad, as the wrapper would, for optimizers without step
  hooks (the pipeline registers none).
Once torch._dynamo is loaded (a `compile: true` run, a CUDA graph capture, fp16's gradient scaler),
everything goes through torch's own methods. tests/test_train.py checks that an eager run in a fresh
process loads no compiler and that both paths learn the same numbers.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys

import torch
import torch._compile
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

_DISABLE_WRAPPER = torch._compile._disable_dynamo(lambda: None).__code__


def make(parameters, lr: float, device: torch.device, capturable: bool = False,
         weight_decay: float = 0.0) -> torch.optim.Adam:
    """Adam; fused on CUDA (one kernel for every parameter's update instead of several per tensor),
    and capturable (its step counter on the GPU) when a CUDA graph replays the step."""
    _plain_wrappers()
    cuda = device.type == "cuda"
    return torch.optim.Adam(parameters, lr=lr, weight_decay=weight_decay, fused=cuda, capturable=cuda and capturable)


def step(optimizer: torch.optim.Optimizer) -> None:
    """optimizer.step(), without the compiler's import in eager runs (see the module's note)."""
    hooked = (optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
              or _global_optimizer_pre_hooks or _global_optimizer_post_hooks)
    if "torch._dynamo" in sys.modules or hooked or optimizer.defaults.get("differentiable"):
        optimizer.step()
        return
    with torch.no_grad():
        _update(type(optimizer))(optimizer)


@functools.cache
def _update(kind: type) -> object:
    """The optimizer's own update, under its step wrappers (looked up once per class, not per step)."""
    return inspect.unwrap(kind.step)


@functools.cache
def _plain_wrappers() -> None:
    """Once per process: the wrappers are module-level, so one pass covers every optimizer."""
    if "torch._dynamo" in sys.modules:
        return
    for owner in (torch.optim.Optimizer, torch.optim.Adam, importlib.import_module("torch.optim.adam")):
        for attribute in list(vars(owner).values()):
            for function in _reachable(attribute):
                if getattr(function, "__code__", None) is _DISABLE_WRAPPER:
                    target = function.__wrapped__
                    if not hasattr(target, "__dynamo_disable"):
                        target.__dynamo_disable = target


def _reachable(function, depth: int = 4):
    """`function`, what it wraps and the functions its closure holds, a few levels deep."""
    if depth == 0 or not callable(function):
        return
    yield function
    wrapped = getattr(function, "__wrapped__", None)
    if wrapped is not None:
        yield from _reachable(wrapped, depth - 1)
    for cell in getattr(function, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if hasattr(contents, "__code__"):
            yield from _reachable(contents, depth - 1)
