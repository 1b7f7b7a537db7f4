"""torch's own 2D parallelism, DistributedDataParallel over DTensor tensor parallel: the reference
that benchmarks time paralab's ``hybrid`` (dp x tp, pp = 1) against.

A 2D DeviceMesh ("dp", "tp") with tp innermost, as in hybrid: the single-device GPT is cut with
``parallelize_module`` over the tp dim (the plan of reference_tensor.py) and wrapped in
DistributedDataParallel over the dp dim. DDP does not take DTensor parameters, so
``_pre_dp_module_transform`` (torch's documented bridge for DDP + TP) hands it local tensors and
rebuilds the DTensors around each forward. Collectives run inside torch, so they are not in
paralab's trace; the step, forward and backward spans are.
"""

from __future__ import annotations

import dataclasses

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel, parallelize_module
from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform
from torch.nn.parallel import DistributedDataParallel

from paralab.config import ConfigError
from paralab.models.gpt import lm_loss
from paralab.strategies import tensor
from paralab.strategies.common import GradSync, full_model, run_steps
from paralab.strategies.reference_tensor import SplitQKVAttention, tensor_parallel_plan


def validate(cfg) -> None:
    """dp x tp = world size, tp valid for the model; no pipeline, one batch per step."""
    tp = cfg.tp
    if cfg.pp != 1 or cfg.microbatches != 1 or cfg.schedule or cfg.zero:
        raise ConfigError("torch_hybrid is DDP over DTensor tensor parallel: it takes dp and tp only "
                          "(pp=1, microbatches=1, no schedule, no zero)")
    dp = cfg.dp or cfg.world_size // tp
    if dp * tp != cfg.world_size:
        raise ConfigError(f"torch_hybrid needs dp x tp = world size: {dp} x {tp} != {cfg.world_size}")
    cfg.dp = dp
    if cfg.global_batch % dp:
        raise ConfigError(f"global batch {cfg.global_batch} is not divisible by dp={dp}")
    tensor.validate(dataclasses.replace(cfg, world_size=tp))


def train(ctx):
    cfg = ctx.cfg
    mesh = init_device_mesh(ctx.device.type, (cfg.dp, cfg.tp), mesh_dim_names=("dp", "tp"))
    dp_rank, tp_rank = mesh.get_coordinate()
    model = full_model(ctx)
    for block in model.blocks:
        block.attn = SplitQKVAttention(block.attn)
    parallelize_module(model, mesh["tp"], tensor_parallel_plan(cfg.model.layers, cfg.sequence_parallel))
    _pre_dp_module_transform(model)
    ddp = DistributedDataParallel(model, process_group=mesh.get_group("dp"), bucket_cap_mb=cfg.bucket_mb,
                                  device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    with loss_parallel():
        losses = run_steps(ctx, ddp.parameters(), lambda inputs, targets: lm_loss(ddp(inputs), targets),
                           GradSync(), dp_rank, cfg.dp)
    return ctx.result(losses if tp_rank == 0 else None, loss_weight=1.0 / cfg.dp)
