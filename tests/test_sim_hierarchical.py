"""The simulator's hierarchical all-reduce (paralab's ddp --hierarchical): bytes, time, trace, refusals."""

import argparse
import dataclasses
import json

import pytest

from paralab.config import RunConfig
from paralab.sim import cli, cost, counting
from paralab.sim.bridge import predict_run, specs_from_run
from paralab.sim.hardware import get_hardware
from paralab.sim.presets import get_model
from paralab.sim.specs import ParallelSpec
from paralab.trace import COMM, COMPUTE
from paralab.viz.comm_compare import links_per_rank_step, per_rank_step, predicted_comm_trace

H100 = get_hardware("h100")
MODEL = get_model("gpt3-1.3b")
NODES, LOCAL = 4, 8  # 4 nodes of 8 H100s, one data-parallel rank per GPU


def spec(**options) -> ParallelSpec:
    return ParallelSpec(dp=NODES * LOCAL, global_batch=NODES * LOCAL, **options).resolved()


def test_the_three_steps_send_a_flat_all_reduces_bytes_and_an_lth_of_them_across_nodes():
    """RS (L-1)/L G + AR 2(N-1)/N G/L + AG (L-1)/L G = 2(NL-1)/(NL) G, the flat ring's; only the middle
    step crosses nodes."""
    flat = counting.comm_bytes_per_gpu(MODEL, spec())
    tiered = counting.comm_bytes_per_gpu(MODEL, spec(hierarchical_dp=LOCAL))
    assert set(tiered) == {"dp_intra_reduce_scatter", "dp_inter_all_reduce", "dp_intra_all_gather"}
    assert sum(tiered.values()) == pytest.approx(flat["dp_all_reduce"], rel=1e-12)
    grads = counting.stage_params(MODEL, spec(), 0) * counting.bytes_per_param(MODEL, spec())[1]
    assert tiered["dp_inter_all_reduce"] == pytest.approx(2 * (NODES - 1) / NODES * grads / LOCAL)


def test_its_time_is_the_overlapped_reduce_scatter_then_the_all_reduce_and_all_gather_after_the_backward():
    p = spec(hierarchical_dp=LOCAL)
    trace = cost.predict_trace(MODEL, p, H100)
    backward_end = max(s.end for s in trace.select(lane=COMPUTE) if s.kind == "backward")
    backward_start = min(s.start for s in trace.select(lane=COMPUTE) if s.kind == "backward")
    rs, ar, ag = sorted(trace.select(lane=COMM), key=lambda s: s.start)
    assert [(s.kind, s.group_size, s.inter_node) for s in (rs, ar, ag)] == [
        ("reduce_scatter", LOCAL, False), ("all_reduce", NODES, True), ("all_gather", LOCAL, False)]
    assert rs.start == pytest.approx(backward_start)  # launched as the backward fills its buckets
    assert rs.end == ar.start and ar.end == ag.start and ar.start >= backward_end
    grads = counting.stage_params(MODEL, p, 0) * counting.bytes_per_param(MODEL, p)[1]
    assert ar.duration == pytest.approx(cost.collective_time(H100, "all_reduce", grads / LOCAL, NODES, LOCAL))
    assert ag.duration == pytest.approx(cost.collective_time(H100, "all_gather", grads, LOCAL, 1))
    optimizer = next(s for s in trace.select(lane=COMPUTE) if s.kind == "optimizer")
    assert optimizer.start == pytest.approx(ag.end)
    breakdown = trace.meta["prediction"]["breakdown_s"]
    assert breakdown["dp_comm_exposed"] >= ar.duration + ag.duration  # nothing hides the last two


def test_the_wait_for_the_slowest_replica_lands_on_the_step_across_nodes():
    """The replicas meet in the all-reduce across nodes; a node's reduce-scatter waits for its own."""
    jittery = dataclasses.replace(H100, sync_jitter=1e-3)
    traces = [cost.predict_trace(MODEL, spec(hierarchical_dp=LOCAL), hw) for hw in (H100, jittery)]
    steady, waiting = (sorted(trace.select(lane=COMM), key=lambda s: s.start) for trace in traces)
    assert steady[0].duration == pytest.approx(waiting[0].duration)
    # the expected slowest of all 32 replicas after the backward (of the 4 nodes' groups it had passed too)
    backward_end = max(s.end for s in traces[1].select(lane=COMPUTE) if s.kind != "optimizer")
    assert waiting[1].duration - steady[1].duration == pytest.approx(
        cost.sync_wait(jittery, backward_end, NODES * LOCAL))


def test_a_step_is_drawn_across_nodes_where_the_hardware_puts_it():
    """Nodes of 16 ranks on 8-GPU H100 nodes: their reduce-scatter is priced over the NICs, and drawn so."""
    rs, ar, _ = sorted(cost.predict_trace(MODEL, spec(hierarchical_dp=16), H100).select(lane=COMM),
                       key=lambda s: s.start)
    assert rs.inter_node and ar.inter_node


@pytest.mark.parametrize("nodes, local", [(2, 2), (4, 0)])  # one rank a node: the flat all-reduce
def test_the_lab_predicts_its_hierarchical_run_with_emulated_nodes(nodes, local):
    cfg = RunConfig.build("tiny", strategy="ddp", world_size=4, nodes=nodes, hierarchical=True,
                          global_batch=8)
    assert specs_from_run(cfg)[1].hierarchical_dp == local
    # its three steps priced where it has them, and the flat all-reduce where a node holds one rank
    model, asked = specs_from_run(cfg)
    hierarchical, plain = (cost.predict(model, s, H100) for s in (asked, asked.replace(hierarchical_dp=0)))
    assert predict_run(cfg, "h100").step_time_s == hierarchical.step_time_s
    assert (hierarchical.step_time_s == plain.step_time_s) == (local == 0)


def test_the_lab_counts_its_hierarchical_runs_steps():
    cfg = RunConfig.build("tiny", strategy="ddp", world_size=4, nodes=2, hierarchical=True, global_batch=8)
    flat = RunConfig.build("tiny", strategy="ddp", world_size=4, nodes=2, global_batch=8)
    assert specs_from_run(flat)[1].hierarchical_dp == 0
    predicted = predicted_comm_trace(*specs_from_run(cfg), gpus_per_node=2)
    ops = per_rank_step(predicted)
    assert set(ops) == {"reduce_scatter", "all_reduce", "all_gather"}
    links = links_per_rank_step(predicted)  # of G: RS 1/2 + AG 1/2 inside, AR 2(1/2)(1/2) = 1/2 across
    assert links["intra_node"] == pytest.approx(2 * links["inter_node"], rel=1e-6)
    ar = [s for s in predicted.spans if s.kind == "all_reduce"]
    assert sorted(tuple(s.group_ranks) for s in ar) == [(0, 2), (0, 2), (1, 3), (1, 3)]


@pytest.mark.parametrize("options, says", [
    (dict(hierarchical_dp=32), "2 or more nodes"),  # one node: nothing to tier
    (dict(hierarchical_dp=5), "must divide dp"),
    (dict(hierarchical_dp=8, zero=2), "zero 0"),
])
def test_a_hierarchy_that_cannot_be_built_is_refused(options, says):
    problems = spec(**options).problems(MODEL)
    assert any(says in problem for problem in problems), problems


def run_simulate(argv, capsys):
    parser = argparse.ArgumentParser()
    cli.add_simulate_args(parser)
    rc = cli.simulate_main(parser.parse_args(argv))
    return rc, capsys.readouterr()


def test_simulate_hierarchical_tiers_over_the_ranks_each_node_holds(capsys):
    rc, out = run_simulate(["--model", "gpt3-1.3b", "--hardware", "h100", "--gpus", "32", "--tp", "2",
                            "--hierarchical", "--json"], capsys)
    assert rc == 0
    data = json.loads(out.out)
    assert "hierarchical all-reduce over nodes of 4 dp ranks" in data["config"]  # 8 GPUs / tp 2
    assert "dp_inter_all_reduce" in data["comm_bytes_per_gpu"] and data["hierarchical_dp"] == 4
    rc, out = run_simulate(["--model", "gpt3-1.3b", "--hardware", "h100", "--gpus", "8", "--hierarchical"],
                           capsys)
    assert rc == 2 and "on h100 (8 GPUs a node) dp 8 is 1 node of 8 ranks" in out.err
    rc, out = run_simulate(["--model", "gpt3-1.3b", "--hardware", "h100", "--gpus", "12", "--hierarchical"],
                           capsys)
    assert rc == 2 and "8 ranks a node do not divide dp 12" in out.err
