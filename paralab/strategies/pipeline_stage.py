"""The model cut into pipeline stages: which parts each stage owns, and the stage as a module.

The GPT is a list of parts ``[embed, blocks.0 .. blocks.L-1, head]`` (paralab.models.gpt). A pipeline
of S stages hands each stage a contiguous run of blocks; the first stage also owns the embedding and
the last the head, so token ids enter at stage 0 and the loss is computed at stage S-1. Every stage
builds only its own parts, each from its own seed, so the split starts from exactly the weights of
single-device training. paralab's executor and the torch.distributed.pipelining reference both use
this split, which is what makes their losses comparable; how many blocks each stage gets is
paralab.stage_split's rule (even, given, or lighter at the ends), shared with the simulator.
``check_pipeline`` holds what both need of the model before any process starts (the schedule's own
shape rules are paralab.schedules').
"""

from __future__ import annotations

import torch
import torch.nn as nn

from paralab.config import ConfigError, ModelConfig, RunConfig
from paralab.models.gpt import build_part, part_names
from paralab.schedules import (
    SCHEDULES,
    SPLIT_BACKWARD,
    Schedule,
    ScheduleError,
    build_schedule,
    validate_schedule,
)
from paralab.stage_split import layers_per_stage, split_problems


def stage_part_indices(cfg: ModelConfig, num_stages: int,
                       override: list[int] | None = None) -> list[list[int]]:
    """The part indices (0 = embed, 1..L = blocks, L+1 = head) each stage owns, in model order."""
    counts = layers_per_stage(cfg.layers, num_stages, override)
    out, first_block = [], 1
    for s, count in enumerate(counts):
        parts = list(range(first_block, first_block + count))
        first_block += count
        if s == 0:
            parts.insert(0, 0)
        if s == num_stages - 1:
            parts.append(cfg.layers + 1)
        out.append(parts)
    return out


class Stage(nn.Module):
    """One pipeline stage: its parts run in order. Stage 0 takes token ids, the others the hidden
    states (microbatch x seq x hidden) of the stage before; the last stage returns logits.
    ``build(cfg, index, seed)`` makes each part: the single-device part by default, a
    tensor-parallel one in hybrid."""

    def __init__(self, cfg: ModelConfig, index: int, num_stages: int, parts: list[int], seed: int,
                 build=build_part):
        super().__init__()
        self.index, self.num_stages = index, num_stages
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        names = part_names(cfg)
        self.part_names = [names[i] for i in parts]
        self.parts = nn.ModuleList(build(cfg, i, seed) for i in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            x = part(x)
        return x

    def global_named_parameters(self):
        """Parameters under the names of paralab.models.gpt.GPT (embed.*, blocks.i.*, head.*)."""
        for name, part in zip(self.part_names, self.parts):
            for local, param in part.named_parameters():
                yield f"{name}.{local}", param


def build_stages(cfg: ModelConfig, num_stages: int, owned: list[int], seed: int,
                 override: list[int] | None, prepare, build=build_part) -> dict[int, Stage]:
    """The stages in ``owned`` (global stage indices), parts made by ``build``, each stage handed to
    ``prepare`` (common.prepare: the rank's device and dtype, recomputation)."""
    parts = stage_part_indices(cfg, num_stages, override)
    return {s: prepare(Stage(cfg, s, num_stages, parts[s], seed, build)) for s in owned}


def named_stage_state(stages: dict[int, Stage]) -> dict:
    """Final parameters and gradients of this rank's stages under global names, on the CPU."""
    named = [item for stage in stages.values() for item in stage.global_named_parameters()]
    return {
        "params": {n: p.detach().cpu().clone() for n, p in named},
        "grads": {n: p.grad.detach().cpu().clone() for n, p in named if p.grad is not None},
    }


# ------------------------------------------------------------------------------------------ checks
def check_pipeline(cfg: RunConfig, layout) -> Schedule:
    """What a pipeline needs of the model, before any process starts: every stage gets a layer, the
    chunks of the interleaved schedule divide the layers evenly (or ``stage_layers`` says how), and
    the schedule, built for this shape, is proved deadlock-free. Returns the schedule."""
    p, v, m, layers = layout.pp, layout.virtual_stages, layout.microbatches, cfg.model.layers
    stages = layout.num_stages
    if stages > layers:
        raise ConfigError(f"{p} ranks x {v} chunks = {stages} stages but the model has only {layers} layers; "
                          f"every stage needs a layer: use pp x virtual_stages <= {layers}")
    if layout.schedule == "interleaved" and layout.stage_layers is None and layers % stages:
        fits = [k for k in range(2, layers // p + 1) if layers % (p * k) == 0]
        raise ConfigError(f"interleaved gives every chunk the same number of layers: {layers} layers "
                          f"over {p} x {v} = {stages} chunks does not divide; virtual_stages that "
                          f"fit: {fits}, or give stage_layers (paralab.stage_split.balanced_split makes one)")
    problems = split_problems(layers, stages, layout.stage_layers)
    if problems:
        raise ConfigError(problems[0])
    try:
        schedule = build_schedule(layout.schedule, p, m, v)
        validate_schedule(schedule)
    except (ValueError, ScheduleError) as exc:
        raise ConfigError(f"pipeline schedule {layout.schedule!r} (pp={p}, microbatches={m}, "
                          f"virtual_stages={v}) cannot run: {exc}") from None
    if cfg.recompute == "full" and schedule.is_split_backward:
        raise ConfigError(f"{layout.schedule} splits each backward into Bi and W by keeping every linear "
                          "layer's input for W, which full recomputation would throw away: "
                          "use recompute='selective' (attention cores only), "
                          "or full recomputation with "
                          f"{', '.join(s for s in SCHEDULES if s not in SPLIT_BACKWARD)}")
    return schedule
