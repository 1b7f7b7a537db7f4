"""What a strategy sees on its rank: the config and its resolved layout, who it is, its device,
recorder and memory meter."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from paralab.config import TrainingConfig
from paralab.layout import Layout
from paralab.memory import MemoryMeter
from paralab.precision import LossScaler
from paralab.runtime.recorder import Recorder


class InjectedFault(RuntimeError):
    """Raised by the test-only fault hook (RunConfig.fault) to show how a failing rank is reported."""


class RaiseOrHang:
    """The fault hook of ``paralab run``: ``fault={"rank": r, "step": k}`` makes rank r raise at step
    k; ``"kind": "hang"`` makes it stop answering instead, to exercise the collective timeout.
    (Elastic training has its own: its failures take a whole node away.)"""

    def __init__(self, cfg, rank: int):
        self.fault, self.rank, self.timeout_s = getattr(cfg, "fault", None), rank, cfg.timeout_s

    def at_step(self, step: int) -> None:
        fault = self.fault
        if not fault or int(fault["rank"]) != self.rank or int(fault.get("step", 0)) != step:
            return
        if fault.get("kind") == "hang":
            time.sleep(10 * self.timeout_s + 3600)
        raise InjectedFault(f"fault injected on rank {self.rank} at step {step}")


@dataclass
class RankContext:
    cfg: TrainingConfig
    layout: Layout
    rank: int
    world_size: int
    local_rank: int
    node: int
    device: torch.device
    recorder: Recorder
    memory: MemoryMeter
    faults: RaiseOrHang  # anything with at_step(step), called as each step begins
    scaler: LossScaler  # fp16's dynamic loss scale (inert otherwise): backward passes scale the loss by it

    def check_fault(self, step: int) -> None:
        self.faults.at_step(step)

    def result(self, losses: list[float] | None, loss_weight: float, state: dict | None = None,
               params_digest: str | None = None) -> dict:
        """This rank's contribution to the RunResult.

        ``losses`` are this rank's per-step losses over the data it saw and ``loss_weight`` that
        data's share of the global batch: the run's loss is the weighted sum over reporting ranks
        (ranks that saw no loss, such as early pipeline stages, pass ``losses=None``).
        ``state`` maps global parameter names to full tensors this rank vouches for
        (``{"params": {...}, "grads": {...}}``), filled in only when ``cfg.collect_state``, and
        ``params_digest`` a digest of the parameters this rank trained, whichever replica it is: only
        the first replica's state is collected, and the digests say whether the others hold the same.
        """
        return {
            "rank": self.rank,
            "node": self.node,
            "losses": losses,
            "loss_weight": loss_weight,
            "memory": self.memory.report(),
            "loss_scale": self.scaler.value,
            "skipped_steps": list(self.scaler.skipped),
            "state": state if self.cfg.collect_state else None,
            "params_digest": params_digest if self.cfg.collect_state else None,
        }
