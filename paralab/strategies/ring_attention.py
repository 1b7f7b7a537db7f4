"""Ring attention (环形注意力, Liu et al. 2023): causal attention over a sequence split across the N
ranks of a context-parallel group.

Each rank holds the queries, keys and values of its slice of the sequence (sequence_split.py says
which tokens). A query must meet every key before it, wherever it lives, so the keys and values
travel round the ring: at step j rank r holds the K/V block that started on rank r - j. It posts the
block's send to rank r + 1 and the receive of the next block from rank r - 1 (``isend``/``irecv``),
computes its queries' attention against the block while they travel, then waits for them. After N
steps every query has met every key, and no rank ever held more than two blocks.

Merging the blocks: the log-sum-exp rule (online softmax). A block gives each query row a partial
output o_b = softmax(s_b) v_b and the log-sum-exp l_b of its scores s_b. Two partials combine into
the attention over both blocks as

    l = log(exp(l_a) + exp(l_b)),    o = exp(l_a - l) o_a + exp(l_b - l) o_b

so the merged result is exactly softmax over all the keys, whatever the order the blocks came in.

Backward, the same ring again. The K/V blocks travel round once more (keeping all N would cost N
times the memory), each rank adds its queries' dQ and computes its contribution to the block's dK
and dV, and the block's dK/dV accumulator travels with it, one step behind: it picks up every rank's
contribution and one last hop brings it home. Per layer: N-1 K/V hops forward; N-1 K/V hops and N
dK/dV hops backward; every hop overlapped with a block's compute.

What is kept for backward is the flash-attention set (Dao et al. 2022): q, k, v, the output and
the log-sum-exp, all of this rank's slice, so activation memory per rank falls as 1/N. The scores
of a tile exist only while it is computed, and backward computes them again.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from paralab import comm
from paralab.runtime import recorder as _recorder
from paralab.strategies.sequence_split import Tile, rank_positions, ring_source, step_tiles


class AttentionWork:
    """This rank's attention compute, for the causal balance lesson: an ``attention`` span on the
    compute lane per ring step (beside the K/V sends it overlaps), and per training step the
    query-key pairs its tiles computed (the work, counted) and the thread CPU seconds they took (the
    work, timed). CPU time of the rank's own thread, not wall time: when ranks share cores, a rank
    that waits for a core is not charged for it (with one torch thread per rank, the matmuls run on
    this thread)."""

    def __init__(self):
        self.cpu_s: dict = defaultdict(float)
        self.pairs: dict = defaultdict(int)

    @contextmanager
    def block(self, name: str, pairs: int):
        """One ring step's attention, ``pairs`` query-key pairs over all its sequences and heads."""
        rec = _recorder.active()
        handle = rec.open("attention", name=name) if rec is not None else None
        start = time.thread_time()
        try:
            yield
        finally:
            step = rec.context.get("step") if rec is not None else None
            self.cpu_s[step] += time.thread_time() - start
            self.pairs[step] += pairs
            if rec is not None:
                rec.close(handle)


@dataclass(frozen=True)
class ContextParallelGroup:
    """The ranks that split each sequence between them, in ring order, and this rank's place.

    ``group``: their torch.distributed process group (None: the whole world); ``ranks``: their global
    ranks; ``index``: this rank's place in the ring; ``split``: zigzag or contiguous;
    ``mode``: ring or alltoall (how attention crosses the split)."""

    group: object
    ranks: tuple[int, ...]
    index: int
    split: str = "zigzag"
    mode: str = "ring"
    work: AttentionWork = field(default_factory=AttentionWork, compare=False)

    @property
    def size(self) -> int:
        return len(self.ranks)

    def positions(self, seq_len: int, index: int | None = None, device=None) -> torch.Tensor:
        """Global positions of the tokens rank ``index`` (default: this one) holds, in its order."""
        index = self.index if index is None else index
        return torch.tensor(rank_positions(seq_len, index, self.size, self.split), device=device)

    def pass_on(self, tensor: torch.Tensor, name: str) -> RingHop:
        """Send ``tensor`` to the next rank and receive the previous rank's into a new buffer."""
        return RingHop(self, tensor, name)


class RingHop:
    """One step of the ring in flight: our block on its way to the next rank, the previous rank's on
    its way here. ``wait()`` returns the block received. A ring of one rank passes to itself."""

    def __init__(self, ring: ContextParallelGroup, tensor: torch.Tensor, name: str):
        if ring.size == 1:
            self.received, self.works = tensor, []
            return
        after, before = ring.ranks[(ring.index + 1) % ring.size], ring.ranks[(ring.index - 1) % ring.size]
        self.received = torch.empty_like(tensor)

        def send():
            return comm.isend(tensor, after, group=ring.group, name=name)

        def recv():
            return comm.irecv(self.received, before, group=ring.group, name=name)

        # NCCL runs a group's sends and receives one after another in issue order: had every rank sent
        # first, each send would wait for a receive queued behind its peer's own send, round the ring
        # (a block beyond NCCL's buffer never leaves). Even places send first and odd ones receive
        # first, so every send meets its receive (gloo matches each message apart either way)
        self.works = [send(), recv()] if ring.index % 2 == 0 else [recv(), send()]

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        return self.received


# ---------------------------------------------------------------------------- one tile
@lru_cache(maxsize=64)
def _causal_mask(rows: int, device: str) -> torch.Tensor:
    """True where a key comes after its query, in a masked tile's last ``rows`` keys (the diagonal)."""
    return torch.ones(rows, rows, dtype=torch.bool, device=device).triu(1)


def _scores(q: torch.Tensor, k: torch.Tensor, tile: Tile) -> torch.Tensor:
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(q.shape[-1] ** -0.5)
    if tile.masked:
        scores[..., -tile.rows:].masked_fill_(_causal_mask(tile.rows, str(q.device)), float("-inf"))
    return scores


def tile_forward(q, k, v, tile: Tile) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial output, log-sum-exp) of the tile's query rows over its keys."""
    scores = _scores(q, k, tile)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.matmul(scores.sub_(lse).exp_(), v), lse


def tile_backward(q, k, v, lse, grad_out, delta, tile: Tile):
    """(dq, dk, dv) of one tile, given the merged log-sum-exp of its rows and delta = rowsum(dO * O):
    the softmax's probabilities p are rebuilt from the scores, and dS = p (dP - delta)."""
    p = _scores(q, k, tile).sub_(lse).exp_()
    grad_v = torch.matmul(p.transpose(-2, -1), grad_out)
    grad_s = torch.matmul(grad_out, v.transpose(-2, -1)).sub_(delta).mul_(p).mul_(q.shape[-1] ** -0.5)
    return torch.matmul(grad_s, k), torch.matmul(grad_s.transpose(-2, -1), q), grad_v


def _merge(out, lse, block_out, block_lse):
    """The log-sum-exp rule: two partial attentions over disjoint keys make the attention over both."""
    merged = torch.logaddexp(lse, block_lse)
    return out * (lse - merged).exp() + block_out * (block_lse - merged).exp(), merged


# ---------------------------------------------------------------------------- the ring
def _tiles(ring: ContextParallelGroup, step: int, local_len: int) -> list[Tile]:
    source = ring_source(ring.index, step, ring.size)
    return step_tiles(ring.index, source, ring.size, ring.split, local_len // 2)


def _pairs(tiles: list[Tile], q: torch.Tensor) -> int:
    """Query-key pairs the tiles compute for every sequence and head of ``q`` (batch, heads, seq, dim)."""
    return q.shape[0] * q.shape[1] * sum(t.pairs for t in tiles)


def _rows(t: torch.Tensor, tile: Tile) -> torch.Tensor:
    return t[..., tile.row:tile.row + tile.rows, :]


def ring_forward(q, k, v, ring: ContextParallelGroup, name: str):
    """Attention output and log-sum-exp of this rank's queries, (batch, heads, local seq, head_dim). The
    output is laid out (batch, seq, heads, head_dim) in memory, as the projection after it reads it,
    so the tensor kept for backward and the projection's input are one (as with torch's kernel).

    Whatever the inputs' dtype, the blocks travel in it and the tiles, the merge and the log-sum-exp
    are computed in fp32 (a 16-bit running softmax would lose the small blocks' share)."""
    out = torch.zeros(q.shape[0], q.shape[2], q.shape[1], q.shape[3], device=q.device).transpose(1, 2)
    lse = torch.full((*q.shape[:-1], 1), float("-inf"), device=q.device)
    kv = torch.stack([k, v])  # one message per hop
    for step in range(ring.size):
        hop = ring.pass_on(kv, f"{name} kv") if step < ring.size - 1 else None
        tiles = _tiles(ring, step, q.shape[-2])
        with ring.work.block(f"{name} forward {step}", _pairs(tiles, q)):
            for tile in tiles:
                k_tile, v_tile = (t[..., :tile.keys, :].float() for t in kv)
                part = tile_forward(_rows(q, tile).float(), k_tile, v_tile, tile)
                rows = slice(tile.row, tile.row + tile.rows)
                out[..., rows, :], lse[..., rows, :] = _merge(out[..., rows, :], lse[..., rows, :], *part)
        if hop is not None:
            kv = hop.wait()
    return out.to(q.dtype), lse


def ring_backward(q, k, v, out, lse, grad_out, ring: ContextParallelGroup, name: str):
    """(dq, dk, dv) of this rank's slice: K/V go round again, each block's dK/dV one hop behind.
    Computed in fp32; the dK/dV accumulators travel in the inputs' dtype, as the K/V blocks do."""
    q32, grad_out = q.float(), grad_out.float()
    delta = (grad_out * out.float()).sum(dim=-1, keepdim=True)
    grad_q = torch.zeros_like(q32)
    kv, arriving = torch.stack([k, v]), None
    for step in range(ring.size):
        hop = ring.pass_on(kv, f"{name} kv") if step < ring.size - 1 else None
        grad_kv = torch.zeros_like(kv, dtype=torch.float32)
        tiles = _tiles(ring, step, q.shape[-2])
        with ring.work.block(f"{name} backward {step}", _pairs(tiles, q)):
            for tile in tiles:
                keys = slice(0, tile.keys)
                k_tile, v_tile = (t[..., keys, :].float() for t in kv)
                dq, dk, dv = tile_backward(_rows(q32, tile), k_tile, v_tile, _rows(lse, tile),
                                           _rows(grad_out, tile), _rows(delta, tile), tile)
                _rows(grad_q, tile).add_(dq)
                grad_kv[0][..., keys, :] += dk
                grad_kv[1][..., keys, :] += dv
        if arriving is not None:  # the block's accumulator, from the rank that held it last step
            grad_kv += arriving.wait()
        # the last step's hop brings our own block's accumulator home
        arriving = ring.pass_on(grad_kv.to(kv.dtype), f"{name} dkv")
        if hop is not None:
            kv = hop.wait()
    grad_kv = arriving.wait()
    return grad_q.to(q.dtype), grad_kv[0], grad_kv[1]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring: ContextParallelGroup, name: str):
        out, lse = ring_forward(q, k, v, ring, name)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.name = ring, name
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grad_q, grad_k, grad_v = ring_backward(q, k, v, out, lse, grad_out.contiguous(), ctx.ring, ctx.name)
        return grad_q, grad_k, grad_v, None, None


def ring_attention(q, k, v, ring: ContextParallelGroup, name: str) -> torch.Tensor:
    """Causal attention of this rank's (batch, heads, local seq, head_dim) q, k, v over the whole
    sequence; ``name`` labels its spans ("L0": the first layer)."""
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), ring, name)
