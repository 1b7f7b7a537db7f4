"""hybrid (dp x tp x pp) against single-device training; gradients synchronised over dp once per step;
the rank layout and its figure; configs refused before any process starts.

Launches dominate (an 8-rank run on two cores takes tens of seconds), so every run is made once per
module (``runs``) and read by several checks. SGD runs compare final parameters and gradients, the
Adam run losses (see tests/test_data_parallel.py for why).
"""

import pytest

import paralab
from paralab.config import ConfigError, RunConfig
from paralab.layout import mesh_layout, resolve_layout
from paralab.sim.bridge import specs_from_run
from paralab.trace import COMM
from paralab.viz.comm_compare import predicted_comm_trace
from tests.conftest import (
    assert_close_rel,
    assert_replicas_agree,
    assert_same_gradient_norm,
    assert_same_params,
)

# four layers and four heads: splits two ways along tp and pp, and into 2 x 2 interleaved chunks
MODEL = dict(layers=4, hidden=32, heads=4, vocab=64, seq_len=16)
STEPS, BATCH, MICROBATCHES = 3, 8, 2
LR = {"sgd": 0.05, "adam": 3e-3}
BUCKET_MB = 0.02  # several ddp buckets per stage of this model

# label -> (dp, tp, pp, optimizer, options); every run has 2 microbatches (DualPipeV 4: it takes two per
# stage), so a sync per microbatch would show as two per step
CASES = {
    "2x2x2 ddp": (2, 2, 2, "sgd", {}),
    "2x2x2 zero1 + sequence parallel": (2, 2, 2, "sgd", dict(zero=1, sequence_parallel=True)),
    "2x2x2 zero2 adam": (2, 2, 2, "adam", dict(zero=2)),
    "2x2x1 ddp + sequence parallel": (2, 2, 1, "sgd", dict(sequence_parallel=True)),
    "2x1x2 zero2 interleaved": (2, 1, 2, "sgd", dict(zero=2, schedule="interleaved", virtual_stages=2)),
    # zero bubble: W's deferred weight gradients must still reach the ddp bucket hooks
    "2x1x2 ddp zb-h1": (2, 1, 2, "sgd", dict(schedule="zb-h1")),
    # and the tensor-parallel layers' weight gradients too, with f and g left in Bi
    "1x2x2 zb-h1 + sequence parallel": (1, 2, 2, "sgd", dict(schedule="zb-h1", sequence_parallel=True)),
    # tensor-parallel stages on the schedules with two chunks per rank
    "1x2x2 interleaved + sequence parallel": (1, 2, 2, "sgd", dict(schedule="interleaved", virtual_stages=2,
                                                                   sequence_parallel=True)),
    "1x2x2 zbv": (1, 2, 2, "sgd", dict(schedule="zbv", virtual_stages=2)),
    # DualPipeV's F&B slots run one microbatch's forward beside another's backward through f and g
    "1x2x2 dualpipev + sequence parallel": (1, 2, 2, "sgd", dict(schedule="dualpipev", virtual_stages=2,
                                                                 microbatches=4, sequence_parallel=True)),
}


@pytest.fixture(scope="module")
def runs():
    common = dict(steps=STEPS, model=MODEL, global_batch=BATCH, collect_state=True, bucket_mb=BUCKET_MB)
    out = {opt: paralab.run("single", 1, optimizer=opt, lr=lr, **common) for opt, lr in LR.items()}
    for label, (dp, tp, pp, opt, options) in CASES.items():
        out[label] = paralab.run("hybrid", dp * tp * pp, dp=dp, tp=tp, pp=pp, optimizer=opt, lr=LR[opt],
                                 **common, **{"microbatches": MICROBATCHES, **options})
    return out


@pytest.mark.timeout(900)
@pytest.mark.parametrize("label", CASES)
def test_same_losses_and_parameters_as_single_device(runs, label, no_leftover_ranks):
    dp, tp, pp, opt, _ = CASES[label]
    run, reference = runs[label], runs[opt]
    assert_close_rel(run.losses, reference.losses, what=f"{label} losses")
    if opt == "sgd":
        assert_same_params(run.params, reference.params)
        assert_same_params(run.grads, reference.grads, atol=1e-7)
    else:
        assert_same_gradient_norm(run.grads, reference.grads)
    reporting = [r["rank"] for r in run.rank_results if r["losses"] is not None]
    assert len(reporting) == dp, "one loss per dp replica: the last stage's tp rank 0"
    assert_replicas_agree(run, lambda r: tuple(r["mesh"]["coord"][axis] for axis in ("pp", "tp", "cp")))
    assert all(r["loss_weight"] == 1 / dp for r in run.rank_results)


@pytest.mark.parametrize("label", ["2x2x2 ddp", "2x2x1 ddp + sequence parallel", "2x1x2 ddp zb-h1"])
def test_ddp_buckets_all_reduced_over_dp_once_per_step(runs, label, no_leftover_ranks):
    """Each bucket's all-reduce appears once per step on every rank (not once per microbatch), on a
    group of dp ranks, and together they carry the rank's parameters exactly once."""
    run = runs[label]
    dp = CASES[label][0]
    for result in run.rank_results:
        rank = result["rank"]
        for step in range(STEPS):
            spans = [s for s in run.trace.select(kind="all_reduce", rank=rank)
                     if s.step == step and s.name.startswith("bucket")]
            names = [s.name for s in spans]
            assert len(names) > 1 and len(set(names)) == len(names), f"rank {rank} step {step}: {names}"
            assert {s.group_size for s in spans} == {dp}
            assert sum(s.payload_bytes for s in spans) == result["memory"]["final"]["params"]


@pytest.mark.parametrize("label",
                         ["2x2x2 zero1 + sequence parallel", "2x2x2 zero2 adam", "2x1x2 zero2 interleaved"])
def test_zero_reduce_scatters_over_dp_once_per_step(runs, label, no_leftover_ranks):
    """ZeRO over dp: each unit's gradients are reduce-scattered once per step and the parameters
    all-gathered once, on groups of dp ranks."""
    run = runs[label]
    dp = CASES[label][0]
    for result in run.rank_results:
        rank = result["rank"]
        units = result["zero"]["units"]
        for step in range(STEPS):
            for kind, prefix in (("reduce_scatter", "grads"), ("all_gather", "params")):
                spans = [s for s in run.trace.select(kind=kind, rank=rank)
                         if s.step == step and s.name.startswith(prefix)]
                assert len(spans) == len(units), f"rank {rank} step {step} {kind}: {[s.name for s in spans]}"
                assert {s.group_size for s in spans} == {dp}


def test_rank_layout_puts_tp_innermost(runs, no_leftover_ranks):
    layout = mesh_layout(dp=2, tp=2, pp=2)
    assert layout.coords == {(p * 2 + d) * 2 + t: (p, d, 0, t)  # cp 0: no context parallelism
                             for p in range(2) for d in range(2) for t in range(2)}
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    text = layout.text().splitlines()
    assert text[2].split() == ["pp0", "dp0", "0", "1"] and text[5].split() == ["dp1", "6", "7"]
    # every rank of the run sat where the layout says, and the run reports the whole layout
    run = runs["2x2x2 ddp"]
    for result in run.rank_results:
        coord = result["mesh"]["coord"]
        assert (coord["pp"], coord["dp"], coord["cp"], coord["tp"]) == layout.coords[result["rank"]]
    assert run.trace.meta["mesh"] == layout.to_dict()["mesh"] and run.layout.coords == layout.coords


def test_collectives_record_their_mesh_group_and_the_matrix_uses_it(runs):
    """tp and dp groups have the same size in 2x2x1: only the recorded ranks tell them apart."""
    from paralab.viz.comm import comm_matrix_data

    run = runs["2x2x1 ddp + sequence parallel"]
    layout = mesh_layout(dp=2, tp=2, pp=1)
    groups = {tuple(g) for dim in ("tp", "dp") for g in layout.groups(dim)}
    spans = run.trace.select(lane="comm")
    assert spans and all(tuple(s.group_ranks) in groups for s in spans)
    assert any(tuple(s.group_ranks) == (0, 2) for s in spans if s.name.startswith("bucket"))
    matrix = comm_matrix_data(run.trace)
    assert matrix[0][2] > 0 and matrix[0][3] == 0  # dp traffic 0<->2, none to the other replica's tp peer


def test_mesh_figure_draws_every_rank_at_its_coordinate(runs):
    pytest.importorskip("plotly")
    from paralab.viz.mesh import mesh

    fig = mesh(runs["2x2x2 ddp"])  # the layout follows from the run's dp, tp and pp
    assert fig.layout.meta["shape"] == [2, 2, 1, 2]
    layout = mesh_layout(dp=2, tp=2, pp=2)
    assert {int(r): tuple(c) for r, c in fig.layout.meta["coords"].items()} == layout.coords
    for axis in ("dp", "tp", "pp"):  # every rank drawn once per panel, in its group
        cells = [int(text) for t in fig.data if t.meta and t.meta["axis"] == axis for text in t.text]
        assert sorted(cells) == list(range(8))
        assert [t.meta["ranks"] for t in fig.data if t.meta and t.meta["axis"] == axis] == layout.groups(axis)


@pytest.mark.parametrize("options, match", [
    (dict(world_size=8, dp=2, tp=2, pp=1), r"2 x 2 x 1 = 4, but world size is 8.*2x2x2"),
    (dict(world_size=4, dp=1, tp=3, pp=1), r"world size is 4"),
    (dict(world_size=6, dp=2, tp=3, pp=1), r"tp 3 does not divide the hidden size"),
    (dict(world_size=8, dp=1, tp=1, pp=8), r"every stage needs a layer"),
    (dict(world_size=4, dp=2, tp=1, pp=2, microbatches=3),
     r"does not split into dp=2 replicas x 3 microbatches"),
    (dict(world_size=4, dp=2, tp=1, pp=2, zero=3), r"not supported: zero3 in hybrid \(with pp=2\)"),
    # at pp=1 the reason is not microbatches' traffic (it had been the only one given)
    (dict(world_size=4, dp=2, tp=2, pp=1, zero=3), r"zero3 in hybrid \(over dp\).*pp=1 as a pipeline of one "
                                                  r"stage too, so its stage 3 \(FSDP inside hybrid's mesh"),
    (dict(world_size=4, dp=2, tp=2, pp=1, zero=2, sequence_parallel=True),
     r"not supported: zero=2 with sequence"),
    (dict(world_size=2, dp=2, tp=1, pp=1, sequence_parallel=True),
     r"needs tp > 1, and this hybrid run has tp 1 \(dp 2\); give tp >= 2"),  # had named no fix
    (dict(world_size=2, strategy="ddp", zero=1), r"zero=1 is a hybrid option"),
    (dict(world_size=2, strategy="zero3", zero=3), r"strategy 'zero3' is ZeRO-3 already: leave zero out"),
])
def test_refuses_what_cannot_run_before_starting(options, match):
    cfg = RunConfig.build(MODEL, **{"strategy": "hybrid", "global_batch": BATCH, **options})
    with pytest.raises(ConfigError, match=match):
        resolve_layout(cfg)


def test_dp_is_inferred_from_the_world_size():
    layout = resolve_layout(RunConfig.build(MODEL, strategy="hybrid", world_size=8, tp=2, pp=2,
                                            global_batch=BATCH))
    assert (layout.dp, layout.batch_per_replica, layout.schedule) == (2, BATCH // 2, "1f1b")


def test_zero_bubble_weight_gradients_launch_ddp_buckets_from_their_hooks(runs, no_leftover_ranks):
    """W hands its deferred weight gradients to autograd, so the bucket hooks fire inside W: every
    bucket's all-reduce starts before the step's last W ends (a fallback after the pipeline would not)."""
    run = runs["2x1x2 ddp zb-h1"]
    for rank in range(4):
        for step in range(STEPS):
            last_w = max(s.end for s in run.trace.select(kind="backward_weight", rank=rank) if s.step == step)
            last_bucket = max(s.start for s in run.trace.select(kind="all_reduce", rank=rank)
                              if s.step == step and s.name.startswith("bucket"))
            assert last_bucket < last_w, f"rank {rank} step {step}"


def test_same_losses_as_torchs_ddp_over_dtensor_tensor_parallel(runs, no_leftover_ranks):
    """torch_hybrid (DistributedDataParallel over DTensor tensor parallel) on dp 2 x tp 2 trains as
    paralab's hybrid does, with SGD, whose steps scale with the gradient (its parameters are DTensors
    under other names: losses only)."""
    common = dict(steps=STEPS, model=MODEL, global_batch=BATCH, optimizer="sgd", lr=LR["sgd"],
                  microbatches=MICROBATCHES)
    ours = paralab.run("hybrid", 4, dp=2, tp=2, pp=1, bucket_mb=BUCKET_MB, **common)
    torchs = paralab.run("torch_hybrid", 4, tp=2, **common)
    assert_close_rel(torchs.losses, ours.losses, what="torch_hybrid vs hybrid losses")
    assert_close_rel(ours.losses, runs["sgd"].losses, what="hybrid vs one device losses")


@pytest.mark.parametrize("zero, dtype, reduce_dtype", [(1, "bf16", "fp32"), (2, "fp16", "fp32"),
                                                      (1, "fp16", "bf16")])  # wider than either: fp32
def test_zero_in_16_bits_hands_back_its_fp32_gradients(zero, dtype, reduce_dtype, no_leftover_ranks):
    """ZeRO keeps the averaged gradients of 16-bit parameters in fp32 (main_grad); the state a run
    hands back carries them as they are (it had assigned them to the bf16/fp16 .grad and failed),
    loss-scaled in fp16 as one device's .grad is (2^16 here: no step overflowed)."""
    common = dict(steps=STEPS, model=MODEL, global_batch=BATCH, collect_state=True, optimizer="sgd",
                  lr=LR["sgd"], dtype=dtype)
    run = paralab.run("hybrid", 2, dp=2, zero=zero, microbatches=MICROBATCHES, reduce_dtype=reduce_dtype,
                      **common)
    reference = paralab.run("single", 1, **common)
    assert_close_rel(run.losses, reference.losses, rel=1e-2, what=f"zero{zero} {dtype} losses")
    assert all(g.dtype.is_floating_point and g.dtype.itemsize == 4 for g in run.grads.values())
    assert run.summary["skipped_steps"] == reference.summary["skipped_steps"] == []
    scale = 2.0**16 if dtype == "fp16" else 1.0
    reference_grads = {k: g.float() for k, g in reference.grads.items()}
    assert_same_params(run.grads, reference_grads, rel=5e-2, atol=1e-3 * scale)
    # elementwise, 16-bit rounding needs a loose bound; the whole gradient's norm and the weights the
    # steps made need none so loose (a gradient off by a factor would pass the first, not these)
    assert_same_gradient_norm(run.grads, reference_grads, rel=1e-2)
    assert_same_params(run.params, {k: p.float() for k, p in reference.params.items()}, rel=1e-2, atol=1e-3)


@pytest.mark.parametrize("label", CASES)
def test_the_simulator_counts_the_bytes_each_rank_sent(runs, label, no_leftover_ranks):
    """The cost model's count of the same run, collective by collective on the mesh's groups, against
    the trace: rank by rank, op by op, per step."""
    predicted = predicted_comm_trace(*specs_from_run(runs[label].config))
    assert sent_per_step(predicted) == pytest.approx(sent_per_step(runs[label].trace), rel=1e-3)


def sent_per_step(trace) -> dict[tuple[int, str], float]:
    """(rank, op) -> wire bytes the rank sends per step (receives put none on the wire)."""
    spans = [s for s in trace.select(lane=COMM) if s.step is not None and s.bytes]
    steps = len({s.step for s in spans})
    out: dict[tuple[int, str], float] = {}
    for s in spans:
        out[s.rank, s.kind] = out.get((s.rank, s.kind), 0.0) + s.bytes / steps
    return out
