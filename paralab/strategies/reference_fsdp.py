"""torch's own FSDP2 (``fully_shard``), run through paralab's loop: the reference that zero3's losses are
tested against and that benchmarks time zero3 against.

Each part of the model (embed, every block, the head) and then the root is wrapped with
``fully_shard``, the same units zero3 gathers, so both do the same collectives on the same buffers.
FSDP2's all-gathers and reduce-scatters happen inside torch, so they do not appear in paralab's
trace; the step and compute spans do.

Memory is counted from what FSDP2 holds (:func:`fsdp2_held`): the parameters' local shards and
their gradients' (DTensors), each part's gathered weights while they are gathered (FSDP2 frees a
storage by resizing it to nothing, and a weight autograd saves for backward is one of these, not an
activation) and the flat all-gather output they are copied out of, each part's whole gradients from
autograd's accumulation to their reduce-scatter, and the reduce-scatter's input while FSDP2 keeps
it. The meter samples three times a part, where those peak (:func:`_sample_where_fsdp2_peaks`).
These are FSDP2's private attributes; on a torch whose FSDP2 names its parameter groups otherwise
the meter counts the shards and their gradients alone.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch.distributed.device_mesh import init_device_mesh

from paralab.config import ConfigError
from paralab.memory import local
from paralab.models.gpt import GPT
from paralab.precision import torch_dtype
from paralab.strategies.common import GradSync, train_model
from paralab.strategies.recompute import apply_recompute
from paralab.strategies.registry import Strategy

try:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


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


def _param_groups(model: torch.nn.Module) -> list:
    """FSDP2's parameter groups, one per wrapped part with parameters (none on a torch whose FSDP2
    names them otherwise)."""
    groups = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            many = getattr(state, "_fsdp_param_groups", None)  # torch 2.13: a list; before, one or None
            groups += many if many is not None else [g for g in [getattr(state, "_fsdp_param_group", None)]
                                                    if g is not None]
    return groups


def fsdp2_held(groups: list) -> Callable[[], dict]:
    """What FSDP2 holds on this rank through its parameter groups (:func:`_param_groups`), for
    :meth:`paralab.memory.MemoryMeter.count_held`: the shards and their gradients, and while they
    live each part's gathered weights, the flat all-gather output they are copied out of (kept, in
    the forward, until the next part's copy-out), its whole gradients and the reduce-scatter inputs
    FSDP2 keeps until a later part's reduce-scatter needs their place."""

    def held() -> dict:
        params, grads = [], []
        for group in groups:
            for param in group.fsdp_params:  # not model.parameters(): a gathered part's are its gathered
                shard = param.sharded_param
                params.append(local(shard))
                grads.append(None if shard.grad is None else local(shard.grad))
                gathered = getattr(param, "_unsharded_param", None)  # made at the part's first gather
                if gathered is not None:
                    params += [gathered]
                    grads += [gathered.grad]
            params += _all_gather_outputs(group)
            grads += [state.reduce_scatter_input for state in _reduce_scatter_states(group)]
        return {"params": params, "grads": grads}

    return held


def _all_gather_outputs(group) -> list:
    """The flat all-gather outputs FSDP2 holds: the group's own until its copy-out ends, and the one
    the forward keeps until the next part's copy-out (``comm_ctx.all_gather_state``)."""
    gathering = getattr(group, "_all_gather_result", None)
    kept = getattr(getattr(group, "comm_ctx", None), "all_gather_state", None)
    results = [gathering, getattr(kept, "all_gather_result", None)]
    return [r.all_gather_output for r in results if getattr(r, "all_gather_output", None) is not None]


def _reduce_scatter_states(group) -> list:
    """The reduce-scatters whose inputs FSDP2 keeps: a list in torch 2.13, one or None before."""
    comm_ctx = getattr(group, "comm_ctx", None)
    states = getattr(comm_ctx, "reduce_scatter_states", None)
    if states is None:
        state = getattr(comm_ctx, "reduce_scatter_state", None)
        states = [] if state is None else [state]
    return states


def _sample_where_fsdp2_peaks(model: torch.nn.Module, groups: list, meter) -> None:
    """Sample the meter where FSDP2's own buffers peak, out of the loop's sight, three times a part
    (a sample a gradient had cost torch_fsdp's step 10-20%): as its gathered weights are copied out
    of the flat all-gather output (both held; the group's ``_to_unsharded``, which FSDP2 calls right
    after the copy-out, is wrapped); as its backward's first gradient lands (the rematerialised
    activations of a recomputed part still held; hooked on the part's last parameter, the first
    graded, once the first forward has made the gathered weights, which FSDP2 keeps from step to
    step); and as its reduction starts (``post_backward``: its whole gradients, the reduce-scatter
    input still kept, the next part's weights being gathered)."""
    for group in groups:
        for name, sample_after in (("_to_unsharded", True), ("post_backward", False)):
            call = getattr(group, name, None)
            if call is not None:
                setattr(group, name, _with_a_sample(call, meter, after=sample_after))

    def hook(module, args, output):
        for group in groups:
            gathered = getattr(group.fsdp_params[-1], "_unsharded_param", None)
            if gathered is not None and gathered.requires_grad:
                gathered.register_post_accumulate_grad_hook(lambda _: meter.sample())
        handle.remove()

    handle = model.register_forward_hook(hook)


def _with_a_sample(call: Callable, meter, after: bool) -> Callable:
    """``call``, the meter sampled before it runs or, ``after``, once it has."""

    def sampled(*args, **kwargs):
        if not after:
            meter.sample()
        out = call(*args, **kwargs)
        if after:
            meter.sample()
        return out

    return sampled


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
    groups = _param_groups(model)
    if groups:  # else the meter counts the parameters' local shards and their gradients alone
        ctx.memory.count_held(fsdp2_held(groups))
        _sample_where_fsdp2_peaks(model, groups, ctx.memory)

    # Every microbatch's gradients are reduce-scattered, as zero3 does: FSDP2's
    # set_requires_gradient_sync(False) would keep every part's whole gradient between microbatches
    # and run other collectives than the strategy it is the reference for. The parameters are
    # DTensors: every rank takes part in gathering the full state.
    return train_model(ctx, model, GradSync(), state_of=lambda: full_state(model, ctx.rank))


STRATEGIES = [Strategy("torch_fsdp", "torch's FSDP2 (fully_shard)", axes=("dp",), zero=3,
                       options=("reduce_dtype",), check=check, train=train, reference_for="zero3")]
