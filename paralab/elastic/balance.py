"""Load balancing: give each rank a share of the global batch in proportion to how fast it is.

In data parallel every step waits for the slowest rank, so one contended or older device slows the
whole job to its pace. ``Slowdown`` simulates such a rank (``--slow rank=R,factor=F``: after each piece
of its compute it sleeps so that the piece takes F times as long). ``Balancer`` (``--balance``) fixes
it: after every step the ranks all-gather (samples, compute seconds), keep a smoothed samples-per-second
rate for each rank, and the next global batch is cut with paralab.data.weighted_shard in those
proportions.

Why the maths stays exact: whatever a rank's share, each sample's loss is weighted by 1/global batch
before backward and the gradients are summed over ranks, so the update is the mean over the same global
batch as single-device training, only split differently.
"""

from __future__ import annotations

import time

import torch

from paralab import comm
from paralab.data import weighted_shard

SMOOTHING = 0.5  # weight of the newest measurement in each rank's rate


class Slowdown:
    def __init__(self, slow: dict | None, rank: int):
        self.factor = float(slow["factor"]) if slow and int(slow["rank"]) == rank else 1.0

    def after(self, seconds: float) -> None:
        """Called after ``seconds`` of real compute: stretch it to ``factor`` times as long."""
        if self.factor > 1.0:
            time.sleep((self.factor - 1.0) * seconds)


class Balancer:
    def __init__(self, world_size: int, enabled: bool, device: torch.device | str = "cpu"):
        self.world_size = world_size
        self.enabled = enabled
        self.device = device  # of the gathered numbers: NCCL gathers CUDA tensors only
        self.rates: list[float | None] = [None] * world_size

    def weights(self) -> list[float]:
        """Each rank's share of the next global batch (equal until every rank has been measured)."""
        if not self.enabled or any(r is None for r in self.rates):
            return [1.0] * self.world_size
        return list(self.rates)

    def shard(self, ids: list[int], rank: int) -> list[int]:
        """This rank's samples of the next global batch: at least one each, so a rank slowed for a while
        is still measured and wins its work back when it recovers (a rank given none keeps its rate)."""
        return weighted_shard(ids, rank, self.weights(), at_least=1)

    def observe(self, samples: int, compute_s: float) -> None:
        """Collective when enabled: share this rank's measurement and update every rank's rate.
        All ranks compute the same rates from the same gathered numbers, so they cut the same shards."""
        if not self.enabled:
            return
        mine = torch.tensor([float(samples), compute_s], dtype=torch.float64, device=self.device)
        everyone = torch.empty(2 * self.world_size, dtype=torch.float64, device=self.device)
        comm.all_gather(everyone, mine, name="throughput")
        self.update(everyone[0::2].tolist(), everyone[1::2].tolist())

    def update(self, samples: list[float], seconds: list[float]) -> None:
        """Fold one step's samples and compute seconds of every rank into the smoothed rates: what
        ``observe`` does with the gathered numbers, and what replays a run's history to check its cuts."""
        for r, (n, s) in enumerate(zip(samples, seconds)):
            if n > 0 and s > 0:  # a rank given no samples keeps its previous rate
                rate, old = n / s, self.rates[r]
                self.rates[r] = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate
