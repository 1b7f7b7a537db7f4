"""Collectives by the alpha-beta model: ring against tree, and the two bandwidths NCCL's tests report.

A message of w bytes over a link of latency alpha and bandwidth B takes alpha + w / B (Hockney's
model; Thakur, Rabenseifner and Gropp 2005 for the collectives). An all-reduce of S bytes over n ranks:

- **ring** (Patarasuk and Yuan 2009): a reduce-scatter, then an all-gather, round a ring; 2(n-1)
  steps, each rank sending 2(n-1)/n S in all. Bandwidth-optimal, latency linear in n. paralab's cost
  model prices it (``paralab.sim.cost.collective_time``) and ``paralab.wire`` counts its bytes.
- **tree**: NCCL's double binary tree (Sanders, Speck and Traff 2009): reduce up a binary tree, then
  broadcast down it, pipelined in small chunks, over two complementary trees that each carry half of
  the tensor, so every rank is a leaf in one and an inner node in the other and sends about S up and
  S down: 2 log2(n) latencies, about 2S / B of transfer. Latency logarithmic in n, bandwidth a little
  below the ring's at small n and equal to it at large n — so trees win small messages on many
  ranks, rings large messages (NCCL picks per size).

nccl-tests reports two bandwidths per measurement: **algorithm bandwidth** S / t (what the caller
sees) and **bus bandwidth**, the bytes each rank put on the wire over t (the ring's 2(n-1)/n S for an
all-reduce, (n-1)/n S for a reduce-scatter or all-gather): comparable across ops and group sizes,
and at its best equal to the link's bandwidth.
"""

from __future__ import annotations

import math

from paralab.wire import ring_wire_bytes


def ring_steps(op: str, group: int) -> int:
    """Messages each rank sends in a ring ``op``: 2(n-1) for an all-reduce, n-1 for its halves."""
    return 2 * (group - 1) if op == "all_reduce" else group - 1


def ring_time(op: str, payload: float, group: int, alpha: float, bandwidth: float) -> float:
    """Seconds of a ring ``op`` of ``payload`` bytes among ``group`` ranks: steps x alpha + wire / B."""
    if group <= 1:
        return 0.0
    return ring_steps(op, group) * alpha + ring_wire_bytes(op, payload, group) / bandwidth


def tree_time(payload: float, group: int, alpha: float, bandwidth: float) -> float:
    """Seconds of a pipelined double-binary-tree all-reduce (module docstring): 2 log2(n) alpha + 2S / B."""
    if group <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(group)) * alpha + 2 * payload / bandwidth


def algorithm_bandwidth(payload: float, seconds: float) -> float:
    """nccl-tests' algbw: the tensor's bytes over the time."""
    return payload / seconds


def bus_bandwidth(op: str, payload: float, group: int, seconds: float) -> float:
    """nccl-tests' busbw: the bytes each rank put on the wire (ring accounting) over the time."""
    return ring_wire_bytes(op, payload, group) / seconds


def fit_alpha_beta(points: list[tuple[float, float]], op: str, group: int) -> tuple[float, float]:
    """(alpha, bandwidth) of the ring model that fits measured (payload bytes, seconds) points best,
    t = steps x alpha + wire bytes / bandwidth, by least squares of the relative error: the sizes
    span orders of magnitude, and in absolute seconds the largest would set alpha too (a plain fit had
    put a 2-rank gloo alpha at twice the time a 4-byte all-reduce takes). Each point is weighed
    against the model's time there, not its own (fitted once on its own, then again): a sample that
    happened to run fast would otherwise weigh the most."""
    if len({p for p, _ in points}) < 2:
        raise ValueError("fitting alpha and beta needs at least two different sizes")
    if group < 2 or any(not t > 0 for _, t in points):
        raise ValueError(f"fitting alpha and beta needs a group of 2 or more (got {group}) and positive "
                         "times")
    xs = [ring_wire_bytes(op, p, group) for p, _ in points]
    ts = [t for _, t in points]
    slope, intercept = _relative_line(xs, ts, ts)
    if slope > 0 and intercept > 0:
        slope, intercept = _relative_line(xs, ts, [intercept + slope * x for x in xs])
    return max(intercept, 0.0) / ring_steps(op, group), 1 / slope if slope > 0 else math.inf


def _relative_line(xs: list[float], ts: list[float], scale: list[float]) -> tuple[float, float]:
    """(slope, intercept) minimising sum ((intercept + slope x - t) / scale)^2."""
    weights = [1 / c**2 for c in scale]

    def weighted(values) -> float:
        return sum(w * v for w, v in zip(weights, values))

    sw, sx, st = sum(weights), weighted(xs), weighted(ts)
    sxx, sxt = weighted(x * x for x in xs), weighted(x * t for x, t in zip(xs, ts))
    slope = (sw * sxt - sx * st) / (sw * sxx - sx * sx)
    return slope, (st - slope * sx) / sw


def traced_points(trace, op: str) -> dict[int, list[tuple[int, float]]]:
    """Group size -> (payload bytes, seconds) of every ``op`` span a trace holds, in its steps past the
    job's warm-up (:func:`paralab.trace.past_warm_up`), each span's time as the caller saw it."""
    from paralab.trace import past_warm_up  # here: the simulator imports this module, free of the run config

    typical = set(past_warm_up(sorted({s.step for s in trace.spans if s.step is not None})))
    out: dict[int, list[tuple[int, float]]] = {}
    for s in trace.select(kind=op):
        if s.step in typical and s.payload_bytes and s.end > s.start:  # a fit needs time
            out.setdefault(s.group_size, []).append((s.payload_bytes, s.end - s.start))
    return out
