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
from contextlib import nullcontext

import torch
from torch.distributed.device_mesh import init_device_mesh

from paralab.config import ConfigError
from paralab.models.gpt import GPT
from paralab.precision import torch_dtype
from paralab.strategies.common import GradSync, train_model
from paralab.strategies.recompute import apply_recompute
from paralab.strategies.registry import Strategy

try:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard


def check(cfg, layout) -> None:
    if cfg.dtype == "fp16":
        raise ConfigError("torch_fsdp runs bf16 (FSDP2's MixedPrecisionPolicy); fp16 would also need torch's "
                          "sharded gradient scaler, which this reference does not wire: use dtype='bf16'")

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
    # FSDP2 keeps the fp32 shards as its master weights and casts a gathered part to ``dtype`` for
    # compute (MixedPrecisionPolicy), so the model stays fp32 here and the optimizer is a plain one
    model = GPT(ctx.cfg.model, ctx.cfg.seed).to(ctx.device)
    apply_recompute(model, ctx.cfg.recompute, ctx.recorder, ctx.memory)
    policy = MixedPrecisionPolicy(param_dtype=torch_dtype(ctx.cfg.dtype),
                                  reduce_dtype=torch_dtype(ctx.cfg.reduce_dtype))
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for part in (model.embed, *model.blocks, model.head, model):
        fully_shard(part, mesh=mesh, mp_policy=policy)

    def microbatch(mb: int, last: bool):  # gradient accumulation: reduce-scatter after the last
        model.set_requires_gradient_sync(last)
        return nullcontext()

    # the parameters are DTensors: every rank takes part in gathering the full state
    return train_model(ctx, model, GradSync(), state_of=lambda: full_state(model, ctx.rank),
                       microbatch_context=microbatch)


STRATEGIES = [Strategy("torch_fsdp", "torch's FSDP2 (fully_shard)", axes=("dp",), zero=3,
                       options=("reduce_dtype",), check=check, train=train, reference_for="zero3")]
