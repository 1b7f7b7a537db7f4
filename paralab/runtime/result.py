"""What a run gives back: losses, the merged trace, the summary (the CLI's --json), and errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from paralab.config import RunConfig
from paralab.layout import Layout
from paralab.schedules import theoretical_bubble
from paralab.strategies.registry import bucket_cap_applies, traces_its_collectives
from paralab.trace import SPAN_FIGURES, Trace


class RunError(RuntimeError):
    """A run failed on a rank. ``rank`` names it (None for a hang no rank reported);
    ``remote_traceback`` is the rank's own traceback (with no rank: what the ranks or the launcher
    said, such as every rank's stack)."""

    def __init__(self, rank: int | None, message: str, remote_traceback: str):
        self.rank = rank
        self.remote_traceback = remote_traceback
        where = f"rank {rank} failed: " if rank is not None else ""
        text = where + message
        if remote_traceback:
            heading = f"traceback on rank {rank}" if rank is not None else "details"
            text += f"\n\n--- {heading} ---\n{remote_traceback}"
        super().__init__(text)


def combine_losses(rank_results: list[dict]) -> list[float]:
    """The run's loss per step: the weighted sum of what each reporting rank saw (see RankContext.result)."""
    reporting = [r for r in rank_results if r.get("losses") is not None]
    if not reporting:
        return []
    steps = len(reporting[0]["losses"])
    return [sum(r["loss_weight"] * r["losses"][k] for r in reporting) for k in range(steps)]


@dataclass
class RunResult:
    config: RunConfig
    layout: Layout
    losses: list[float]
    trace: Trace
    rank_results: list[dict]
    params: dict | None = None
    grads: dict | None = None
    trace_path: str | None = None
    report_path: str | None = None

    @classmethod
    def from_rank_results(cls, cfg: RunConfig, layout: Layout, rank_results: list[dict],
                          states: list[dict | None]) -> RunResult:
        rank_results = sorted(rank_results, key=lambda r: r["rank"])
        trace = Trace.merge([Trace.from_dict(r.pop("trace")) for r in rank_results])
        trace.meta.update(measured_run_meta(cfg, layout, rank_results))
        params, grads = _merge_states(states)
        return cls(cfg, layout, trace.meta["losses"], trace, rank_results, params, grads)

    @classmethod
    def collect(cls, cfg: RunConfig, layout: Layout, run_dir: Path) -> RunResult:
        import torch

        results, states = [], []
        for rank in range(cfg.world_size):
            results.append(json.loads((run_dir / f"rank{rank}.json").read_text()))
            state_file = run_dir / f"rank{rank}.state.pt"
            states.append(torch.load(state_file, weights_only=True) if state_file.exists() else None)
        return cls.from_rank_results(cfg, layout, results, states)

    @property
    def summary(self) -> dict:
        """The JSON contract of ``paralab run --json`` (its keys: README, "The `--json` contract"; never
        renamed)."""
        cfg, layout = self.config, self.layout
        metrics = self.trace.summary()
        return {
            "strategy": cfg.strategy,
            "world_size": cfg.world_size,
            "dp": layout.dp,
            "tp": layout.tp,
            "pp": layout.pp,
            "cp": layout.cp,
            # null at cp 1, whatever the layout keeps (hybrid's the defaults of cp > 1; the cp strategy on
            # one rank runs its machinery with them): a tp x dp run had reported "ring", "zigzag"
            "cp_mode": layout.cp_mode if layout.cp > 1 else None,
            "cp_split": layout.cp_split if layout.cp > 1 else None,
            "ep": layout.ep,
            "schedule": layout.schedule or None,
            "microbatches": layout.microbatches,
            "virtual_stages": layout.virtual_stages,
            "zero": layout.zero,
            "sequence_parallel": layout.sequence_parallel,
            "steps": cfg.steps,
            "model": cfg.model_name,
            "global_batch": cfg.global_batch,
            "micro_batch": layout.micro_batch,
            "device": cfg.device,
            # the nodes the ranks ran on, as each found its own: torchrun's nodes of unequal size (a
            # node of 1 rank beside one of 2) had read 1, which hid the traffic that crossed them
            "nodes": len({r["node"] for r in self.rank_results}) or cfg.nodes,
            "dtype": cfg.dtype,
            "reduce_dtype": cfg.reduce_dtype,
            "bucket_mb": cfg.bucket_mb if bucket_cap_applies(cfg.strategy, layout) else None,
            "hierarchical": cfg.hierarchical,
            "zero_prefetch": cfg.zero_prefetch,
            "recompute": cfg.recompute,
            "attention": cfg.model.attention,
            "accumulate": layout.microbatches,
            "loss_scale": max((r.get("loss_scale", 1.0) for r in self.rank_results), default=1.0),
            "skipped_steps": sorted({k for r in self.rank_results for k in r.get("skipped_steps", [])}),
            "unused_options": list(layout.unused_options),
            "losses": self.losses,
            "step_time_s": metrics["step_time_s"],
            "step_times_s": metrics["step_times_s"],
            "tokens_per_s": metrics["tokens_per_s"],
            **{key: metrics[key] for key in SPAN_FIGURES},
            "unmeasured_why": metrics["unmeasured_why"],  # why those read null, if they do
            # the schedule's bubble for equal-time stages, whichever implementation ran it (torch_pp's
            # had read 0 where paralab's pp read 0.2 for the same layout)
            "bubble_theoretical": theoretical_bubble(layout.schedule, layout.pp, layout.microbatches,
                                                     layout.virtual_stages) if layout.pipelined else 0.0,
            **measured_memory(self.rank_results),
            "memory_max_by_kind": [r["memory"]["max_by_kind"] for r in self.rank_results],
            "trace": self.trace_path,
            "report": self.report_path,
        }

    def save_trace(self, path: str | Path) -> str:
        """Write the merged trace in Chrome trace format (opens in Perfetto); remembered in the summary."""
        self.trace_path = str(self.trace.save_chrome(path))
        return self.trace_path

    def __repr__(self) -> str:
        s = self.summary
        losses = ", ".join(f"{x:.4f}" for x in self.losses[:3]) + (" ..." if len(self.losses) > 3 else "")
        return (f"RunResult(strategy={s['strategy']!r}, world_size={s['world_size']}, steps={s['steps']}, "
                f"losses=[{losses}], step_time_s={s['step_time_s']:.4f})")


def measured_memory(rank_results: list[dict]) -> dict:
    """Each rank's peak memory and its breakdown at that peak, in the summary and in the trace's meta
    (so a report drawn from the saved trace has the memory figure a --report of the run has)."""
    return {"peak_memory_bytes": [r["memory"].get("cuda_max_allocated_bytes", r["memory"]["peak_bytes"])
                                  for r in rank_results],
            "memory_by_kind": [r["memory"]["peak_by_kind"] for r in rank_results]}


def measured_run_meta(cfg: RunConfig, layout: Layout, rank_results: list[dict]) -> dict:
    """:func:`run_meta` with what the run measured, from every rank's results: its losses and each rank's
    memory (in rank order) travel with the trace, so that `paralab report` of a saved trace (a --trace, or
    a torchrun's --trace-dir, whose rank 0 holds them) draws them as a --report of the run does."""
    rank_results = sorted(rank_results, key=lambda r: r["rank"])
    return {**run_meta(cfg, layout), **measured_memory(rank_results), "losses": combine_losses(rank_results)}


def run_meta(cfg: RunConfig, layout: Layout) -> dict:
    """The trace's description of its run: the config, and the layout every figure reads (degrees,
    schedule, which global rank holds which mesh coordinate)."""
    return {
        "source": "measured",
        "strategy": cfg.strategy,
        "collectives_traced": traces_its_collectives(cfg.strategy),
        "world_size": cfg.world_size,
        "dp": layout.dp,
        "tp": layout.tp,
        "pp": layout.pp,
        "cp": layout.cp,
        "ep": layout.ep,
        "schedule": layout.schedule,
        "microbatches": layout.microbatches,
        "virtual_stages": layout.virtual_stages,
        "model": cfg.model_name,
        "tokens_per_step": cfg.global_batch * cfg.model.seq_len,
        "config": cfg.to_dict(),
        "layout": layout.to_dict(),
        "mesh": layout.to_dict()["mesh"],
    }


def _merge_states(states: list[dict | None]) -> tuple[dict | None, dict | None]:
    present = [s for s in states if s]
    if not present:
        return None, None
    params, grads = {}, {}
    for s in present:
        params.update(s.get("params", {}))
        grads.update(s.get("grads", {}))
    return params, grads
