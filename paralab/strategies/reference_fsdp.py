"""torch's own FSDP2 (``fully_shard``), run through paralab's loop: the reference that zero3's losses are
tested against and that benchmarks time zero3 against.

Each part of the model (embed, every block, the head) and then the root is wrapped with
``fully_shard``, the same units zero3 gathers, so both do the same collectives on the same buffers.
FSDP2's all-gathers and reduce-scatters happen inside torch, so they do not appear in paralab's
trace; the step and compute spans do. Its parameters are DTensors: memory is counted from their
local shards (the parameters FSDP2 gathers for a part's forward and that autograd saves show up
as activations).
"""

from __future__ import annotations

import warnings

import torch
from torch.distributed.device_mesh import init_device_mesh

from paralab.strategies.common import GradSync, full_model, train_model
from paralab.strategies.registry import Strategy

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import fully_shard

def full_state(model: torch.nn.Module, rank: int) -> dict | None:
    """Full parameters and gradients (every rank takes part in the gathers; rank 0 keeps them)."""
    params, grads = {}, {}
    for name, p in model.named_parameters():
        params[name] = p.full_tensor().detach().cpu().clone()
        if p.grad is not None:
            grads[name] = p.grad.full_tensor().cpu().clone()
    return {"params": params, "grads": grads} if rank == 0 else None


def train(ctx):
    # The head's logits come out of a matmul as a view; nothing here changes them in place, which is
    # the only case FSDP2's warning is about.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    model = full_model(ctx)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for part in (model.embed, *model.blocks, model.head):
        fully_shard(part, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # the parameters are DTensors: every rank takes part in gathering the full state
    return train_model(ctx, model, GradSync(), state_of=lambda: full_state(model, ctx.rank))


STRATEGIES = [Strategy("torch_fsdp", "torch's FSDP2 (fully_shard)", axes=("dp",), zero=3, train=train,
                       reference_for="zero3")]
