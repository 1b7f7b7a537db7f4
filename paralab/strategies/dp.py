"""Naive data parallel (数据并行): every rank holds the whole model and a slice of the global batch.

After backward, every gradient is all-reduced (summed) and divided by the number of ranks, so all
ranks hold the gradient of the whole global batch and take the same optimizer step. One all-reduce
per parameter tensor, issued only after the whole backward is over: communication never overlaps
compute, and many small messages pay the latency many times. DDP (ddp.py) fixes both.
"""

from __future__ import annotations

import torch

from paralab import comm
from paralab.precision import torch_dtype
from paralab.strategies.common import GradSync, full_model, train_model
from paralab.strategies.registry import Strategy


class AllReduceEachGradient(GradSync):
    """Each gradient, divided by the world size, all-reduced on its own in ``reduce_dtype``."""

    def __init__(self, model, world_size: int, reduce_dtype: torch.dtype = torch.float32):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.world_size, self.reduce_dtype = world_size, reduce_dtype

    def after_backward(self) -> None:
        for p in self.params:
            grad = p.grad.to(self.reduce_dtype).div_(self.world_size)  # a widened copy for 16-bit grads
            comm.all_reduce(grad, name="grad")
            if grad is not p.grad:
                p.grad.copy_(grad)


def train(ctx):
    model = full_model(ctx)
    return train_model(ctx, model,
                       AllReduceEachGradient(model, ctx.layout.dp, torch_dtype(ctx.cfg.reduce_dtype)))


STRATEGIES = [Strategy("dp", "all-reduce of every gradient after backward", axes=("dp",),
                       options=("reduce_dtype",), train=train, title="data parallel (数据并行)")]
