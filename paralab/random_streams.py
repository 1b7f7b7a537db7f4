"""Where a rank's dropout masks come from: two random streams, numbered as Megatron-LM numbers them.

A dropout mask must be the same on ranks that hold the same values and differ where they hold
different ones:

- **torch's default generator**, seeded ``seed + 100 x pipeline stage``. Data-parallel replicas and
  the tensor-parallel ranks of a stage draw alike. In a replicated region (the embedding's and the
  residual dropouts without sequence parallelism) every tp rank holds the same tensor and must drop
  the same elements of it, or the replicas drift apart. The stages differ, so a pipeline's stages do
  not repeat one another's masks, as they would from one seed.
- **the split-region stream**, seeded ``seed + 100 x stage + 2718 + tp rank``, for dropout on what a
  tp rank alone holds: its attention heads and, with sequence parallelism, its slice of the
  sequence. From one seed, every rank would drop the same places of different heads and slices.

Recomputation must draw a region's masks again, the same: torch's checkpoint restores the default
generator, and :func:`recompute_contexts` does the same for the split-region stream.

A rank is a process, so the split-region stream belongs to the process, as torch's default
generator does; :func:`seed_rank` sets both when the rank starts.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

STAGE_STRIDE = 100  # seeds apart between pipeline stages (room for 100 tp ranks)
SPLIT_OFFSET = 2718  # the split-region stream's seeds, apart from every stage's default seed


class _Stream:
    """A generator state kept aside: installed in torch's default generators while a region runs."""

    def __init__(self, seed: int, device: torch.device):
        self.cuda = [device] if device.type == "cuda" else []
        self.state = (torch.Generator().manual_seed(seed).get_state(),
                      *(torch.Generator(d).manual_seed(seed).get_state() for d in self.cuda))
        self.active = False  # installed now (a region inside another draws on from where it is)

    def installed(self) -> tuple[torch.Tensor, ...]:
        return (torch.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in self.cuda))

    def install(self, state: tuple[torch.Tensor, ...]) -> None:
        torch.set_rng_state(state[0])
        for d, s in zip(self.cuda, state[1:]):
            torch.cuda.set_rng_state(s, d)


_split: _Stream | None = None  # this process's split-region stream (None until seed_rank)


def seeds(seed: int, stage: int, tp_rank: int) -> tuple[int, int]:
    """(default generator's seed, split-region stream's seed) of the rank at ``stage``, ``tp_rank``."""
    default = seed + STAGE_STRIDE * stage
    return default, default + SPLIT_OFFSET + tp_rank


def seed_rank(seed: int, coord: dict[str, int], device: torch.device) -> None:
    """Seed this process's two streams for the rank at mesh coordinate ``coord`` (its pp and tp)."""
    global _split
    default, split = seeds(seed, coord.get("pp", 0), coord.get("tp", 0))
    torch.manual_seed(default)
    _split = _Stream(split, device)


@contextmanager
def split_region(draws: bool = True):
    """Draw from the split-region stream inside; torch's default generators are as they were after.
    ``draws``: whether the region draws at all (a dropout of p > 0, in training); if not, nothing is
    swapped, so a model without dropout pays nothing for the stream."""
    stream = _split
    if not draws or stream is None or stream.active:  # nothing to draw, no rank seeded, or nested
        yield
        return
    outside = stream.installed()
    stream.install(stream.state)
    stream.active = True
    try:
        yield
    finally:
        stream.active = False
        stream.state = stream.installed()
        stream.install(outside)


class _Replay:
    """Each recomputation of a checkpointed region (torch enters this once per backward that needs it)
    starts the split-region stream where the forward found it, and leaves it where it was."""

    def __init__(self, stream: _Stream):
        self.stream, self.at_forward, self.outside = stream, stream.state, []

    def __enter__(self):
        self.outside.append(self.stream.state)
        self.stream.state = self.at_forward

    def __exit__(self, *exc):
        self.stream.state = self.outside.pop()


def recompute_contexts():
    """torch checkpoint's ``context_fn``: the recomputation draws from the split-region stream where
    the forward did, and leaves it where it was before the recomputation (other microbatches' forwards
    may have drawn from it since)."""
    if _split is None:
        return nullcontext(), nullcontext()
    return nullcontext(), _Replay(_split)
