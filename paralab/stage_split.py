"""How a model's blocks are split over pipeline stages: the one rule that the executor
(paralab.strategies.pipeline_stage), the run's checks and the simulator (paralab.sim) share.

By default the blocks split as evenly as possible, earlier stages taking the remainder one block
each. A split may also be given (``stage_layers``: blocks per stage, in model order, every stage at
least one). The first stage also runs the embedding and the last the output layer and the loss,
which on a small vocabulary cost little but on a large one cost as much as a few blocks: Megatron-LM
lets the first and last stages hold fewer layers for that (its first/last pipeline-stage layer
options). :func:`balanced_split` gives such a split from what the two ends cost, in blocks.
"""

from __future__ import annotations


def layers_per_stage(layers: int, num_stages: int, override: list[int] | tuple[int, ...] | None = None) -> list[int]:
    """Blocks per stage: ``override`` when given, else as even as possible (earlier stages take the
    remainder, one block each)."""
    if override is not None:
        return list(override)
    base, extra = divmod(layers, num_stages)
    return [base + (1 if s < extra else 0) for s in range(num_stages)]


def split_problems(layers: int, num_stages: int, override=None) -> list[str]:
    """Why ``override`` cannot split ``layers`` blocks over ``num_stages`` stages (empty when it can)."""
    if num_stages > layers:
        return [f"{num_stages} stages but the model has only {layers} layers; every stage needs a layer"]
    if override is not None and (len(override) != num_stages or sum(override) != layers
                                 or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in override)):
        return [f"stage_layers={list(override)} must give each of the {num_stages} stages at least one layer and "
                f"sum to the model's {layers} layers"]
    return []


def balanced_split(layers: int, num_stages: int, first: float = 1.0, last: float = 1.0) -> list[int]:
    """Blocks per stage so that no stage's work is above the others', counting the embedding as
    ``first`` blocks' worth on stage 0 and the output layer and loss as ``last`` on the last stage:
    each block goes to the stage with the least work so far (a middle stage, then the earlier, on a
    tie), which for equal blocks gives the smallest possible maximum. ``first = last = 0`` splits
    evenly, the remainder in the middle."""
    if num_stages > layers:
        raise ValueError(split_problems(layers, num_stages)[0])
    counts = [1] * num_stages
    extra = [0.0] * num_stages
    extra[0] += first
    extra[-1] += last
    for _ in range(layers - num_stages):
        s = min(range(num_stages), key=lambda i: (counts[i] + extra[i], i in (0, num_stages - 1), i))
        counts[s] += 1
    return counts
