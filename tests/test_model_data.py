"""The tiny GPT and the synthetic corpus: layout-independent initialisation, exact parameter count,
deterministic data whose global batch does not depend on the number of ranks, and learnability."""

import numpy as np
import pytest
import torch

import paralab
from paralab.config import MODEL_PRESETS
from paralab.data import DataLoader, GlobalBatchSampler, SyntheticCorpus, shard, weighted_shard
from paralab.models.gpt import GPT, build_part


def test_parts_are_initialised_the_same_alone_or_in_the_whole_model():
    cfg = MODEL_PRESETS["tiny"]
    whole = GPT(cfg, seed=3)
    alone = build_part(cfg, 3, seed=3)  # blocks.2 built on its own, as a pipeline stage would
    for (name, p), (_, q) in zip(whole.blocks[2].named_parameters(), alone.named_parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(whole.blocks[0].mlp.fc.weight, whole.blocks[1].mlp.fc.weight)


def test_parameter_count_formula_matches_the_module():
    for cfg in MODEL_PRESETS.values():
        if cfg.hidden > 256:
            continue
        assert cfg.param_count() == sum(p.numel() for p in GPT(cfg).parameters())


def test_data_is_deterministic_and_shards_cover_the_global_batch():
    corpus = SyntheticCorpus(vocab=128, seq_len=16, seed=1)
    assert (corpus.sample(5) == SyntheticCorpus(128, 16, seed=1).sample(5)).all()
    assert not (corpus.sample(5) == corpus.sample(6)).all()
    sampler = GlobalBatchSampler(1000, 12, seed=0)
    ids = sampler.step_ids(7)
    for world in (1, 2, 3, 4):
        assert sum((shard(ids, r, world) for r in range(world)), []) == ids
    assert sum((weighted_shard(ids, r, [1, 2, 3]) for r in range(3)), []) == ids
    assert len(weighted_shard(ids, 2, [1, 2, 3])) == 6
    assert [len(weighted_shard(ids, r, [100, 1, 1])) for r in range(3)] == [12, 0, 0]
    kept = [weighted_shard(ids, r, [100, 1, 1], at_least=1) for r in range(3)]
    assert [len(k) for k in kept] == [10, 1, 1] and sum(kept, []) == ids


@pytest.mark.parametrize("vocab, seq_len", [(128, 16), (3, 9), (1, 4)])
def test_a_batch_walks_each_samples_chain_token_by_token(vocab, seq_len):
    """The batch walks its samples' Markov chains a step at a time together; each is the chain its own
    stream draws, token by token: the first from the vocabulary, each next the successor whose
    cumulative weight first reaches the draw (the definition, written out here). Walked together the
    samples must be the same tokens, and a sample alone the same as in a batch."""
    corpus = SyntheticCorpus(vocab, seq_len, seed=2)
    ids = [0, 7, 65535, 7]
    inputs, targets = corpus.batch(ids)
    for row, sample_id in enumerate(ids):
        draws = np.random.default_rng([2, sample_id]).random(seq_len + 1)
        tokens = [int(draws[0] * vocab)]
        for t in range(1, seq_len + 1):
            weights = corpus._cumulative[tokens[-1]]
            choice = min(int(np.searchsorted(weights, draws[t])), len(weights) - 1)
            tokens.append(int(corpus._successors[tokens[-1], choice]))
        assert inputs[row].tolist() == tokens[:-1] and targets[row].tolist() == tokens[1:]
        assert corpus.sample(sample_id).tolist() == tokens


def test_every_sample_once_per_epoch():
    sampler = GlobalBatchSampler(96, 12, seed=0)
    seen = sum((sampler.step_ids(k) for k in range(sampler.steps_per_epoch)), [])
    assert sorted(seen) == list(range(96))
    assert sampler.step_ids(0) != sampler.step_ids(sampler.steps_per_epoch)  # new order next epoch


def test_batches_match_between_whole_and_sharded_loaders():
    loader = DataLoader(128, 16, 8, seed=0)
    x, _ = loader.rank_batch(2)
    x1, _ = loader.rank_batch(2, rank=1, world=2)
    assert torch.equal(x[4:], x1)


def test_the_tiny_model_learns_the_corpus(no_leftover_ranks):
    run = paralab.run("single", 1, steps=50, global_batch=8)
    first, last = run.losses[0], sum(run.losses[-5:]) / 5
    assert first > 4.5  # about ln(128): nothing learnt yet
    assert last < first - 1.0, f"loss fell only from {first:.3f} to {last:.3f}"
