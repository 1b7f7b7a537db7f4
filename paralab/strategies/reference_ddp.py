"""torch's own DistributedDataParallel, run through paralab's loop: the reference that tests compare
paralab's ddp gradients with, and that benchmarks time paralab's ddp against.

Its all-reduces happen inside torch (C++), so they do not appear in paralab's trace; the step spans
and compute spans do. Gradient accumulation uses DDP's ``no_sync`` for every microbatch but the
last; 16-bit gradients are reduced in ``reduce_dtype`` by a communication hook.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from paralab.precision import torch_dtype
from paralab.strategies.common import GradSync, full_model, train_model
from paralab.strategies.registry import Strategy


class _Wrapped(DistributedDataParallel):
    """Keep the unwrapped parameter names (no ``module.`` prefix) so states compare by name."""

    def named_parameters(self, *args, **kwargs):
        return self.module.named_parameters(*args, **kwargs)


def wrap_ddp(ctx, model: torch.nn.Module, group=None) -> tuple[DistributedDataParallel, object]:
    """``model`` in torch's DDP over ``group`` (default: every rank), reducing in the run's
    ``reduce_dtype``; returns it and the per-microbatch context for gradient accumulation."""
    ddp = _Wrapped(model, process_group=group, bucket_cap_mb=ctx.cfg.bucket_mb,
                   device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    reduce_dtype = torch_dtype(ctx.cfg.reduce_dtype)
    if next(model.parameters()).dtype != reduce_dtype:
        ddp.register_comm_hook(group, _reduce_in(reduce_dtype))

    def microbatch(mb: int, last: bool):
        return nullcontext() if last else ddp.no_sync()

    return ddp, microbatch


def _reduce_in(dtype: torch.dtype):
    """A DDP communication hook that averages each bucket in ``dtype`` (FSDP's reduce_dtype)."""

    def hook(group, bucket):
        buffer = bucket.buffer()
        wide = buffer.to(dtype).div_(dist.get_world_size(group))
        future = dist.all_reduce(wide, group=group, async_op=True).get_future()
        return future.then(lambda fut: buffer.copy_(fut.value()[0]))

    return hook


def train(ctx):
    ddp, microbatch = wrap_ddp(ctx, full_model(ctx))
    return train_model(ctx, ddp, GradSync(), microbatch_context=microbatch)


STRATEGIES = [Strategy("torch_ddp", "torch's DistributedDataParallel", axes=("dp",),
                       options=("bucket_mb", "reduce_dtype"), train=train, reference_for="ddp")]
