"""Distributed data parallel (分布式数据并行), the way torch's DDP does it: buckets and overlap.

Gradients become ready during backward in roughly the reverse order of the forward. DDP groups the
parameters, in that order, into buckets of about ``bucket_mb`` megabytes. A hook on each parameter
counts the gradients that have arrived; when a bucket is complete its gradients are flattened into
one buffer and an asynchronous all-reduce starts at once, while backward goes on computing the
gradients of earlier layers. After backward, paralab waits for the outstanding all-reduces and
copies the averaged gradients back.

Two wins over naive data parallel: communication overlaps compute (the trace shows all-reduce spans
starting before backward ends), and a few large messages replace many small ones.

Across nodes (``hierarchical=True``), each bucket is reduced in three steps so that only 1/L of it
(L ranks per node) crosses the slow inter-node links from each rank: reduce-scatter inside the node,
all-reduce of the shard among the ranks with the same local index on every node, all-gather inside
the node. The reduce-scatter starts from the backward hook; the other two run after backward.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from paralab import comm
from paralab.config import ConfigError
from paralab.precision import torch_dtype
from paralab.strategies.common import (
    GradSync,
    flatten_grads,
    full_model,
    make_buckets,
    train_model,
    unflatten_grads,
)
from paralab.strategies.registry import Strategy


def bucketed_sync(model: torch.nn.Module, replicas: int, bucket_mb: float, group=None, **reducer) -> GradSync:
    """DDP's buckets over ``replicas`` data-parallel ranks (:class:`BucketedReducer`), or, for one, a
    sync that only clears: it holds every gradient alone, and a flat copy of each all-reduced over a
    group of one is memory and time spent on nothing (the simulator counts no buckets there)."""
    if replicas == 1:
        return GradSync()
    return BucketedReducer(model, replicas, bucket_mb, group, **reducer)


class BucketedReducer(GradSync):
    """``group``: the data-parallel ranks (default: all). ``accumulations``: backward passes that add
    into each gradient per step (microbatches, in hybrid): a bucket is launched once, when the last
    of them has arrived, so gradients cross the wire once per step, not once per microbatch.
    ``memory``: the rank's MemoryMeter, told about the flat bucket buffers, a second copy of the
    gradients while their all-reduce is in flight."""

    def __init__(self, model: torch.nn.Module, world_size: int, bucket_mb: float, group=None,
                 accumulations: int = 1, memory=None, reduce_dtype: torch.dtype = torch.float32):
        self.world_size, self.group, self.accumulations = world_size, group, accumulations
        self.memory, self.reduce_dtype = memory, reduce_dtype
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = make_buckets(params, bucket_mb * 2**20)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.pending: list[int] = [0] * len(self.buckets)
        self.buffers: list[torch.Tensor | None] = [None] * len(self.buckets)
        self.works: list = [None] * len(self.buckets)
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def clear_grads(self, optimizer) -> None:
        """Forget last step's gradients and re-arm every bucket's count of gradients to wait for."""
        optimizer.zero_grad(set_to_none=True)
        self.pending = [len(b) * self.accumulations for b in self.buckets]
        self.works = [None] * len(self.buckets)

    def _grad_ready(self, param: torch.nn.Parameter) -> None:
        i = self.bucket_of[id(param)]
        self.pending[i] -= 1
        if self.pending[i] == 0:
            self._launch(i)

    def _launch(self, i: int) -> None:
        """The bucket is full: flatten its gradients, pre-divide by the world size, all-reduce async."""
        buffer = flatten_grads(self.buckets[i]).to(self.reduce_dtype)  # widened (a copy) for 16-bit grads
        buffer.div_(self.world_size)
        self._hold(buffer)
        self.buffers[i] = buffer
        self.works[i] = comm.all_reduce(buffer, group=self.group, async_op=True, name=f"bucket {i}")

    def _hold(self, buffer: torch.Tensor, sign: int = 1) -> None:
        if self.memory is not None:
            self.memory.hold("grads", sign * buffer.numel() * buffer.element_size())

    def _finish_bucket(self, i: int) -> None:
        self.works[i].wait()

    def after_backward(self) -> None:
        for i, bucket in enumerate(self.buckets):
            if self.works[i] is None:  # a parameter got no gradient this step: reduce what there is
                self._launch(i)
            self._finish_bucket(i)
            unflatten_grads(bucket, self.buffers[i])
            self._hold(self.buffers[i], -1)
            self.buffers[i] = None


class HierarchicalReducer(BucketedReducer):
    """Buckets reduced node by node: intra-node reduce-scatter, inter-node all-reduce, intra all-gather."""

    def __init__(self, model, world_size: int, bucket_mb: float, node_of, accumulations: int = 1, memory=None,
                 reduce_dtype: torch.dtype = torch.float32):
        super().__init__(model, world_size, bucket_mb, accumulations=accumulations, memory=memory,
                         reduce_dtype=reduce_dtype)
        nodes = sorted({node_of(r) for r in range(world_size)})
        members = {n: [r for r in range(world_size) if node_of(r) == n] for n in nodes}
        self.local_size = len(members[nodes[0]])
        if any(len(m) != self.local_size for m in members.values()):
            raise ConfigError("hierarchical all-reduce needs the same number of ranks on every node")
        me = dist.get_rank()
        # every rank creates every group, in the same order (a torch.distributed rule)
        for n in nodes:
            group = dist.new_group(members[n])
            if me in members[n]:
                self.intra = group
        for i in range(self.local_size):
            peers = [members[n][i] for n in nodes]
            group = dist.new_group(peers)
            if me in peers:
                self.inter = group
        self.shards: list[torch.Tensor | None] = [None] * len(self.buckets)

    def _launch(self, i: int) -> None:
        flat = flatten_grads(self.buckets[i]).to(self.reduce_dtype).div_(self.world_size)
        padded = -flat.numel() % self.local_size
        self.buffers[i] = torch.nn.functional.pad(flat, (0, padded)) if padded else flat
        self._hold(self.buffers[i])
        self.shards[i] = torch.empty(self.buffers[i].numel() // self.local_size, dtype=flat.dtype,
                                     device=flat.device)
        self.works[i] = comm.reduce_scatter(self.shards[i], self.buffers[i], group=self.intra, async_op=True,
                                            name=f"bucket {i} intra")

    def _finish_bucket(self, i: int) -> None:
        self.works[i].wait()
        comm.all_reduce(self.shards[i], group=self.inter, name=f"bucket {i} inter")
        comm.all_gather(self.buffers[i], self.shards[i], group=self.intra, name=f"bucket {i} intra")
        self.shards[i] = None


def check(cfg, layout) -> None:
    if not cfg.hierarchical:
        return
    if _launched_on_one_node():
        raise ConfigError("hierarchical all-reduce needs ranks on at least 2 nodes: this launcher started "
                          "every rank on one node; start it on several (torchrun --nnodes 2 or more)")
    if layout.nodes < 2 and not _launched_by_torchrun():
        raise ConfigError("hierarchical all-reduce needs ranks on at least 2 nodes: set nodes=2 (emulated "
                          "nodes on this machine) or start the run with torchrun on several nodes")


def _launched_on_one_node() -> bool:
    """Whether a launcher that names each rank's node (torchrun, paralab's agents) started every rank on
    one node, where the three steps would be a reduce-scatter and an all-gather among every rank: a flat
    all-reduce in two halves. Every rank reads the same answer (nodes of unequal size go on to the
    reducer's own refusal, on every rank alike)."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return _launched_by_torchrun() and local is not None and local == os.environ.get("WORLD_SIZE")


def _launched_by_torchrun() -> bool:
    """A rank of torchrun (or of paralab's agents, torchrun's too), which names each rank's node; a
    GROUP_RANK alone is one left in a shell, and a local run's nodes are its config's."""
    from paralab.runtime.torchrun import under_torchrun

    return under_torchrun() and "GROUP_RANK" in os.environ


def train(ctx):
    model, reduce_dtype = full_model(ctx), torch_dtype(ctx.cfg.reduce_dtype)
    shared = dict(accumulations=ctx.layout.microbatches, memory=ctx.memory, reduce_dtype=reduce_dtype)
    if ctx.cfg.hierarchical:
        reducer = HierarchicalReducer(model, ctx.world_size, ctx.cfg.bucket_mb, ctx.recorder.node_of,
                                      **shared)
    else:
        reducer = bucketed_sync(model, ctx.world_size, ctx.cfg.bucket_mb, **shared)
    return train_model(ctx, model, reducer)


STRATEGIES = [Strategy("ddp", "bucketed all-reduce overlapped with backward; `--hierarchical` across nodes",
                       axes=("dp",), options=("bucket_mb", "hierarchical", "reduce_dtype"), check=check,
                       train=train, title="distributed data parallel (分布式数据并行)")]
