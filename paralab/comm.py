"""Every collective and point-to-point call of paralab goes through here and is traced.

Each call records a comm-lane span with the op, the tensor size given (``payload_bytes``) and the
bytes this rank puts on the wire under a ring algorithm (``bytes``), using NCCL's bus-bandwidth
accounting so numbers compare with nccl-tests:

=================  ===================================  =========================================
op                 payload                              wire bytes per rank
=================  ===================================  =========================================
all_reduce         the tensor                           2 (n-1)/n x tensor
all_gather         the full (gathered) tensor           (n-1)/n x full tensor
reduce_scatter     the full (input) tensor              (n-1)/n x full tensor
broadcast          the tensor                           (n-1)/n x tensor (pipelined ring)
all_to_all         the input (every slice sent)         the slices sent to the other ranks
send / recv        the tensor                           tensor for the sender, 0 for the receiver
=================  ===================================  =========================================

Async forms return a :class:`TracedWork` whose ``wait()`` closes the span, so a span runs from
when the operation was issued to when its result was waited for: for an overlapped all-reduce that
is the window in which communication could run beside compute. The rank's own thread is inside a
call for the span's ``issue_s`` (all of a blocking call; an async one's issue, which on a busy CPU can
take milliseconds) and ``waited_s`` (an async call's ``wait()``). Compute spans around those stretches
(a tensor-parallel layer's all-reduce inside its forward) did not compute in them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paralab.runtime import recorder as _recorder
from paralab.trace import COMM
from paralab.wire import all_to_all_wire_bytes, ring_wire_bytes

ReduceOp = dist.ReduceOp
# torch 2.13 renamed the flat-tensor collectives; older releases (2.4+) have only the first names.
# Untraced: what all_gather and reduce_scatter below call, and what the calibration times.
all_gather_into_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def wire_bytes(op: str, payload: int, group_size: int) -> int:
    """Bytes one rank sends for ``op`` on ``payload`` bytes in a ring of ``group_size`` ranks."""
    return int(ring_wire_bytes(op, payload, group_size))


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def ring_next(rank: int, members: list[int]) -> int:
    """``rank``'s successor in a ring over ``members`` (ascending order): where its wire bytes go.

    In a ring collective every rank sends all its wire bytes to its successor, so a span's bytes cross
    nodes exactly when the successor lives on another node: a flat ring over two nodes of L ranks
    crosses at 2 of its 2L links, a ring over one rank per node crosses at every link."""
    ranks = sorted(members)
    return ranks[(ranks.index(rank) + 1) % len(ranks)]


def _group_ranks(group) -> list[int]:
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(group)


class TracedWork:
    """A pending async op; ``wait()`` finishes it and closes its span."""

    def __init__(self, work, handle, recorder):
        self._work, self._handle, self._recorder = work, handle, recorder

    def wait(self) -> None:
        if self._handle is not None:
            self._handle.mark("wait")
        if self._work is not None:
            self._work.wait()
            self._work = None
        if self._recorder is not None and self._handle is not None:
            self._recorder.close(self._handle)
            self._handle = None

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()


def _traced(op: str, payload: int, group, call, async_op: bool, peer: int | None = None, name: str = "",
            sends: list[int] | None = None):
    """``sends``: bytes to each group rank, for an all-to-all (its wire bytes and whether they leave
    the node follow from them, not from a ring)."""
    rec = _recorder.active()
    handle = None
    if rec is not None:
        me = dist.get_rank()
        members = _group_ranks(group) if peer is None else None
        n = 2 if peer is not None else len(members)
        if sends is not None:
            wire = all_to_all_wire_bytes(sends, members.index(me))
            inter = any(b and rec.node_of(r) != rec.node_of(me) for r, b in zip(members, sends))
        else:
            wire = wire_bytes(op, payload, n)
            inter = rec.node_of(me) != rec.node_of(peer if peer is not None else ring_next(me, members))
        handle = rec.open(
            op,
            lane=COMM,
            name=name or op,
            bytes=int(wire),
            payload_bytes=payload,
            group_size=n,
            peer=peer,
            inter_node=inter,
            group_ranks=members if members is not None and len(members) < dist.get_world_size() else None,
        )
    work = call(async_op)
    if async_op:
        if handle is not None:
            handle.mark("issued")  # under way: the rank is free until it waits
        return TracedWork(work, handle, rec)
    if rec is not None:
        rec.close(handle, blocking=True)
    return None


def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False, name: str = ""):
    """Sum (or ``op``) ``tensor`` across the group, in place."""
    return _traced(
        "all_reduce", _nbytes(tensor), group,
        lambda a: dist.all_reduce(tensor, op=op, group=group, async_op=a), async_op, name=name,
    )


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False, name: str = ""):
    """Concatenate every rank's ``input`` along dim 0 into ``output`` (n x input)."""
    return _traced(
        "all_gather", _nbytes(output), group,
        lambda a: all_gather_into_tensor(output, input, group=group, async_op=a), async_op, name=name,
    )


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op=ReduceOp.SUM, group=None,
                   async_op: bool = False, name: str = ""):
    """Sum ``input`` (n x output) across ranks; rank i keeps the i-th slice in ``output``."""
    return _traced(
        "reduce_scatter", _nbytes(input), group,
        lambda a: reduce_scatter_tensor(output, input, op=op, group=group, async_op=a), async_op, name=name,
    )


def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False, name: str = ""):
    """Copy ``tensor`` from global rank ``src`` to every rank of the group."""
    return _traced(
        "broadcast", _nbytes(tensor), group,
        lambda a: dist.broadcast(tensor, src=src, group=group, async_op=a), async_op, name=name,
    )


def all_to_all(output: torch.Tensor, input: torch.Tensor, output_splits: list[int] | None = None,
               input_splits: list[int] | None = None, group=None, async_op: bool = False, name: str = ""):
    """Rank i sends the i-th slice of ``input`` (along dim 0) to each rank and receives each rank's
    slice for it into ``output``; ``input_splits`` / ``output_splits`` give uneven slice sizes in
    rows (None: even). Expert parallel's dispatch and combine, Ulysses's sequence/head exchange."""
    members = _group_ranks(group)
    row = _nbytes(input) // max(input.shape[0], 1) if input.dim() else 0
    splits = input_splits or [input.shape[0] // len(members)] * len(members)
    return _traced(
        "all_to_all", _nbytes(input), group,
        lambda a: dist.all_to_all_single(output, input, output_splits, input_splits, group=group, async_op=a),
        async_op, name=name, sends=[rows * row for rows in splits],
    )


def isend(tensor: torch.Tensor, dst: int, group=None, name: str = "") -> TracedWork:
    """Start sending ``tensor`` to global rank ``dst``; wait() on the result before reusing it."""
    return _traced("send", _nbytes(tensor), group, lambda _: dist.isend(tensor, dst, group=group), True,
                   peer=dst, name=name)


def irecv(tensor: torch.Tensor, src: int, group=None, name: str = "") -> TracedWork:
    """Start receiving into ``tensor`` from global rank ``src``."""
    return _traced("recv", _nbytes(tensor), group, lambda _: dist.irecv(tensor, src, group=group), True,
                   peer=src, name=name)


def send(tensor: torch.Tensor, dst: int, group=None, name: str = "") -> None:
    isend(tensor, dst, group, name).wait()


def recv(tensor: torch.Tensor, src: int, group=None, name: str = "") -> None:
    irecv(tensor, src, group, name).wait()
