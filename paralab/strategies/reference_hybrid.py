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

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel, parallelize_module
from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

from paralab.strategies import tensor
from paralab.strategies.common import GradSync, full_model, train_model
from paralab.strategies.reference_ddp import wrap_ddp
from paralab.strategies.reference_tensor import SplitQKVAttention, tensor_parallel_plan
from paralab.strategies.registry import Strategy, check_reduce_dtype_applies


def check(cfg, layout) -> None:
    tensor.check(cfg, layout)
    check_reduce_dtype_applies(cfg, layout.dp > 1,
                               "torch_hybrid's DDP reduces over dp, and this run has dp = 1")


def train(ctx):
    cfg, layout = ctx.cfg, ctx.layout
    mesh = init_device_mesh(ctx.device.type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
    model = full_model(ctx)
    for block in model.blocks:
        block.attn = SplitQKVAttention(block.attn)
    parallelize_module(model, mesh["tp"], tensor_parallel_plan(cfg.model.layers, layout.sequence_parallel))
    _pre_dp_module_transform(model)
    ddp, microbatch = wrap_ddp(ctx, model, mesh.get_group("dp"))
    with loss_parallel():  # state_of: DTensor names differ from GPT's
        return train_model(ctx, ddp, GradSync(), state_of=lambda: None, microbatch_context=microbatch)


STRATEGIES = [Strategy("torch_hybrid", "DDP over DTensor tensor parallel on a 2-D mesh", axes=("dp", "tp"),
                       options=("sequence_parallel", "bucket_mb", "reduce_dtype"), check=check, train=train,
                       reference_for="hybrid")]
