"""Expert parallel (ep, and ep inside hybrid) against single-device training of the same mixture of
experts: the same losses and parameters after SGD, dropless and with a capacity (the same tokens
dropped); all-to-all bytes equal to the tokens routed; the load recorded per expert, rank and step.

Each run is made once per module (``runs``) and read by several checks."""

import pytest

import paralab
from paralab.moe_load import expert_load
from tests.conftest import assert_close_rel, assert_same_params

STEPS, BATCH = 3, 8
# auxiliary-loss coefficients large enough that a wrong gradient scale (with microbatches) would show
DROPLESS = dict(layers=4, hidden=32, heads=2, vocab=64, seq_len=16, experts=4, top_k=2, aux_loss=0.1)
# top-1 with a capacity that drops tokens, a shared expert and the z-loss: every MoE option at once
CAPACITY = dict(DROPLESS, top_k=1, capacity_factor=1.0, shared_expert=True, z_loss=1e-2)
MODELS = {"dropless": DROPLESS, "capacity": CAPACITY}

# label -> (strategy, world, model, options)
CASES = {
    "ep 2": ("ep", 2, "dropless", {}),
    "ep 4": ("ep", 4, "dropless", {}),
    "ep 2 capacity": ("ep", 2, "capacity", {}),
    "ep 4 capacity": ("ep", 4, "capacity", {}),
    "ep 2 x edp 2": ("ep", 4, "dropless", dict(ep=2)),
    "hybrid dp 4 ep 2 capacity": ("hybrid", 4, "capacity", dict(ep=2)),
    "hybrid dp 2 ep 2 x pp 2": ("hybrid", 4, "dropless", dict(pp=2, ep=2, microbatches=2)),
    "hybrid dp 2 ep 2 x pp 2 zbv capacity": ("hybrid", 4, "capacity", dict(pp=2, ep=2, microbatches=2,
                                                                          schedule="zbv")),
    # DualPipeV, whose F&B slots are meant for exactly this: full and split backwards through all-to-alls
    "hybrid dp 2 ep 2 x pp 2 dualpipev": ("hybrid", 4, "dropless", dict(pp=2, ep=2, microbatches=4,
                                                                       schedule="dualpipev")),
}


@pytest.fixture(scope="module")
def runs():
    common = dict(steps=STEPS, global_batch=BATCH, optimizer="sgd", lr=0.05, collect_state=True,
                  bucket_mb=0.01)
    out = {name: paralab.run("single", 1, model=model, **common) for name, model in MODELS.items()}
    for label, (strategy, world, model, options) in CASES.items():
        out[label] = paralab.run(strategy, world, model=MODELS[model], **common, **options)
    return out


@pytest.mark.timeout(900)
@pytest.mark.parametrize("label", CASES)
def test_same_losses_and_parameters_as_the_single_device_moe(runs, label, no_leftover_ranks):
    run, reference = runs[label], runs[CASES[label][2]]
    assert_close_rel(run.losses, reference.losses, what=f"{label} losses")
    assert_same_params(run.params, reference.params)
    assert_same_params(run.grads, reference.grads, atol=1e-7)


@pytest.mark.parametrize("label", [k for k in CASES if "capacity" in k])
def test_the_same_tokens_are_dropped(runs, label):
    ours, reference = expert_load(runs[label].trace), expert_load(runs["capacity"].trace)
    assert sum(reference.dropped_per_step()) > 0, "the capacity case must drop tokens"
    assert ours.dropped_per_step() == reference.dropped_per_step()
    for step in reference.steps:
        assert ours.tokens_per_expert(step) == reference.tokens_per_expert(step)


@pytest.mark.parametrize("label", CASES)
def test_all_to_all_bytes_are_the_tokens_routed_times_hidden_times_dtype(runs, label):
    """Dispatch and combine, forward and backward, each carry every routed token once: their payload is
    tokens x hidden x 4 bytes, and dropless that is batch x seq x top-k per layer; wire bytes leave out
    what a rank sends itself (its own experts' tokens)."""
    run = runs[label]
    model, hidden = MODELS[CASES[label][2]], MODELS[CASES[label][2]]["hidden"]
    load = expert_load(run.trace)
    layout = run.layout
    for step in load.steps:
        routed = sum(sum(load.tokens_per_expert(step, layer)) for layer in load.layers)
        if model.get("capacity_factor") is None:
            assert routed == model["layers"] * BATCH * model["seq_len"] * model["top_k"]
        spans = [s for s in run.trace.select(kind="all_to_all") if s.step == step]
        for name in ("dispatch", "combine", "dispatch backward", "combine backward"):
            mine = [s for s in spans if s.name == name]
            assert sum(s.payload_bytes for s in mine) == routed * hidden * 4, name
        own = 0  # tokens a rank sends to its own experts never reach the wire
        for (s, rank, _), counts in load.routed.items():
            if s == step:
                group = next(g for g in layout.expert_groups() if rank in g)
                per_rank = model["experts"] // layout.ep
                mine = range(group.index(rank) * per_rank, (group.index(rank) + 1) * per_rank)
                own += sum(counts[e] for e in mine)
        dispatch = [s for s in spans if s.name == "dispatch"]
        assert sum(s.bytes for s in dispatch) == (routed - own) * hidden * 4
        assert all(s.group_size == layout.ep for s in spans)


def test_load_is_recorded_per_expert_rank_and_step(runs):
    run = runs["ep 4"]
    load = expert_load(run.trace)
    assert load.steps == list(range(STEPS)) and load.ranks == [0, 1, 2, 3] and load.layers == [0, 1, 2, 3]
    assert load.experts == DROPLESS["experts"]
    for step in load.steps:
        # each rank routes its quarter of the batch, k times per token, in every layer
        for rank in load.ranks:
            for layer in load.layers:
                assert sum(load.routed[(step, rank, layer)]) == BATCH // 4 * DROPLESS["seq_len"] * 2
        # and the experts of each rank compute what every rank sent them
        assert sum(load.received_per_rank(step)) == sum(load.tokens_per_expert(step))
        assert 1.0 <= load.imbalance(step) <= DROPLESS["experts"]
    assert run.summary["ep"] == 4 and run.summary["comm_bytes"]["all_to_all"] > 0


def test_expert_gradients_are_reduced_over_their_own_group_only(runs):
    """ep 2 on 4 ranks: replicated parameters all-reduced over the 4 dp ranks, experts over the 2 ranks
    that hold the same ones; nothing else."""
    run = runs["ep 2 x edp 2"]
    reduces = [s for s in run.trace.select(kind="all_reduce") if s.step == 1]
    assert {s.group_size for s in reduces} == {2, 4}
    assert all(s.group_ranks in ([0, 2], [1, 3]) for s in reduces if s.group_size == 2)
    expert_bytes = sum(s.payload_bytes for s in reduces if s.group_size == 2) // 4  # per rank
    dense_bytes = sum(s.payload_bytes for s in reduces if s.group_size == 4) // 4
    cfg = paralab.ModelConfig(**DROPLESS)
    ffn = cfg.hidden * cfg.ffn * 2 + cfg.ffn + cfg.hidden
    assert expert_bytes == cfg.layers * cfg.experts // 2 * ffn * 4
    assert dense_bytes == (cfg.param_count() - cfg.layers * cfg.experts * ffn) * 4


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy, options", [("ddp", {}), ("pp", dict(schedule="zb-h1", microbatches=2))])
def test_a_mixture_of_experts_trains_under_the_other_strategies_too(runs, strategy, options,
                                                                    no_leftover_ranks):
    """Without ep the experts are plain parameters: replicated by ddp, cut into stages by pp (where each
    microbatch's auxiliary loss is scaled as its loss is)."""
    reference = runs["dropless"]
    run = paralab.run(strategy, 2, model=DROPLESS, steps=STEPS, global_batch=BATCH, optimizer="sgd", lr=0.05,
                      collect_state=True, **options)
    assert_close_rel(run.losses, reference.losses, what=f"{strategy} losses")
    assert_same_params(run.params, reference.params)
    assert not run.trace.select(kind="all_to_all")


def test_elastic_training_refuses_a_mixture_of_experts():
    from paralab.elastic.config import ElasticConfig

    with pytest.raises(paralab.ConfigError, match="not supported: elastic training of a mixture of experts"):
        ElasticConfig.build("tiny-moe").validate()
