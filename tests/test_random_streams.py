"""Each rank's dropout streams (paralab.random_streams): which ranks draw alike, and that a split
region and its recomputation draw from the rank's own stream without disturbing torch's generator."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn

from paralab import random_streams
from paralab.layout import mesh_layout
from paralab.strategies.recompute import apply_recompute
from paralab.strategies.tensor import SplitRegionAttentionCore, SplitRegionDropout


@pytest.fixture
def seeded_rank():
    """Seed this process as the rank at (pp 1, tp 1), and afterwards as it was (no split stream)."""
    saved = torch.get_rng_state()
    random_streams.seed_rank(7, {"pp": 1, "dp": 0, "cp": 0, "tp": 1}, torch.device("cpu"))
    yield
    random_streams._split = None
    torch.set_rng_state(saved)


def test_stages_and_tensor_parallel_ranks_draw_from_streams_of_their_own():
    """Every (stage, tp rank) has its own split-region seed, and every stage its own default seed,
    none of them equal to another's; tp ranks of a stage share the default seed (replicated regions
    drop alike), and so do data-parallel replicas, whose coordinate is not asked for."""
    places = list(itertools.product(range(16), range(8)))
    defaults = {stage: {random_streams.seeds(3, stage, tp)[0] for tp in range(8)} for stage in range(16)}
    assert all(len(seed) == 1 for seed in defaults.values())
    splits = [random_streams.seeds(3, stage, tp)[1] for stage, tp in places]
    every = [seed for seeds in defaults.values() for seed in seeds] + splits
    assert len(set(every)) == len(every) == 16 + 16 * 8


def test_on_a_mesh_ranks_draw_alike_where_they_hold_the_same_values(seeded_rank):
    """dp 2 x tp 2 x pp 2, each rank seeded from its mesh coordinate as a rank starts: torch's generator
    draws the same on every rank of a stage and differently on the other stage; the split-region
    stream the same on the dp replicas of a tp rank and differently on the other tp rank."""
    layout = mesh_layout(dp=2, tp=2, pp=2)
    draws = {}
    for rank in range(layout.world_size):
        random_streams.seed_rank(0, layout.coord(rank), torch.device("cpu"))
        with random_streams.split_region():
            split = tuple(torch.rand(3).tolist())
        draws[rank] = (tuple(torch.rand(3).tolist()), split)

    def alike(which: int, *axes: str) -> set[tuple[tuple[float, ...], ...]]:
        """The draws of each group of ranks that share the coordinates on ``axes``."""
        groups: dict = {}
        for rank, coord in ((r, layout.coord(r)) for r in draws):
            groups.setdefault(tuple(coord[a] for a in axes), set()).add(draws[rank][which])
        assert all(len(d) == 1 for d in groups.values()), groups
        return {d.pop() for d in groups.values()}

    assert len(alike(0, "pp")) == 2  # one default stream a stage, two stages
    assert len(alike(1, "pp", "tp")) == 4  # one split-region stream a (stage, tp rank)


def test_a_split_region_draws_its_own_stream_and_leaves_the_default_one_as_it_was(seeded_rank):
    default_seed, split_seed = random_streams.seeds(7, 1, 1)
    first = torch.rand(4)
    with random_streams.split_region():
        inside = torch.rand(4)
    after = torch.rand(4)
    with random_streams.split_region():
        inside_again = torch.rand(4)
    with random_streams.split_region(draws=False):  # a region without dropout swaps nothing
        unswapped = torch.rand(4)
    reference = torch.Generator().manual_seed(default_seed)
    assert torch.equal(torch.cat([first, after, unswapped]), torch.rand(12, generator=reference))
    split_reference = torch.Generator().manual_seed(split_seed)
    assert torch.equal(torch.cat([inside, inside_again]), torch.rand(8, generator=split_reference))


class _SplitAttention(nn.Module):
    """A tensor-parallel rank's attention core and sequence-slice dropout, on a fixed projection."""

    IS_TRANSFORMER_BLOCK = True

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 24)
        self.core = SplitRegionAttentionCore("math", 0.5)
        self.drop = SplitRegionDropout(0.5)

    def forward(self, x):
        q, k, v = self.proj(x).view(2, 6, 3, 2, 4).permute(2, 0, 3, 1, 4)
        return self.drop(self.core(q, k, v)).sum()


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recomputation_drops_what_the_forward_dropped(mode, seeded_rank):
    """Three microbatches in a 1F1B order (F0 F1 B0 F2 B1 B2): the recomputation in B0 must drop what
    F0 dropped though F1 has drawn since, and F2 must draw where F1 left the stream, not where B0's
    recomputation did. The gradients equal those of the run that keeps everything."""
    def gradients(recompute: str) -> list[torch.Tensor]:
        random_streams.seed_rank(7, {"pp": 1, "tp": 1}, torch.device("cpu"))
        torch.manual_seed(0)
        model = _SplitAttention()
        apply_recompute(model, recompute)
        x = torch.randn(3, 2, 6, 8)
        first, second = model(x[0]), model(x[1])
        first.backward()
        third = model(x[2])
        second.backward()
        third.backward()
        return [p.grad for p in model.parameters()]

    kept, recomputed = gradients("none"), gradients(mode)
    assert all(torch.equal(a, b) for a, b in zip(kept, recomputed))
    assert any(g.abs().sum() > 0 for g in kept)


def test_a_region_inside_a_region_draws_on_and_a_second_backward_recomputes_the_same(seeded_rank):
    """A split region opened inside another continues the stream (it does not start the outer's masks
    again); a graph kept for a second backward recomputes the same masks a second time."""
    with random_streams.split_region():
        outer = torch.rand(4)
        with random_streams.split_region():
            inner = torch.rand(4)
    split_reference = torch.Generator().manual_seed(random_streams.seeds(7, 1, 1)[1])
    assert torch.equal(torch.cat([outer, inner]), torch.rand(8, generator=split_reference))

    model = _SplitAttention()
    apply_recompute(model, "full")
    loss = model(torch.randn(2, 6, 8))
    first = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
    second = torch.autograd.grad(loss, list(model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
