"""mp and pp (every schedule) against single-device training, against torch.distributed.pipelining,
and against what the schedule validator predicts; configs that cannot run are refused up front.

Launches are the cost here (1-3 s each), so each pipeline run is made once (``pipeline_run`` caches
it) and every check that can read the same run does.
"""

import pytest

import paralab
from paralab.config import ConfigError, RunConfig
from paralab.layout import resolve_layout
from paralab.models.gpt import build_part
from paralab.schedules import build_schedule, theoretical_bubble, validate_schedule
from paralab.sim.events import simulate_schedule
from paralab.stage_split import balanced_split
from paralab.strategies.pipeline_stage import stage_part_indices
from tests.conftest import assert_close_rel, assert_same_params

# eight layers, so that pp = 4 has room for two chunks per rank (interleaved, zbv); small and cheap
MODEL = dict(layers=8, hidden=32, heads=2, vocab=64, seq_len=16)
STEPS, BATCH = 3, 8
LR = {"sgd": 0.05, "adam": 3e-3}

# (schedule, pp, microbatches, virtual_stages, optimizer): every schedule at pp = 2 and 4, several
# microbatch counts, some below the number of stages. SGD runs also compare parameters (see
# tests/test_data_parallel.py for why Adam runs compare losses only).
CASES = [
    ("naive", 4, 1, 1, "sgd"),
    ("naive", 2, 1, 1, "adam"),
    ("gpipe", 2, 1, 1, "sgd"),
    ("gpipe", 4, 8, 1, "sgd"),
    ("1f1b", 2, 4, 1, "sgd"),
    ("1f1b", 4, 2, 1, "adam"),
    ("interleaved", 4, 4, 2, "sgd"),
    ("interleaved", 2, 2, 4, "adam"),
    ("zb-h1", 2, 8, 1, "sgd"),
    ("zb-h1", 4, 2, 1, "sgd"),
    ("zbv", 4, 4, 2, "sgd"),
    ("zbv", 2, 1, 2, "adam"),
    ("dualpipev", 2, 4, 2, "sgd"),
    ("dualpipev", 4, 8, 2, "sgd"),
    # interleaved with microbatches the stages do not divide: fewer than p, and 4 on 3 ranks
    ("interleaved", 4, 2, 2, "sgd"),
    ("interleaved", 3, 4, 2, "sgd"),
    ("1f1b", 4, 4, 1, "sgd"),
]
# uneven, user-given splits (torch_pp gets them too): lighter first and last stages, as Megatron's
# first/last-stage layer options make them; 8 layers over 3 x 2 chunks cannot split evenly at all
STAGE_LAYERS = {("1f1b", 2, 4): [3, 5], ("1f1b", 4, 4): balanced_split(8, 4, first=1, last=1),
                ("interleaved", 3, 4): balanced_split(8, 6, first=1, last=1)}
_runs: dict = {}


def pipeline_run(schedule, pp, microbatches, virtual_stages, optimizer, strategy=None):
    key = (strategy, schedule, pp, microbatches, virtual_stages, optimizer)
    if key not in _runs:
        strategy = strategy or ("mp" if schedule == "naive" else "pp")
        options = {} if strategy == "mp" else dict(pp=pp, schedule=schedule, microbatches=microbatches,
                                                   virtual_stages=virtual_stages)
        _runs[key] = paralab.run(strategy, pp, steps=STEPS, model=MODEL, global_batch=BATCH,
                                 optimizer=optimizer, lr=LR[optimizer], collect_state=True,
                                 stage_layers=STAGE_LAYERS.get((schedule, pp, microbatches)), **options)
    return _runs[key]


@pytest.fixture(scope="module")
def references():
    return {opt: paralab.run("single", 1, steps=STEPS, model=MODEL, global_batch=BATCH, optimizer=opt,
                             lr=LR[opt], collect_state=True)
            for opt in ("adam", "sgd")}


@pytest.mark.parametrize("schedule, pp, microbatches, virtual_stages, optimizer", CASES)
def test_same_losses_and_parameters_as_single_device(references, schedule, pp, microbatches, virtual_stages,
                                                     optimizer, no_leftover_ranks):
    run = pipeline_run(schedule, pp, microbatches, virtual_stages, optimizer)
    what = f"{schedule} pp={pp} m={microbatches} v={virtual_stages}"
    reference = references[optimizer]
    assert len(run.losses) == STEPS
    assert_close_rel(run.losses, reference.losses, what=f"{what} losses")
    if optimizer == "sgd":
        assert_same_params(run.params, reference.params)
        assert set(run.grads) == set(reference.grads)
    # each rank holds the parameters of the split it was given
    if (schedule, pp, microbatches) in STAGE_LAYERS:
        cfg = paralab.ModelConfig(**MODEL)
        stages = pp * virtual_stages
        parts = stage_part_indices(cfg, stages, STAGE_LAYERS[(schedule, pp, microbatches)])
        owner = build_schedule(schedule, pp, microbatches, virtual_stages).stage_to_rank
        held = [r["memory"]["final"]["params"] for r in run.rank_results]
        assert held == [4 * sum(p.numel() for s in range(stages) if owner[s] == rank for i in parts[s]
                                for p in build_part(cfg, i, 0).parameters()) for rank in range(pp)]


@pytest.mark.parametrize("schedule, pp, microbatches, virtual_stages, optimizer", CASES)
def test_trace_and_memory_agree_with_the_schedule(schedule, pp, microbatches, virtual_stages, optimizer,
                                                  no_leftover_ranks):
    """One compute span per compute action (tagged with its stage and microbatch), the measured peak
    of held activations equals the validator's, and the summary carries the closed-form bubble."""
    run = pipeline_run(schedule, pp, microbatches, virtual_stages, optimizer)
    plan = build_schedule(schedule, pp, microbatches, virtual_stages)
    predicted = validate_schedule(plan).peak_activations
    assert [r["peak_activations"] for r in run.rank_results] == predicted
    if schedule == "gpipe":
        assert predicted == [microbatches] * pp
    if schedule == "1f1b":
        assert all(predicted[r] <= pp - r for r in range(pp))
    for rank, actions in enumerate(plan.actions):
        expected = sorted((a.op, a.stage, a.microbatch) for a in actions if a.is_compute)
        for step in range(STEPS):
            spans = [s for s in run.trace.select(lane="compute", rank=rank)
                     if s.step == step and s.kind != "optimizer"]
            assert sorted((s.kind, s.stage, s.microbatch) for s in spans) == expected
    # each send and receive tagged with its own action's stage and microbatch, as its name says: a
    # receive posted ahead, during the compute before it, had borne that compute's microbatch
    for rank, actions in enumerate(plan.actions):
        expected = sorted((a.op.split("_")[0], a.stage, a.microbatch) for a in actions if not a.is_compute)
        p2p = [s for s in run.trace.select(lane="comm", rank=rank) if s.step == 0 and s.peer is not None]
        assert sorted((s.kind, s.stage, s.microbatch) for s in p2p) == expected
        assert all(s.name.endswith(f"{s.microbatch} s{s.stage}") for s in p2p if s.kind == "recv")
    sends = [s for s in run.trace.select(kind="send") if s.step == 0]
    assert len(sends) == sum(a.op.startswith("send") for acts in plan.actions for a in acts)
    hidden = MODEL["hidden"] * MODEL["seq_len"] * (BATCH // microbatches) * 4
    assert all(s.payload_bytes == hidden for s in sends)
    # every send ends by the end of the receive that took its data (gloo's isend says it is done only
    # in the wait at the end of the step: its sends had been drawn in flight until then)
    pairs = run.trace.p2p_pairs()
    assert len(pairs) == len(run.trace.select(kind="send"))
    assert all(send.end <= max(recv.end, send.start + send.issue_s) for send, recv in pairs)
    summary = run.summary
    assert (summary["bubble_theoretical"]
            == pytest.approx(theoretical_bubble(schedule, pp, microbatches, virtual_stages)))
    assert 0.0 < summary["bubble_fraction"] < 1.0


@pytest.mark.parametrize("schedule, pp, microbatches, virtual_stages, optimizer", [
    ("gpipe", 4, 8, 1, "sgd"),
    ("1f1b", 2, 4, 1, "sgd"),
    ("interleaved", 4, 4, 2, "sgd"),
])
def test_same_losses_as_torch_pipelining(schedule, pp, microbatches, virtual_stages, optimizer,
                                         no_leftover_ranks):
    ours = pipeline_run(schedule, pp, microbatches, virtual_stages, optimizer)
    torchs = pipeline_run(schedule, pp, microbatches, virtual_stages, optimizer, strategy="torch_pp")
    assert_close_rel(ours.losses, torchs.losses, what=f"{schedule} losses vs torch")
    assert_same_params(ours.params, torchs.params)
    # the meter reads both pipelines' saved activations alike, rank by rank (the last within 5%: there
    # torch's reads more, by one microbatch's loss tensors at 1f1b)
    ours_held, torchs_held = ([r["memory"]["max_by_kind"]["activations"] for r in run.rank_results]
                              for run in (ours, torchs))
    assert torchs_held == pytest.approx(ours_held, rel=0.05) and min(torchs_held) > 0
    # the schedule's own bubble, whichever implementation ran it (torch's had read 0), by hand: the
    # (p - 1) idle slots of a step of v m + p - 1
    theory = (pp - 1) / (virtual_stages * microbatches + pp - 1)
    assert torchs.summary["bubble_theoretical"] == pytest.approx(theory) == ours.summary["bubble_theoretical"]


@pytest.mark.parametrize("schedule, pp, microbatches, virtual_stages", [
    ("interleaved", 4, 2, 2), ("interleaved", 3, 4, 2), ("1f1b", 4, 4, 1), ("dualpipev", 2, 4, 2),
])
def test_executor_simulator_and_validator_agree_on_the_order(schedule, pp, microbatches, virtual_stages,
                                                             no_leftover_ranks):
    """Each rank's computes, in time order, as the executor ran them (every step), as the event
    simulator times them with stage times in proportion to each stage's blocks (uneven splits too),
    and as the validator's proved global order visits them: the schedule's own list, every time."""
    run = pipeline_run(schedule, pp, microbatches, virtual_stages, "sgd")
    plan = build_schedule(schedule, pp, microbatches, virtual_stages)
    counts = (STAGE_LAYERS.get((schedule, pp, microbatches))
              or [MODEL["layers"] // plan.num_stages] * plan.num_stages)
    unit = {"forward": 1.0, "backward": 2.0, "backward_input": 1.0, "backward_weight": 1.0}
    simulated = simulate_schedule(plan, lambda a: unit[a.op] * counts[a.stage], 0.1)
    proved = validate_schedule(plan).order
    for rank, actions in enumerate(plan.actions):
        listed = [(a.op, a.stage, a.microbatch) for a in actions if a.is_compute]
        assert [key for r, i in proved if r == rank
                for key in [(actions[i].op, actions[i].stage, actions[i].microbatch)]
                if actions[i].is_compute] == listed
        assert [(s.kind, s.stage, s.microbatch) for s in sorted(simulated.select(lane="compute", rank=rank),
                                                                key=lambda s: s.start)] == listed
        for step in range(STEPS):
            spans = sorted((s for s in run.trace.select(lane="compute", rank=rank)
                            if s.step == step and s.kind != "optimizer"), key=lambda s: s.start)
            assert [(s.kind, s.stage, s.microbatch) for s in spans] == listed


def test_stage_split_is_balanced_and_overridable():
    cfg = paralab.ModelConfig(**MODEL)
    assert stage_part_indices(cfg, 2) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert stage_part_indices(cfg, 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert stage_part_indices(cfg, 2, [1, 7]) == [[0, 1], [2, 3, 4, 5, 6, 7, 8, 9]]


def test_balanced_split_makes_the_ends_lighter_by_what_they_cost():
    assert balanced_split(8, 4, first=1, last=1) == [1, 3, 3, 1]
    assert balanced_split(8, 4, first=0, last=0) == [2, 2, 2, 2]
    assert balanced_split(10, 4, first=0, last=0) == [2, 3, 3, 2]
    assert balanced_split(16, 4, first=1, last=3) == [4, 5, 5, 2]  # a large vocabulary: the loss end lightest
    def most_work(counts, first, last):
        return max(c + (first if s == 0 else 0) + (last if s == len(counts) - 1 else 0)
                   for s, c in enumerate(counts))

    def splits(layers, stages):  # every way to give each stage at least one block
        if stages == 1:
            yield [layers]
            return
        for c in range(1, layers - stages + 2):
            yield from ([c, *rest] for rest in splits(layers - c, stages - 1))

    for layers, stages, first, last in ((8, 4, 1, 1), (16, 4, 1, 3), (14, 5, 2.5, 4.0), (7, 3, 0.5, 0.5)):
        counts = balanced_split(layers, stages, first, last)
        assert sum(counts) == layers and min(counts) >= 1
        best = min(most_work(c, first, last) for c in splits(layers, stages))
        assert most_work(counts, first, last) == best
    with pytest.raises(ValueError, match="5 stages but the model has only 4 layers"):
        balanced_split(4, 5)


def _refused(match, strategy="pp", world_size=2, global_batch=BATCH, **options):
    cfg = RunConfig.build(MODEL, strategy=strategy, world_size=world_size,
                          global_batch=global_batch, **options)
    with pytest.raises(ConfigError, match=match):
        resolve_layout(cfg)


def test_configs_that_cannot_run_are_refused_before_any_process_starts():
    _refused(r"16 stages but the model has only 8 layers", world_size=8, pp=8, schedule="interleaved",
             microbatches=8, virtual_stages=2)
    _refused(r"9 stages but the model has only 8 layers", strategy="mp", world_size=9, global_batch=9)
    _refused(r"not divisible by 3 microbatches; microbatch counts that fit: \[1, 2, 4, 8\]", pp=2,
             schedule="gpipe", microbatches=3)
    _refused(r"2 equal rounds: 5 % 2 != 0", pp=2, schedule="interleaved", microbatches=5, virtual_stages=2,
             global_batch=10)
    # the counts offered divide the batch too: 3, 4 and 6 had been offered, each then refused for it
    _refused(r"5 % 2 != 0; microbatch counts that fit: \[1, 2, 10\]$", pp=2, schedule="interleaved",
             microbatches=5, virtual_stages=2, global_batch=10)
    _refused(r"not divisible by 3 microbatches; microbatch counts that fit: \[1, 2, 10\]$", pp=2,
             schedule="interleaved", microbatches=3, virtual_stages=2, global_batch=10)  # 5 had been offered
    # a batch the replicas cannot share is said first: the schedule had offered counts (3, 4, 6) that the
    # batch then refused in turn
    _refused(r"global batch 10 is not divisible by the 3 data-parallel ranks; global batches that fit: "
             r"\[3, 6, 9, 12\]$", strategy="hybrid", world_size=6, pp=2, schedule="interleaved",
             microbatches=5, virtual_stages=2, global_batch=10)
    _refused(r"8 layers over 2 x 3 = 6 chunks does not divide", pp=2, schedule="interleaved", microbatches=2,
             virtual_stages=3)
    _refused(r"unknown pipeline schedule 'pipedream'.*gpipe", pp=2, schedule="pipedream")
    _refused(r"pp=2 but world size 4", world_size=4, pp=2, schedule="1f1b")
    _refused(r"stage_layers=\[3, 3\]", pp=2, schedule="1f1b", stage_layers=[3, 3])
    _refused(r"mp runs the whole batch", strategy="mp", microbatches=2)
    _refused(r"virtual_stages=2 needs interleaved", pp=2, schedule="1f1b", virtual_stages=2)
    _refused(r"unknown pipeline schedule 'zbv' for torch_pp", strategy="torch_pp", pp=2, schedule="zbv")


def test_mp_is_the_naive_schedule_on_every_rank():
    layout = resolve_layout(RunConfig.build(MODEL, strategy="mp", world_size=4))
    assert (layout.pp, layout.schedule, layout.microbatches) == (4, "naive", 1)


@pytest.mark.parametrize("schedule, pp, v", [("1f1b", 2, 1), ("interleaved", 2, 2), ("zbv", 2, 2)])
def test_each_stage_boundary_sends_each_way_on_a_group_of_its_own(monkeypatch, schedule, pp, v):
    """NCCL runs a group's sends and receives one after another in the order issued: with activations
    and gradients on one group, stage 0's receive of a gradient, posted ahead of its compute, kept its
    first activation from leaving, which stage 1 waits for before it sends that gradient (a deadlock
    no gloo run shows: gloo matches each message apart). A boundary's two directions get two groups."""
    from paralab.strategies import pipeline

    made = []
    monkeypatch.setattr(pipeline.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(pipeline.dist, "new_group", lambda ranks: made.append(tuple(ranks)) or object())
    plan = build_schedule(schedule, pp, 4, v)
    groups = pipeline.stage_groups(plan)
    crossing = [b for b in range(plan.num_stages - 1) if plan.stage_to_rank[b] != plan.stage_to_rank[b + 1]]
    assert set(groups) == {(b, link) for b in crossing for link in ("act", "grad")}
    assert len({id(g) for g in groups.values()}) == len(groups) == len(made)
