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


def layers_per_stage(layers: int, num_stages: int,
                     override: list[int] | tuple[int, ...] | None = None) -> list[int]:
    """Blocks per stage: ``override`` when given, else as even as possible (earlier stages take the
    remainder, one block each)."""
    if override is not None:
        return list(override)
    base, extra = divmod(layers, num_stages)
    return [base + (1 if s < extra else 0) for s in range(num_stages)]


def not_a_split(override) -> str:
    """Why ``override`` (a stage_layers given) is no list of counts at all, '' when it is one (or None):
    a number or a string had reached ``list()`` and raised, or been read character by character."""
    if override is None or isinstance(override, list | tuple):
        return ""
    return f"stage_layers must be a list of layer counts, one per stage, got {override!r}"


def split_problems(layers: int, num_stages: int, override=None) -> list[str]:
    """Why ``override`` cannot split ``layers`` blocks over ``num_stages`` stages (empty when it can),
    naming what is wrong and a split that works. The first and last stage may hold no block (the
    embedding, or the output layer and the loss, are work enough: Megatron-LM's first/last stage layers
    of 0); every other stage needs one."""
    if override is None:
        if num_stages > layers:
            return [f"{num_stages} stages but the model has only {layers} layers; every stage needs a layer"]
        return []
    if why := not_a_split(override):
        return [why]
    counts = list(override)
    least = [0 if s in (0, num_stages - 1) else 1 for s in range(num_stages)]
    whole = all(isinstance(c, int) and not isinstance(c, bool) for c in counts)
    short = [s for s, (c, low) in enumerate(zip(counts, least)) if whole and c < low]
    if len(counts) != num_stages:
        why = f"gives {len(counts)} stages, not {num_stages}"
    elif not whole:
        why = "holds a count that is not a whole number"
    elif short:
        why = f"gives stage {short[0]} {counts[short[0]]} layers"
    elif sum(counts) != layers:
        why = f"sums to {sum(counts)} layers, not the model's {layers}"
    else:
        return []
    works = uneven_split(layers, num_stages) or (
        tuple(layers_per_stage(layers, num_stages)) if num_stages <= layers else None)
    offer = f"; {split_example(works)}" if works else ""
    return [f"stage_layers={counts} {why}: it must give each of the {num_stages} stages a whole number of "
            f"layers, at least one on every stage but the first and last, and sum to the model's {layers} "
            f"layers{offer}"]


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


def megatron_split(layers: int, num_stages: int) -> tuple[int, ...] | None:
    """The split Megatron-LM's first/last pipeline-stage layer options give ``layers`` that do not
    divide into ``num_stages``: the middle stages get the fewest equal layers that leave the two end
    stages no more than they hold, and the ends (which also carry the embedding, and the output layer
    and loss) share the rest, the last the lighter. Llama 3 405B: 126 layers on 16 stages give 7 +
    14 x 8 + 7 (Llama 3 herd, sec. 3.3.2). None when no such split exists."""
    if num_stages < 3 or layers < num_stages - 2:
        return None
    for middle in range(max(1, -(-layers // num_stages)), layers // (num_stages - 2) + 1):
        rest = layers - (num_stages - 2) * middle
        if 0 <= rest <= 2 * middle:
            return ends_split(layers, num_stages, rest - rest // 2, rest // 2)
    return None


def uneven_split(layers: int, num_stages: int) -> tuple[int, ...] | None:
    """A split for ``layers`` that do not divide into ``num_stages``: Megatron-LM's ends where they
    work (:func:`megatron_split`), else the most even split (remainder in the middle); two stages of
    one layer: the layer and an empty end. None when they divide (the default split serves), or when
    no split can hold them (every stage but the first and last needs a layer)."""
    if layers % num_stages == 0:
        return None
    if megatron := megatron_split(layers, num_stages):
        return megatron
    if num_stages <= layers:
        return tuple(balanced_split(layers, num_stages, 0, 0))
    return (1, 0) if (layers, num_stages) == (1, 2) else None


def ends_split(layers: int, num_stages: int, first: int, last: int) -> tuple[int, ...]:
    """Blocks per stage with ``first`` on the first stage, ``last`` on the last and the rest shared
    evenly over the middle ones (Megatron-LM's first/last pipeline-stage layers; check it with
    :func:`split_problems`)."""
    middle = num_stages - 2
    share = (layers - first - last) // middle if middle > 0 else 0
    return (first, *[share] * middle, last) if num_stages > 1 else (layers,)


def split_example(split) -> str:
    """A split offered in a message, in words and as the counts ``stage_layers`` (``--stage-layers``)
    takes: "e.g. 7 + 14 x 8 + 7 (7,8,...,8,7)"."""
    return f"e.g. {split_text(split)} ({','.join(map(str, split))})"


def split_text(split) -> str:
    """A split in a few words, runs of equal stages counted: (7, 8, ..., 8, 7) is "7 + 14 x 8 + 7"."""
    runs: list[list[int]] = []
    for count in split:
        if runs and runs[-1][1] == count:
            runs[-1][0] += 1
        else:
            runs.append([1, count])
    return " + ".join(f"{n} x {c}" if n > 1 else str(c) for n, c in runs)
