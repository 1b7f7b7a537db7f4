"""How context parallelism cuts a sequence over its ranks, and which attention tiles each step of the
ring computes. Plain Python (no torch): the ranks compute these tiles (ring_attention.py) and the
simulator counts the same ones (paralab.sim.context).

The split. The S tokens are cut into 2N chunks of S/2N over N ranks:

- ``zigzag``: rank i holds chunks i and 2N-1-i, one from the front of the sequence and its mirror
  from the back;
- ``contiguous``: rank i holds chunks 2i and 2i+1, one piece of S/N tokens.

Why zig-zag. With a causal mask a query sees only the keys before it, so the work of a query chunk
grows with its position: chunk c meets c earlier chunks fully and itself half (the diagonal). Cut
contiguously, the last rank's queries meet almost the whole sequence and the first rank's almost
nothing: about 2N-1 times less work, and every ring step waits for the slowest rank. Zig-zag pairs
an early chunk with a late one, so every rank does the same work: chunks i and 2N-1-i see
i + (2N-1-i) = 2N-1 earlier chunks and two diagonals.

The tiles. At each ring step a rank holds its own queries and the K/V block of one rank (its two
chunks). A query chunk meets the block's chunks that are not after it: always a prefix of the block
(a rank's chunks are in ascending order), the last one the diagonal when the block is the rank's
own. Chunks met whole are one tile. A diagonal chunk is a staircase of ``DIAGONAL_TILES`` row tiles,
each against the keys up to its own last row, masked (triangular) on its last square only: it skips
most of the masked half of the chunk, as a flash-attention kernel skips masked tiles (with 4 tiles
it computes 5/8 of the square instead of all of it).
"""

from __future__ import annotations

from dataclasses import dataclass

from paralab.config import CP_SPLITS

DIAGONAL_TILES = 4


def rank_chunks(rank: int, size: int, split: str) -> tuple[int, int]:
    """The two of the sequence's 2 x ``size`` chunks that ``rank`` holds, in ascending order."""
    if split == "zigzag":
        return rank, 2 * size - 1 - rank
    if split == "contiguous":
        return 2 * rank, 2 * rank + 1
    raise ValueError(f"unknown split {split!r}; choose one of {CP_SPLITS}")


def rank_positions(seq_len: int, rank: int, size: int, split: str) -> list[int]:
    """The global positions of the tokens ``rank`` holds, in the order it holds them."""
    if split == "contiguous":  # one piece: needs seq_len divisible by size only
        piece = seq_len // size
        return list(range(rank * piece, (rank + 1) * piece))
    chunk = seq_len // (2 * size)
    return [p for c in rank_chunks(rank, size, split) for p in range(c * chunk, (c + 1) * chunk)]


@dataclass(frozen=True)
class Tile:
    """One attention call of a ring step: the rank's query rows ``[row, row + rows)`` against the first
    ``keys`` keys of the K/V block it holds, the last ``rows`` of them under the causal (triangular)
    mask when ``masked``."""

    row: int
    rows: int
    keys: int
    masked: bool

    @property
    def pairs(self) -> int:
        """Query-key pairs computed: the tile's FLOPs are 4 x pairs x head_dim per head (QK^T and PV)."""
        return self.rows * self.keys


def diagonal_tiles(chunk: int) -> int:
    """Row tiles of a diagonal chunk: DIAGONAL_TILES, or fewer when the chunk does not split so."""
    return next(t for t in range(min(DIAGONAL_TILES, chunk), 0, -1) if chunk % t == 0)


def step_tiles(rank: int, source: int, size: int, split: str, chunk: int) -> list[Tile]:
    """The tiles ``rank`` computes against the K/V block of rank ``source`` (chunks of ``chunk`` tokens)."""
    theirs = rank_chunks(source, size, split)
    tiles = []
    for i, q in enumerate(rank_chunks(rank, size, split)):
        seen = sum(k <= q for k in theirs)  # a prefix of the block: its chunks ascend
        if not seen:
            continue
        if q not in theirs:
            tiles.append(Tile(i * chunk, chunk, seen * chunk, False))
            continue
        step = chunk // diagonal_tiles(chunk)
        tiles += [Tile(i * chunk + row, step, (seen - 1) * chunk + row + step, True)
                  for row in range(0, chunk, step)]
    return tiles


def ring_source(rank: int, step: int, size: int) -> int:
    """Whose K/V block ``rank`` holds at ring ``step``: blocks travel to the next rank each step."""
    return (rank - step) % size


def attention_pairs(rank: int, size: int, split: str, seq_len: int) -> int:
    """Query-key pairs ``rank`` computes in one layer's forward, all ring steps together: its share of
    the attention work (the backward repeats the same tiles)."""
    chunk = seq_len // (2 * size)
    return sum(t.pairs for step in range(size)
               for t in step_tiles(rank, ring_source(rank, step, size), size, split, chunk))


def imbalance(size: int, split: str, seq_len: int) -> float:
    """Most over least attention work per rank: what the slowest rank costs the ring (1 is balanced)."""
    work = [attention_pairs(r, size, split, seq_len) for r in range(size)]
    return max(work) / min(work)
