"""Bytes on the wire: the one ring accounting that measured traces (paralab.comm) and the simulator
(paralab.sim.counting) share, so a measured and a predicted byte count mean the same thing.

Ring algorithms (Patarasuk & Yuan 2009; NCCL's bus-bandwidth convention): in a group of n ranks an
all-reduce sends 2(n-1)/n of the tensor from each rank (a reduce-scatter then an all-gather), an
all-gather, reduce-scatter or broadcast (n-1)/n of the full tensor; a point-to-point send sends the
tensor and its receive sends nothing. An all-to-all is no ring: each rank sends every other rank its
slice directly, so it puts on the wire what it sends to the others, (n-1)/n of its input when the
slices are even (NCCL's convention for alltoall), exactly :func:`all_to_all_wire_bytes` when not.
"""

from __future__ import annotations

RING_FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "broadcast": 1.0,
               "all_to_all": 1.0}


def ring_wire_bytes(op: str, payload: float, group: int) -> float:
    """Bytes one rank puts on the wire for ``op`` on ``payload`` bytes among ``group`` ranks."""
    if op == "send":
        return payload
    if op not in RING_FACTOR and op != "recv":
        raise ValueError(f"unknown communication op {op!r}")
    if group <= 1 or op == "recv":
        return 0.0
    return payload * RING_FACTOR[op] * (group - 1) / group


def all_to_all_wire_bytes(send_bytes: list[float], me: int) -> float:
    """Bytes rank ``me`` puts on the wire in an all-to-all sending ``send_bytes[r]`` to group rank r:
    everything but its slice for itself."""
    return sum(send_bytes) - send_bytes[me]
