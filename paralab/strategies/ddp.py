"""Distributed data parallel (分布式数据并行), the way torch's DDP does it: buckets and overlap.

Gradients become ready during backward in roughly the reverse order of the forward. DDP groups the
parameters, in that order, into buckets of about ``bucket_mb`` megabytes. A hook on each parameter
counts the gradients that have arrived; when a bucket is complete its gradients are flattened into
one buffer and an asynchronous all-reduce starts at once, while backward goes on computing the
gradients of earlier layers. After backward, paralab waits for the outstanding all-reduces and
copies the averaged gradients back.

Two wins over naive data parallel: communication overlaps compute (the trace shows all-reduce spans
starting before backward ends), and a few large messages replace many small ones.
"""

from __future__ import annotations

import torch

from paralab import comm
from paralab.strategies.common import GradSync, full_model, train_data_parallel


def make_buckets(params: list[torch.nn.Parameter], bucket_bytes: float) -> list[list[torch.nn.Parameter]]:
    """Group parameters, last layer first (backward order), into buckets of at most ``bucket_bytes``
    (a parameter larger than that gets a bucket of its own)."""
    buckets, current, size = [], [], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


class BucketedReducer(GradSync):
    def __init__(self, model: torch.nn.Module, world_size: int, bucket_mb: float):
        self.world_size = world_size
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = make_buckets(params, bucket_mb * 2**20)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.pending: list[int] = [0] * len(self.buckets)
        self.buffers: list[torch.Tensor | None] = [None] * len(self.buckets)
        self.works: list = [None] * len(self.buckets)
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def before_backward(self) -> None:
        self.pending = [len(b) for b in self.buckets]
        self.works = [None] * len(self.buckets)

    def _grad_ready(self, param: torch.nn.Parameter) -> None:
        i = self.bucket_of[id(param)]
        self.pending[i] -= 1
        if self.pending[i] == 0:
            self._launch(i)

    def _launch(self, i: int) -> None:
        """The bucket is full: flatten its gradients, pre-divide by the world size, all-reduce async."""
        buffer = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
        buffer.div_(self.world_size)
        self.buffers[i] = buffer
        self.works[i] = comm.all_reduce(buffer, async_op=True, name=f"bucket {i}")

    def after_backward(self) -> None:
        for i, bucket in enumerate(self.buckets):
            if self.works[i] is None:  # a parameter got no gradient this step: reduce what there is
                for p in bucket:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                self._launch(i)
            self.works[i].wait()
            offset = 0
            for p in bucket:
                n = p.numel()
                p.grad.copy_(self.buffers[i][offset : offset + n].view_as(p))
                offset += n
            self.buffers[i] = None


def train(ctx):
    model = full_model(ctx)
    reducer = BucketedReducer(model, ctx.world_size, ctx.cfg.bucket_mb)
    return train_data_parallel(ctx, model, reducer, ctx.rank, ctx.world_size)
