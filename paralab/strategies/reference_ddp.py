"""torch's own DistributedDataParallel, run through paralab's loop: the reference that tests compare
paralab's ddp gradients with, and that benchmarks time paralab's ddp against.

Its all-reduces happen inside torch (C++), so they do not appear in paralab's trace; the step spans
and compute spans do. Gradient accumulation uses DDP's ``no_sync`` for every microbatch but the
last; 16-bit gradients are reduced in ``reduce_dtype`` by a communication hook.

The memory meter is told what torch keeps out of its sight: DDP's flat buckets, a copy of every
gradient in its own dtype for the life of the model (``gradient_as_bucket_view=False``, the
default), and the hook's widened copy of a bucket while it is on the wire.
"""

from __future__ import annotations

import re
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
    ctx.memory.hold("grads", _bucket_bytes(ddp))
    reduce_dtype = torch_dtype(ctx.cfg.reduce_dtype)
    if next(model.parameters()).dtype != reduce_dtype:
        ddp.register_comm_hook(group, _reduce_in(reduce_dtype, ctx.memory))

    def microbatch(mb: int, last: bool):
        return nullcontext() if last else ddp.no_sync()

    return ddp, microbatch


def _bucket_bytes(ddp: DistributedDataParallel) -> int:
    """The bytes of the flat buckets DDP allocated as it was built, as torch's own logging reports them
    (rebuilt after the first step into other buckets of the same total); none when the gradients are
    views into them."""
    logged = ddp._get_ddp_logging_data()
    if logged["gradient_as_bucket_view"]:
        return 0
    return sum(int(n) for n in re.findall(r"\d+", logged["bucket_sizes"]))


def _reduce_in(dtype: torch.dtype, memory):
    """A DDP communication hook that averages each bucket in ``dtype`` (FSDP's reduce_dtype). The widened
    copy lives only while its all-reduce is on the wire, inside the backward, where the meter does not
    otherwise look: it is sampled as it is made."""

    def hook(group, bucket):
        buffer = bucket.buffer()
        wide = buffer.to(dtype).div_(dist.get_world_size(group))
        held = wide.numel() * wide.element_size()
        memory.hold("grads", held)
        memory.sample()
        future = dist.all_reduce(wide, group=group, async_op=True).get_future()

        def copy_back(fut):
            memory.hold("grads", -held)
            return buffer.copy_(fut.value()[0])

        return future.then(copy_back)

    return hook


def train(ctx):
    ddp, microbatch = wrap_ddp(ctx, full_model(ctx))
    return train_model(ctx, ddp, GradSync(), microbatch_context=microbatch)


STRATEGIES = [Strategy("torch_ddp", "torch's DistributedDataParallel", axes=("dp",),
                       options=("bucket_mb", "reduce_dtype"), train=train, reference_for="ddp")]
