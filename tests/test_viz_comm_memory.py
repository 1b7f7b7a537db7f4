"""The communication figures as a learner reads them: bars in the order the algorithm runs, rank labels
clear of the node boxes."""

from paralab.trace import COMM, STEP, Span, Trace
from paralab.viz.comm import comm_link_split, comm_matrix, link_split_data


def hierarchical_trace() -> Trace:
    """One step of a hierarchical all-reduce on 2 nodes of 2 ranks: reduce-scatter inside the node,
    all-reduce across, all-gather inside, in that order on every rank."""
    spans = []
    for rank in range(4):
        node = [rank - rank % 2, rank - rank % 2 + 1]
        partner = [rank % 2, rank % 2 + 2]
        spans += [
            Span(rank, STEP, "step", 0.0, 10.0, step=0),
            Span(rank, COMM, "reduce_scatter", 1.0, 2.0, bytes=50, step=0, group_size=2, group_ranks=node),
            Span(rank, COMM, "all_reduce", 3.0, 4.0, bytes=50, step=0, group_size=2, group_ranks=partner,
                 inter_node=True),
            Span(rank, COMM, "all_gather", 5.0, 6.0, bytes=50, step=0, group_size=2, group_ranks=node),
        ]
    return Trace(spans=spans, meta={"world_size": 4, "gpus_per_node": 2})


def test_link_split_lists_the_ops_in_the_order_a_step_runs_them():
    # alphabetical order had drawn all_gather, all_reduce, reduce_scatter: the hierarchy backwards
    order = ["reduce_scatter", "all_reduce", "all_gather"]
    trace = hierarchical_trace()
    assert list(link_split_data(trace)) == order
    fig = comm_link_split({"hierarchical": trace})
    assert list(fig.data[0].x[1]) == order
    assert link_split_data(trace)["all_reduce"] == {"intra_node": 0, "inter_node": 200}


def test_rank_matrix_labels_stand_off_the_node_boxes():
    # the first node's dashed box runs along the plot's edges, where the tick labels sat: "r0" was clipped
    fig = comm_matrix(hierarchical_trace())
    assert any(shape.line.dash == "dash" for shape in fig.layout.shapes)  # the node boxes are drawn
    assert fig.layout.yaxis.ticklabelstandoff >= 5 and fig.layout.xaxis.ticklabelstandoff >= 5


def test_several_runs_keep_each_run_s_order_on_the_shared_axis():
    # plotly orders a multicategory axis's inner labels by their first appearance anywhere: the flat
    # ring's all_reduce, drawn first, had pulled the hierarchy's all_reduce ahead of its reduce_scatter
    flat = Trace(spans=[Span(r, COMM, "all_reduce", 0.0, 1.0, bytes=100, step=0, group_size=4)
                        for r in range(4)])
    fig = comm_link_split({"flat ring": flat, "hierarchical": hierarchical_trace()})
    runs, ops = (list(level) for level in fig.data[0].x)
    assert runs == ["flat ring"] + ["hierarchical"] * 3
    plain = [op.replace("\u200b", "") for op in ops]
    assert plain == ["all_reduce", "reduce_scatter", "all_reduce", "all_gather"]
    first_seen = list(dict.fromkeys(ops))  # plotly's order of the inner labels
    hierarchical = [first_seen.index(op) for op in ops[1:]]
    assert hierarchical == sorted(hierarchical)  # reduce-scatter, all-reduce, all-gather, left to right
    # runs whose ops agree keep their plain labels
    same = comm_link_split({"a": flat, "b": flat})
    assert list(same.data[0].x[1]) == ["all_reduce", "all_reduce"]


def test_a_simulated_replicas_groups_are_named_by_their_axes_and_not_drawn_between_its_stages():
    """A simulated trace draws one replica's pipeline ranks: its tp and dp groups run among ranks it
    does not draw. A tp 2 all-gather had been drawn between stages 0 and 1 and the dp 4 reduction round
    all four (r3 -> r0 by the ring), and each named "group of N"; only the sends and the tied
    embedding's all-reduce (first and last stage) run between the ranks drawn. (Where two degrees are
    equal, the group is named "dp or tp".)"""
    from paralab.sim import ParallelSpec, get_hardware, get_model, predict_trace
    from paralab.viz.comm import bytes_by_dimension, comm_matrix_data

    spec = ParallelSpec(dp=4, tp=2, pp=4, zero=1, global_batch=32, microbatches=4, sequence_parallel=True)
    trace = predict_trace(get_model("gpt3-1.3b"), spec, get_hardware("h100"))
    assert trace.meta["replica_of"] == dict(dp=4, tp=2, pp=4, ep=1, micro_batch=2, stage_layers=None)
    assert set(bytes_by_dimension(trace)) == {"dp", "tp", "pp"}
    matrix = comm_matrix_data(trace)
    talks = {(src, dst) for src, row in enumerate(matrix) for dst, b in enumerate(row) if b}
    assert talks == {(0, 1), (1, 2), (2, 3), (1, 0), (2, 1), (3, 2), (0, 3), (3, 0)}
    sends = sum(s.bytes for s in trace.spans if s.kind == "send")
    tied = sum(s.bytes for s in trace.spans if s.name == "tied embedding all-reduce")
    assert sum(map(sum, matrix)) == sends + tied
