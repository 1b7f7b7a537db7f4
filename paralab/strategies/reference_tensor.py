"""torch's own tensor parallel (DTensor ``parallelize_module``) on the same GPT: the reference that
tests compare paralab's tp losses with, and that benchmarks time it against.

The single-device GPT is built (same seeds, so the same initial weights) and handed to
``parallelize_module`` with ColwiseParallel / RowwiseParallel, plus SequenceParallel on the LayerNorms
for the sequence-parallel variant; the loss is torch's ``loss_parallel`` cross-entropy on logits
sharded along the vocabulary. Its collectives run inside DTensor, so they are not in paralab's trace;
the step, forward and backward spans are.
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from paralab.strategies.common import GradSync, full_model, train_model
from paralab.strategies.registry import Strategy
from paralab.strategies.tensor import check


class SplitQKVAttention(nn.Module):
    """paralab.models.gpt.Attention with its fused QKV cut into q, k and v projections.

    ColwiseParallel cuts a weight into contiguous row blocks, which for a fused QKV would give rank 0
    all of q and part of k; three separate projections each split by heads instead. The forward reads
    the local head count from the local output's shape."""

    def __init__(self, fused):
        super().__init__()
        self.head_dim, self.core, self.proj = fused.head_dim, fused.core, fused.proj
        hidden = fused.proj.in_features
        weights, biases = fused.qkv.weight.chunk(3), fused.qkv.bias.chunk(3)
        for name, w, b in zip("qkv", weights, biases):
            linear = nn.Linear(hidden, hidden)
            linear.weight, linear.bias = nn.Parameter(w.detach().clone()), nn.Parameter(b.detach().clone())
            setattr(self, name, linear)

    def forward(self, x):
        b, s = x.shape[:2]
        q, k, v = (getattr(self, n)(x).view(b, s, -1, self.head_dim).transpose(1, 2) for n in "qkv")
        return self.proj(self.core(q, k, v).transpose(1, 2).reshape(b, s, -1))


def tensor_parallel_plan(layers: int, sequence_parallel: bool) -> dict:
    """parallelize_module's plan: module path -> style. Activations are (batch, seq, hidden), so the
    sequence shard is Shard(1)."""
    between_blocks = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "embed.tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "head.lm": ColwiseParallel(input_layouts=between_blocks, output_layouts=Shard(-1),
                                   use_local_output=False),
    }
    if sequence_parallel:
        # the learned position embedding is added to the whole sequence, then each rank keeps its slice
        plan["embed"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
        plan["head.ln"] = SequenceParallel()
    for i in range(layers):
        block = f"blocks.{i}"
        for proj in ("q", "k", "v"):
            plan[f"{block}.attn.{proj}"] = ColwiseParallel()
        plan[f"{block}.attn.proj"] = RowwiseParallel(output_layouts=between_blocks)
        plan[f"{block}.mlp.fc"] = ColwiseParallel()
        plan[f"{block}.mlp.proj"] = RowwiseParallel(output_layouts=between_blocks)
        if sequence_parallel:
            for norm, region in (("ln1", "attn"), ("ln2", "mlp")):
                plan[f"{block}.{norm}"] = SequenceParallel()
                plan[f"{block}.{region}"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                               desired_input_layouts=(Replicate(),))
    return plan


def train(ctx):
    cfg = ctx.cfg
    model = full_model(ctx)
    for block in model.blocks:
        block.attn = SplitQKVAttention(block.attn)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    parallelize_module(model, mesh, tensor_parallel_plan(cfg.model.layers, ctx.layout.sequence_parallel))
    with loss_parallel():  # the vocabulary-parallel cross-entropy, in forward and in backward
        return train_model(ctx, model, GradSync(), state_of=lambda: None)  # DTensor names differ from GPT's


STRATEGIES = [Strategy("torch_tp", "torch's DTensor tensor parallel (parallelize_module)", axes=("tp",),
                       options=("sequence_parallel",), check=check, train=train, reference_for="tp")]
