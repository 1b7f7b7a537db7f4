"""Bring your own trace: torch.profiler traces in, paralab's Trace out (paralab.trace_import).

Real traces made here: torch's DistributedDataParallel on 2 gloo ranks profiling itself under
torchrun, and a paralab pipeline run with --profile, whose import must agree with paralab's own
trace. The CUDA parts (kernels, NCCL kernels, memcpy, streams, clocks of two hosts) read the Kineto
fixture of tests/data/kineto_gpu/ (written by tests/kineto_gpu.py, which documents its structure).
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import statistics
from pathlib import Path

import kineto_gpu  # tests/ is on sys.path under pytest (no __init__.py)
import psutil
import pytest

import paralab
from paralab import viz
from paralab.cli import main as cli_main
from paralab.profiling import parse_label, span_label
from paralab.runtime.torchrun import run_torchrun
from paralab.trace import COMM, COMPUTE, STEP, Span, Trace
from paralab.trace_import import ProfileError, ProfileWarning, RankProfile, import_profile, paralab_spans
from paralab.trace_ops import Event, comm_spans, compute_spans, op_name

HERE = Path(__file__).parent
GPU_FIXTURE = HERE / "data" / "kineto_gpu"
DDP_JOB = HERE / "ddp_profiled_job.py"


# ------------------------------------------------------------------------------------------ names
def test_span_labels_round_trip_every_field():
    fields = dict(step=0, microbatch=0, stage=3, name="bucket 0", bytes=10528, payload_bytes=5264, peer=0,
                  group_size=2, inter_node=True, group_ranks=[0, 2])
    label = span_label("all_reduce", COMM, fields, 0.25)
    assert label.startswith("paralab comm:all_reduce ") and label.endswith(" clock=0.250000")  # every span's
    assert parse_label(label) == {"lane": COMM, "kind": "all_reduce", **fields, "clock": 0.25}
    step = span_label("step", STEP, {"step": 4, "name": "step 4", "microbatch": None}, 1.5)
    assert parse_label(step) == {"lane": STEP, "kind": "step", "step": 4, "name": "step 4", "clock": 1.5}
    assert span_label("forward", COMPUTE, {"name": "forward", "step": None, "peer": None}, 0.0) == \
        "paralab compute:forward clock=0.000000"
    for foreign in ("aten::mm", "ProfilerStep#3", "paralab", "paralab nolane"):
        assert parse_label(foreign) is None


def test_torch_names_become_paralab_ops():
    cases = {"c10d::allreduce_": "all_reduce", "gloo:all_reduce": "all_reduce", "allreduce": "all_reduce",
             "c10d::_allgather_base_": "all_gather", "_allgather_base": "all_gather",
             "c10d::_reduce_scatter_base_": "reduce_scatter",
             "reduce_scatter_tensor_coalesced": "reduce_scatter", "c10d::broadcast_": "broadcast",
             "c10d::send": "send", "c10d::recv_": "recv", "gloo:barrier": "barrier",
             "c10d::alltoall_base_": "all_to_all", "nccl:all_reduce": "all_reduce",
             "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)": "all_reduce",
             "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)": "all_gather",
             "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)": "send_recv", "aten::mm": ""}
    assert {name: op_name(name) for name in cases} == cases


def test_host_operators_become_runs_of_one_kind_and_a_blocked_thread_stays_a_gap():
    """One thread's top-level operators, times in us: a forward pass with bookkeeping inside it, the
    autograd engine's backward, 2 ms blocked (DDP waiting for its all-reduce records no operator), the
    reducer's copies, the optimizer."""
    forward, engine = {"Sequence number": 3, "Fwd thread id": 0}, "autograd::engine::evaluate_function: "
    ops = [("aten::linear", 0, 40, forward), ("aten::view", 45, 50, {}), ("aten::relu", 55, 70, forward),
           (engine + "AddmmBackward0", 80, 150, {"Sequence number": 3, "Fwd thread id": 1}),
           ("c10d::allreduce_", 150, 160, {}), (engine + "ReluBackward0", 165, 200, {}),
           ("aten::copy_", 2200, 2230, {}), ("Optimizer.step#SGD.step", 2240, 2300, {})]
    events = [Event(name, "cpu_op", 1, 1, t0 * 1e-6, t1 * 1e-6, args) for name, t0, t1, args in ops]
    events.append(Event("aten::mm", "cpu_op", 1, 1, 10e-6, 30e-6, {}))  # inside aten::linear
    spans = compute_spans(events, [], rank=0, steps=lambda t: 0)
    got = [(s.kind, round(s.start * 1e6), round(s.end * 1e6)) for s in spans]
    assert got == [("forward", 0, 70), ("backward", 80, 150), ("backward", 165, 200), ("other", 2200, 2230),
                   ("optimizer", 2240, 2300)]  # the call ends a run; 200-2200 us is a gap, not compute


def _ops(*rows) -> list[Event]:
    """Events from (name, tid, start us, end us, args) rows."""
    return [Event(name, "cpu_op", 1, tid, t0 * 1e-6, t1 * 1e-6, args) for name, tid, t0, t1, args in rows]


def test_a_blocking_call_inside_an_autograd_range_is_not_backward_compute():
    """DDP's hook all-reduces from inside the autograd engine's AccumulateGrad; under gloo the call
    blocks the thread 700 us: that is communication, cut out of the backward range around it."""
    engine = "autograd::engine::evaluate_function: AccumulateGrad"
    events = _ops((engine, 1, 0, 1000, {}), ("torch::autograd::AccumulateGrad", 1, 10, 990, {}),
                  ("c10d::allreduce_", 1, 200, 900, {}), ("record_param_comms", 1, 210, 890, {}))
    spans = compute_spans(events, [], rank=0, steps=lambda t: 0)
    assert [(s.kind, round(s.start * 1e6), round(s.end * 1e6)) for s in spans] == [
        ("backward", 0, 200), ("backward", 900, 1000)]


def test_a_thread_blocked_after_its_call_returned_stays_a_gap():
    """FSDP2 on gloo: a backward node prefetches the next part's weights with a synchronous all-gather,
    whose c10d op returns once queued (1-2 ms here); the thread then waits for gloo's worker, recording
    nothing, until the node's own op runs (at 55 ms). The wait had been read as backward compute, so an
    exposed all-gather read as overlapped."""
    engine = "autograd::engine::evaluate_function: AddmmBackward0"
    events = _ops((engine, 1, 0, 60_000, {}), ("FSDP::all_gather (2)", 1, 500, 54_900, {}),
                  ("c10d::_allgather_base_", 1, 1000, 2000, {}), ("AddmmBackward0", 1, 55_000, 60_000, {}))
    gloo = _ops(("gloo:all_gather", 2, 1500, 55_000, {}))
    spans = compute_spans(events + gloo, [], rank=0, steps=lambda t: 0)
    assert [(s.kind, round(s.start * 1e6), round(s.end * 1e6)) for s in spans] == [
        ("backward", 0, 1000), ("backward", 55_000, 60_000)]
    # the thread is blocked only while gloo runs a collective: past its end, or with none running, the
    # time unrecorded is the range's own (once gloo's sends too had been read as blocking: a pipeline's
    # compute inside a send's range had gone)
    gloo = _ops(("gloo:all_gather", 2, 1500, 40_000, {}), ("gloo:send", 1, 2000, 50_000, {}))
    spans = compute_spans(events + gloo, [], rank=0, steps=lambda t: 0)
    assert [(s.kind, round(s.start * 1e6), round(s.end * 1e6)) for s in spans] == [
        ("backward", 0, 1000), ("backward", 40_000, 60_000)]


def test_what_gloo_s_worker_runs_inside_an_execution_is_communication():
    """gloo's worker thread copies and sums inside its ``gloo:<op>`` ranges; those operators had been read
    as compute of kind other (10-14 ms a step of FSDP2's on two ranks), overlapping its own collective."""
    run = {"Input type": ["float"], "Input Dims": [[256]]}
    events = _ops(("gloo:all_gather", 2, 0, 5000, run), ("aten::copy_", 2, 100, 900, {}),
                  ("aten::div_", 2, 4000, 4500, {}), ("aten::mm", 1, 0, 3000, {}))
    spans = compute_spans(events, [], rank=0, steps=lambda t: 0)
    assert [(s.kind, round(s.start * 1e6), round(s.end * 1e6)) for s in spans] == [("other", 0, 3000)]


def test_compute_inside_a_gloo_send_s_range_is_compute():
    """gloo runs a send inline: its range on the calling thread is open from the isend to its wait, around
    the compute done meanwhile. Read as a call, it had swallowed that compute (a pipeline's backward:
    1.46 s of rank 0's gone)."""
    forward = {"Sequence number": 3, "Fwd thread id": 0}
    events = _ops(("gloo:send", 1, 0, 5000, {}), ("aten::addmm", 1, 100, 4000, forward),
                  ("aten::relu", 1, 4100, 4500, forward))
    spans = compute_spans(events, [], rank=0, steps=lambda t: 0)
    assert [(s.kind, round(s.start * 1e6), round(s.end * 1e6)) for s in spans] == [("forward", 100, 4500)]


def test_a_functional_collectives_wait_inside_an_op_is_communication_not_compute():
    """DTensor tensor parallel: the op that first uses an all-reduce's result (here aten::pow) waits for
    it inside itself (_c10d_functional::wait_tensor), the thread blocked 3 ms while gloo's worker runs
    it. The wait had been read as the op's forward compute, so the exposed all-reduce read as
    overlapped (rank 0: 5.00 ms compute, 2.98 ms overlapped, 0 exposed on a real profile)."""
    forward = {"Sequence number": 62, "Fwd thread id": 0}
    run = {"Input type": ["float"], "Input Dims": [[8192]]}
    host = _ops(("_c10d_functional::all_reduce", 1, 0, 80, {}), ("c10d::allreduce_", 1, 30, 70, run),
                ("aten::pow", 1, 100, 3200, forward), ("PythonSubclass", 1, 103, 3198, {}),
                ("_c10d_functional::wait_tensor", 1, 140, 3150, {}), ("aten::mean", 1, 3210, 3240, forward),
                ("gloo:all_reduce", 2, 130, 3110, run))
    compute = compute_spans(host, [], rank=0, steps=lambda t: 0)
    assert [(s.kind, round(s.start * 1e6), round(s.end * 1e6)) for s in compute] == [
        ("forward", 100, 140), ("forward", 3150, 3240)]
    spans = [Span(0, STEP, "step", 0.0, 3300e-6, step=0), *compute, *comm_spans(host, [], rank=0, world=2)]
    for s in spans:
        s.step = 0
    breakdown = Trace(spans=spans).time_breakdown()[0]
    assert breakdown["overlapped_comm_s"] == pytest.approx(10e-6)  # 130-140 us, before the wait
    assert breakdown["exposed_comm_s"] == pytest.approx(2970e-6)


def test_gloo_sends_and_recvs_start_at_their_call_and_collectives_at_their_run():
    """gloo's send and recv ranges open as c10d::send / c10d::recv_ return, after the transfer was
    posted (as torch 2.x records them, tid 1); a collective's range on gloo's worker thread (tid 2) is
    its run, whenever the caller asked."""
    shapes = {"Input type": ["TensorList"], "Input Dims": [[[1000]]]}
    run = {"Input type": ["float"], "Input Dims": [[1000]]}
    host = _ops(("c10d::send", 1, 0, 16, shapes), ("gloo:send", 1, 14, 22, run),
                ("c10d::recv_", 1, 30, 40, shapes), ("gloo:recv", 1, 38, 2000, run),
                ("c10d::allreduce_", 1, 2100, 2150, shapes), ("gloo:all_reduce", 2, 2300, 2600, run))
    spans = comm_spans(host, [], rank=0, world=2)
    assert [(s.kind, round(s.start * 1e6), round(s.end * 1e6), s.payload_bytes) for s in spans] == [
        ("send", 0, 22, 4000), ("recv", 30, 2000, 4000), ("all_reduce", 2300, 2600, 4000)]


def test_list_all_gather_counts_the_gathered_tensor_like_all_gather_into_tensor():
    """dist.all_gather(list, t) records only t (its output list of lists has no shapes);
    all_gather_into_tensor records both. Either way, 4 ranks gathering 100 floats: a 1600 B tensor."""
    as_list = {"Input type": ["", "TensorList", "", "Scalar"], "Input Dims": [[], [[100]], [], []]}
    into_tensor = {"Input type": ["float", "float"], "Input Dims": [[400], [100]]}
    shard = {"Input type": ["float"], "Input Dims": [[100]]}
    host = _ops(("c10d::allgather_", 1, 0, 50, as_list), ("gloo:all_gather", 2, 10, 40, shard),
                ("c10d::_allgather_base_", 1, 100, 150, into_tensor), ("gloo:all_gather", 2, 110, 140, shard))
    spans = comm_spans(host, [], rank=0, world=4)
    assert [(s.kind, s.payload_bytes, s.bytes) for s in spans] == [("all_gather", 1600, 1200)] * 2


@pytest.mark.parametrize("rank, dims, splits, payload, wire", [
    (0, [[400], [1000]], ["[100, 300]", "[100, 900]"], 4000, 3600),  # keeps 100 floats, sends 900
    (1, [[1000], [400]], ["[900, 100]", "[300, 100]"], 1600, 1200),  # sends 300, keeps 100
])
def test_an_uneven_all_to_all_counts_its_input_and_the_slices_it_sends_away(rank, dims, splits, payload,
                                                                           wire):
    """all_to_all_single with uneven splits, as paralab.comm counts it: payload the input, wire the
    slices sent to other ranks. The larger of input and output with the even-split factor had given
    4000 B of payload and 2000 B on the wire to both ranks. c10d::alltoall_base_'s arguments are
    (output, input, group, output splits, input splits, ...)."""
    call = {"Input type": ["float", "float", "", "ScalarList", "ScalarList", "Scalar", "Scalar"],
            "Input Dims": [*dims, [], [], [], [], []],
            "Concrete Inputs": ["", "", "", *splits, "False", "-1"]}
    run = {"Input type": ["float"], "Input Dims": [dims[1]]}
    host = _ops(("c10d::alltoall_base_", 1, 0, 30, call), ("gloo:all_to_all", 2, 40, 600, run))
    (span,) = comm_spans(host, [], rank=rank, world=2)
    assert (span.kind, span.payload_bytes, span.bytes, span.group_size) == ("all_to_all", payload, wire, 2)


def test_an_uneven_all_to_all_on_nccl_is_sized_from_its_splits():
    """NCCL's metadata: In msg nelems is the input (the output may be larger), and its split sizes
    count rows of dim 0 (here 2 floats a row): rank 2, the second of group [0, 2], sends 100 of its 400 rows
    to rank 0."""
    meta = {"Collective name": "all_to_allv", "In msg nelems": 800, "Out msg nelems": 2000, "dtype": "Float",
            "Group size": 2, "Process Group Ranks": "[0, 2]", "In split size": "[100, 300]",
            "Out split size": "[700, 300]"}
    kernel = Event("ncclDevKernel_SendRecv", "kernel", 1, 7, 0.0, 1e-5, meta)
    (span,) = comm_spans([], [kernel], rank=2, world=4)
    assert (span.kind, span.payload_bytes, span.bytes) == ("all_to_all", 3200, 800)


def test_bare_calls_take_their_sizes_from_record_param_comms():
    """A GPU profile without CUDA events has no NCCL kernels: the c10d calls are the communication,
    and the record_param_comms inside each says its size even without record_shapes."""
    meta = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float",
            "Group size": 2, "Process Group Ranks": "[0, 1]"}
    host = _ops(("c10d::allreduce_", 1, 0, 30, {}), ("record_param_comms", 1, 5, 28, meta),
                ("nccl:all_reduce", 1, 6, 26, {}))
    (span,) = comm_spans(host, [], rank=0, world=2)
    assert (span.kind, span.payload_bytes, span.bytes, span.group_size) == ("all_reduce", 4096, 4096, 2)


# ------------------------------------------------------------------------------------------ summary
def test_time_breakdown_splits_communication_into_overlapped_and_exposed():
    """Per step: compute 0-8, communication 5-9 of a 10 s step -> 3 s beside compute, 1 s exposed,
    2 s idle (not computing), 1 s waiting with nothing recorded. One rank: its call waits for nobody."""
    spans = []
    for step in (0, 1, 2):
        t = 10.0 * step
        spans += [Span(0, STEP, "step", t, t + 10, step=step),
                  Span(0, COMPUTE, "forward", t, t + 3, step=step),
                  Span(0, COMPUTE, "backward", t + 3, t + 8, step=step),
                  Span(0, COMM, "all_reduce", t + 5, t + 9, step=step)]
    s = Trace(spans=spans).summary()
    expected = {"mean_step_s": 10.0, "compute_s": 8.0, "comm_s": 4.0, "overlapped_comm_s": 3.0,
                "exposed_comm_s": 1.0,
                "comm_waiting_s": 0.0, "comm_transfer_s": 4.0, "exposed_waiting_s": 0.0,
                "exposed_transfer_s": 1.0, "idle_s": 2.0, "wait_s": 1.0}
    assert s["per_rank"][0] == pytest.approx(expected)
    assert {k: s[k] for k in expected} == pytest.approx(expected)  # means over ranks at the top level


# ------------------------------------------------------------------------------------------ GPU fixture
@pytest.fixture(scope="module")
def gpu_trace() -> Trace:
    return paralab.import_profile(GPU_FIXTURE)  # a directory stands for its files


def spans_of(trace: Trace, rank: int, step: int, lane: str | None = None) -> list[Span]:
    return [s for s in trace.spans if s.rank == rank and s.step == step and (lane is None or s.lane == lane)]


def test_gpu_fixture_ranks_steps_and_device_time(gpu_trace):
    assert gpu_trace.ranks == [0, 1] and list(gpu_trace.step_windows()) == [5, 6]
    assert gpu_trace.meta["ranks"][1] == {"node": 1, "host": "gpu-node-1", "device": "cuda"}
    # rank 0, step 6 (from 1000 us): kernels are the compute spans, in device time, kind from their launcher
    got = [(round(s.start * 1e6), round(s.end * 1e6), s.kind, s.payload_bytes)
           for s in spans_of(gpu_trace, 0, 6, COMPUTE)]
    assert got == [(1060, 1080, "memcpy", 65536), (1100, 1300, "forward", 0), (1305, 1315, "forward", 0),
                   (1318, 1320, "memset", 4096), (1330, 1520, "backward", 0), (1530, 1650, "backward", 0),
                   (1850, 1950, "optimizer", 0)]
    step = spans_of(gpu_trace, 0, 6, STEP)[0]
    assert (step.start, step.end) == pytest.approx((1000e-6, 2000e-6))


def test_gpu_fixture_nccl_kernels_with_their_bytes(gpu_trace):
    elements = kineto_gpu.ALLREDUCE_ELEMENTS
    for rank in (0, 1):
        comm = spans_of(gpu_trace, rank, 6, COMM)
        all_reduce = [s for s in comm if s.kind == "all_reduce"]
        assert len(all_reduce) == 1
        ar = all_reduce[0]
        # fp32, group of 2: payload the tensor, wire 2 (n-1)/n of it; two hosts, so it crosses nodes
        assert (ar.payload_bytes, ar.bytes) == (4 * elements, 4 * elements)
        assert ar.group_size == 2 and ar.inter_node
        assert ar.name.startswith("ncclDevKernel_AllReduce")
    sent = 4 * kineto_gpu.SEND_ELEMENTS
    send = [s for s in spans_of(gpu_trace, 0, 6, COMM) if s.kind == "send"][0]
    recv = [s for s in spans_of(gpu_trace, 1, 6, COMM) if s.kind == "recv"][0]
    assert (send.peer, send.payload_bytes, send.bytes) == (1, sent, sent)
    assert (recv.peer, recv.payload_bytes, recv.bytes) == (0, sent, 0)  # the sender counts the transfer
    assert gpu_trace.comm_bytes() == {"all_reduce": 2 * 4 * elements, "recv": 0, "send": sent}



@pytest.mark.parametrize("group, ranks, peer", [
    (2, "[1, 3]", 3),  # a pipeline's pair group: torch records the peer's rank within it
    (4, "[0, 1, 2, 3]", 1),  # the world: group rank and global rank are one
    (2, "[1, ...]", None),  # a group whose ranks are cut short: unknown, not wrong
    (2, "[]", None),  # ... or not recorded (torch writes none for a group of uneven stride)
])
def test_nccl_peers_are_ranks_of_the_world(group, ranks, peer):
    """A send on a process group smaller than the world names its peer by the group's own numbering;
    the import reads it back through the group's ranks (here rank 1 of a world of 4 sends to rank 3)."""
    meta = {"Collective name": "send", "In msg nelems": 8, "Out msg nelems": 8, "dtype": "Float",
            "Group size": group, "Process Group Ranks": ranks, "Dst Rank": 1}
    kernel = Event("ncclDevKernel_SendRecv", "kernel", 1, 7, 0.0, 1e-5, meta)
    (send,) = comm_spans([], [kernel], rank=1, world=4)
    assert (send.kind, send.peer, send.payload_bytes) == ("send", peer, 32)

def test_gpu_fixture_clocks_of_two_hosts_are_aligned_on_a_collective(gpu_trace):
    """Rank 1's clock reads 3 ms ahead: the import moves it back, so both ranks leave the all-reduce at
    one instant."""
    clock = gpu_trace.meta["clock"]
    assert clock["method"].startswith("collective")
    assert clock["correction_s"][1] == pytest.approx(-kineto_gpu.SKEW_US * 1e-6, abs=1e-9)
    ends = [[s.end for s in spans_of(gpu_trace, r, 6, COMM) if s.kind == "all_reduce"][0] for r in (0, 1)]
    assert ends[0] == pytest.approx(ends[1], abs=1e-9)
    lag = spans_of(gpu_trace, 1, 6, STEP)[0].start - spans_of(gpu_trace, 0, 6, STEP)[0].start
    assert lag == pytest.approx(kineto_gpu.LAG_US * 1e-6, abs=1e-9)  # what really differs stays


def test_gpu_fixture_summary_overlap_and_memory(gpu_trace):
    r0 = gpu_trace.summary()["per_rank"][0]  # step 6, rank 0, in us: see kineto_gpu's docstring
    assert r0["compute_s"] == pytest.approx(642e-6)
    assert r0["overlapped_comm_s"] == pytest.approx(120e-6)  # the all-reduce beside the second weight GEMM
    assert r0["exposed_comm_s"] == pytest.approx(185e-6)  # 1650-1800 and 1525-1530, and the send
    step = 1000e-6  # each rank's own step: rank 1 runs 40 us behind rank 0, which is no step's time
    assert r0["idle_s"] == pytest.approx(step - 642e-6)
    assert r0["wait_s"] == pytest.approx(step - 642e-6 - 185e-6)
    assert gpu_trace.meta["memory_by_kind"] == [{"allocated": 3 << 20}, {"allocated": (3 << 20) + 4096}]


def test_import_json_prints_the_summary_under_run_s_keys(gpu_trace, tmp_path, capsys):
    """--json: the figures the text prints, for a script, under the keys paralab run --json gives them."""
    out = tmp_path / "t.json"
    assert cli_main(["import", str(GPU_FIXTURE), "-o", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)  # one object, nothing else on stdout
    summary = gpu_trace.summary()
    assert (got["ranks"], got["steps"], got["trace"]) == (2, 2, str(out))
    assert got["step_time_s"] == pytest.approx(summary["step_time_s"])
    assert got["comm_bytes"] == summary["comm_bytes"] and got["comm_bytes"]["all_reduce"] > 0
    assert got["per_rank"]["0"]["exposed_comm_s"] == pytest.approx(185e-6)
    assert got["memory_by_kind"] == [{"allocated": 3 << 20}, {"allocated": (3 << 20) + 4096}]
    assert got["comm_bytes_unknown"] == [] and got["warnings"] == []


def test_memory_of_some_ranks_is_drawn_under_their_own_numbers():
    """Profiling only some ranks (the last pipeline stage, say) is common: rank 1's memory is r1's."""
    trace = import_profile([GPU_FIXTURE / "rank1.json.gz"])
    assert trace.ranks == [1] and trace.meta["memory_ranks"] == [1]
    assert viz.memory(trace.meta).data[0].x == ("r1",)


def test_gpu_profile_of_a_paralab_run_takes_device_time_and_paralab_clock(tmp_path):
    """A profiled paralab run on a GPU: its ranges are the spans, timed where the GPU shows them, and
    each rank lands on paralab's own clock (rank 1 left the barrier 40 us later, its clock is 3 ms off)."""
    for rank in (0, 1):
        profile = kineto_gpu.gpu_profile(rank, paralab_ranges=True)
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(profile))
    trace = import_profile(tmp_path)
    assert trace.meta["names"] == "paralab" and trace.meta["clock"]["method"].startswith("paralab")
    assert collections.Counter(s.kind for s in trace.spans) == {"step": 4, "forward": 4}
    forward = [s for s in trace.spans if s.kind == "forward" and s.rank == 0 and s.step == 6][0]
    assert (forward.start, forward.end) == pytest.approx((1100e-6, 1315e-6))  # device time, not 1050-1295
    steps = {s.rank: s.start for s in trace.spans if s.kind == "step" and s.step == 6}
    assert steps == pytest.approx({0: 1001e-6, 1: 1041e-6})  # the recorder's clock: since the barrier


def test_every_figure_and_the_report_take_an_imported_trace(gpu_trace, tmp_path):
    timeline = viz.timeline(gpu_trace)
    assert timeline.layout.meta["rows"] == ["r0 compute", "r0 comm", "r1 compute", "r1 comm"]
    drawn = {t.name for t in timeline.data}
    assert {"forward", "backward", "optimizer", "memcpy", "all_reduce", "send", "recv"} <= drawn
    all_reduce = 4 * 4 * kineto_gpu.ALLREDUCE_ELEMENTS  # fp32, 2 ranks, 2 steps
    assert viz.comm_by_op(gpu_trace).layout.meta["bytes"]["all_reduce"] == all_reduce
    matrix = viz.comm_matrix_data(gpu_trace)
    assert matrix[0][1] == 2 * 4 * kineto_gpu.ALLREDUCE_ELEMENTS + 2 * 4 * kineto_gpu.SEND_ELEMENTS
    viz.comm_matrix(gpu_trace)
    viz.comm_link_split(gpu_trace)
    assert viz.bubble(gpu_trace).layout.meta["idle"].keys() == {"0", "1"}
    assert viz.speedup_timeline(gpu_trace).layout.meta
    assert viz.memory(gpu_trace.meta["memory_by_kind"]).layout.meta["totals"] == [3 << 20, (3 << 20) + 4096]
    viz.elastic(gpu_trace)
    # from the shell, with what a profile cannot say: the schedule, for the bubble against its theory
    imported, report = tmp_path / "imported.json", tmp_path / "report.html"
    assert cli_main(["import", str(GPU_FIXTURE), "-o", str(imported), "--schedule", "1f1b", "--pp", "2",
                     "--microbatches", "4", "--tokens-per-step", "4096"]) == 0
    assert Trace.load(imported).meta["schedule"] == "1f1b"
    assert cli_main(["report", str(imported), "-o", str(report)]) == 0
    page = report.read_text()
    for section in ("Timeline", "Pipeline bubble", "Communication by op and step", "Memory per rank",
                    "exposed comm ms/step", "tokens_per_s"):
        assert section in page


# ------------------------------------------------------------------------------------------ bad files
def _event(name="aten::mm", cat="cpu_op", **extra):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0, **extra}


BAD_FILES = {
    "missing.json": (None, "cannot read"),
    "broken.json": ('{"traceEvents": [', "not a JSON trace"),
    "list.json": ("[1, 2]", "no traceEvents"),
    "no_events.json": ('{"schemaVersion": 1}', "no traceEvents"),
    "foreign.json": (json.dumps({"traceEvents": [_event("draw", "blink")]}), "no torch.profiler operators"),
    "no_time.json": (json.dumps({"traceEvents": [_event(ts="soon")]}), "no numeric ts and dur"),
    "paralab.json": (json.dumps(Trace().to_dict()), "a paralab trace already"),
    "bad_clock.json": (json.dumps({"baseTimeNanoseconds": "abc", "traceEvents": [_event()]}),
                       "baseTimeNanoseconds is not a whole number"),
    "args_a_list.json": (json.dumps({"traceEvents": [_event(args=[1])]}), "args is not an object"),
    # a rank no world has: a report had drawn a matrix of that many rows (IndexError, or all the memory)
    "negative_rank.json": (json.dumps({"distributedInfo": {"rank": -3}, "traceEvents": [_event()]}),
                           "distributedInfo.rank -3 is not a rank (0..16,777,215)"),
    "huge_rank.json": (json.dumps({"distributedInfo": {"rank": 10**9}, "traceEvents": [_event()]}),
                       "distributedInfo.rank 1000000000 is not a rank"),
    # a rank of 1.7 had been read as rank 1; a rank "a" numbered by file order, then its world blamed
    "fraction_rank.json": (json.dumps({"distributedInfo": {"rank": 1.7}, "traceEvents": [_event()]}),
                           "distributedInfo.rank is not a whole number (1.7)"),
    "word_world.json": (json.dumps({"distributedInfo": {"rank": 0, "world_size": "a"},
                                    "traceEvents": [_event()]}),
                        'distributedInfo.world_size is not a whole number ("a")'),
    "huge_time.json": ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1%s, '
                       '"dur": 1}]}' % ("0" * 400), "no numeric ts and dur"),
    # these had raised a traceback (exit 1): RecursionError, TypeError (a list is no dict key)
    "deep.json": ('{"traceEvents": %s}' % ("[" * 100_000 + "]" * 100_000), "not a JSON trace"),
    "list_tid.json": (json.dumps({"traceEvents": [_event(tid=[1, 2])]}),
                      "pid or tid is not a number or a name"),
    "empty.json": ("", "an empty file"),  # had said: not a JSON trace (Expecting value: line 1 column 1)
    # had imported with exit 0, a step of 43 us from a run of 0.1 s
    "negative_dur.json": (json.dumps({"traceEvents": [_event(dur=-5.0)]}),
                          "has a negative duration (1 event)"),
}


def test_events_of_negative_duration_are_left_out_and_said(tmp_path, capsys):
    """A negative duration measures nothing (torch writes -1 for an event left unfinished): such an
    event is left out, and the import says how many of which file's."""
    events = [_event(), _event("aten::add", dur=-3.0, ts=20.0)]
    (tmp_path / "p.json").write_text(json.dumps({"traceEvents": events}))
    assert cli_main(["import", str(tmp_path / "p.json"), "-o", str(tmp_path / "t.json")]) == 0
    assert "events of a negative duration (left unfinished, or an edited file) left out: p.json 1" in (
        capsys.readouterr().err)
    spans = Trace.load(tmp_path / "t.json").spans
    assert spans and all(s.end >= s.start for s in spans) and not any("add" in s.name for s in spans)
    # as if it were not there: held at 0 s long it had stretched the step to its start
    (tmp_path / "without.json").write_text(json.dumps({"traceEvents": events[:1]}))
    assert spans == import_profile([tmp_path / "without.json"]).spans


def test_fields_of_another_kind_are_not_read_as_sizes_or_devices(tmp_path):
    """Other tools write record_shapes' and the memory events' fields their own way: what is not a
    shape or a device number is left out, not a crash."""
    shapes = {"Input type": ["float", "TensorList"], "Input Dims": [5, [1]]}
    memory = {"Total Allocated": 64, "Device Type": "cuda"}
    events = [_event("c10d::allreduce_", args=shapes),
              {"ph": "i", "name": "[memory]", "ts": 11.0, "args": memory}]
    (tmp_path / "p.json").write_text(json.dumps({"traceEvents": events}))
    trace = import_profile([tmp_path / "p.json"])
    assert trace.meta["memory_by_kind"] == [{"allocated during the profile": 64}] and trace.ranks == [0]


def test_cpu_memory_is_named_allocated_during_the_profile_not_a_peak(tmp_path, capsys):
    """On a CPU torch's memory events count only the allocations made since the profiler started:
    the import names the figure for that, and claims no peak of the process."""
    events = [_event(), {"ph": "i", "name": "[memory]", "ts": 11.0, "args": {"Total Allocated": 4096}}]
    (tmp_path / "p.json").write_text(json.dumps({"traceEvents": events}))
    assert cli_main(["import", str(tmp_path / "p.json"), "-o", str(tmp_path / "t.json")]) == 0
    assert "not the process's peak memory" in capsys.readouterr().out
    meta = Trace.load(tmp_path / "t.json").meta
    assert meta["memory_by_kind"] == [{"allocated during the profile": 4096}]
    assert "peak_memory_bytes" not in meta
    assert "allocations made since profiling started" in meta["memory_note"]


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_malformed_or_foreign_files_exit_2_saying_what_is_missing(tmp_path, capsys, name):
    text, reason = BAD_FILES[name]
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    assert cli_main(["import", str(path), "-o", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and reason in err
    assert not (tmp_path / "out.json").exists()


def test_gzip_and_duplicate_ranks(tmp_path, capsys):
    rank0 = tmp_path / "a.json.gz"
    rank0.write_bytes(gzip.compress((GPU_FIXTURE / "rank0.json").read_bytes()))
    assert import_profile([rank0, GPU_FIXTURE / "rank1.json.gz"]).ranks == [0, 1]
    twice = [str(rank0), str(GPU_FIXTURE / "rank0.json")]
    assert cli_main(["import", *twice, "-o", str(tmp_path / "o.json")]) == 2
    assert "rank 0 again" in capsys.readouterr().err
    assert cli_main(["import", str(rank0), str(rank0), "-o", str(tmp_path / "o.json")]) == 2
    assert "given twice" in capsys.readouterr().err  # read twice it had made two ranks of one
    with pytest.raises(ProfileError, match="no paralab ranges"):
        import_profile(GPU_FIXTURE, names="paralab")


def test_an_output_that_is_one_of_the_profiles_is_refused_before_reading(tmp_path, capsys):
    """-o naming a profile had overwritten the user's profile with the trace (exit 0): given by name,
    as a profile of a directory given, or by a hard link's other name."""
    files = [_gloo_rank(tmp_path / f"rank{r}.json", rank=r) for r in (0, 1)]
    before = Path(files[0]).read_bytes()
    hard_link = tmp_path / "elsewhere" / "same.json"
    hard_link.parent.mkdir()
    os.link(files[0], hard_link)
    for inputs, output in ((files, files[0]), ([str(tmp_path)], files[0]), (files, str(hard_link))):
        assert cli_main(["import", *inputs, "-o", output]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"paralab import: -o {output} is one of the ")
        assert Path(files[0]).read_bytes() == before


def test_a_directory_leaves_out_paralab_traces_written_into_it(tmp_path, capsys):
    """paralab import prof/ -o prof/trace.json had worked once, then failed on every later run: "prof/
    trace.json: a paralab trace already". A paralab trace in a directory given is left out, with a
    warning; one given by name is still refused."""
    for r in (0, 1):
        _gloo_rank(tmp_path / f"rank{r}.json", rank=r)
    out = tmp_path / "trace.json"
    assert cli_main(["import", str(tmp_path), "-o", str(out)]) == 0
    capsys.readouterr()
    assert cli_main(["import", str(tmp_path), "-o", str(out)]) == 0  # the first run's trace is in it now
    err = capsys.readouterr().err
    assert err == f"paralab import: warning: {out}: a paralab trace, not a torch.profiler one: left out\n"
    assert Trace.load(out).meta["files"] == [str(tmp_path / f"rank{r}.json") for r in (0, 1)]
    assert cli_main(["import", str(out), "-o", str(tmp_path / "again.json")]) == 2
    assert "a paralab trace already" in capsys.readouterr().err


def test_the_output_error_is_the_import_s_own(tmp_path, capsys):
    assert cli_main(["import", str(GPU_FIXTURE), "-o", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"paralab import: output {tmp_path} is a directory")


def test_files_that_do_not_say_their_rank_are_ranks_in_natural_order_and_said_so(tmp_path):
    """Profiles taken before init_process_group carry no distributedInfo: their ranks are the files'
    order, silently, and a directory's files were sorted as text (rank10 before rank2)."""
    for n in (10, 2):
        _gloo_rank(tmp_path / f"rank{n}.json", rank=None)
    with pytest.warns(ProfileWarning, match="numbered as ranks by their order"):
        trace = import_profile(tmp_path)
    assert trace.meta["files"] == [str(tmp_path / "rank2.json"), str(tmp_path / "rank10.json")]
    (said,) = trace.meta["warnings"]
    assert said == (f"no file says its rank (no distributedInfo: profiled before init_process_group?), so "
                    f"the files were numbered as ranks by their order: {tmp_path / 'rank2.json'} is rank 0, "
                    f"{tmp_path / 'rank10.json'} rank 1")


def test_cycles_of_a_repeating_schedule_are_not_called_ranks(tmp_path):
    """One process profiled under schedule(repeat=2) writes a file per cycle: without distributedInfo
    they had been refused as "rank 0 recorded steps 2, 3, 4; rank 1 recorded steps 7, 8, 9", as if
    two ranks of two jobs."""
    files = [_gloo_rank(tmp_path / f"trace_{i}.json", rank=None, steps=steps)
             for i, steps in enumerate(((2, 3, 4), (7, 8, 9)))]
    with pytest.raises(ProfileError, match=r"steps 7, 8, 9: no step common .* numbered as ranks by their "
                                           r"order.* a profiler schedule that repeats \(repeat="):
        import_profile(files)


def test_bytes_are_said_in_units_that_fit_them():
    """Every op's bytes had been MiB to three decimals: 0.000 MiB for the real, small traffic of a
    gather."""
    from paralab.trace_import import _comm_lines

    (line,) = _comm_lines({"comm_payload_bytes": {"gather": 1400}, "comm_bytes": {"gather": 700}}, set())
    assert line == "gather: 1.4 KiB of tensors per step (all ranks), 700 B on the wire"


def test_the_mesh_of_an_imported_trace_says_it_has_no_layout(gpu_trace):
    with pytest.raises(TypeError, match="carries no layout .an imported profile has none"):
        viz.mesh(gpu_trace)


# ------------------------------------------------------------------------------------------ one job
def _gloo_rank(path: Path, rank: int | None = None, world: int | None = 2, steps=(1, 2), host: str = "vm",
               shift_us: float = 0.0, shapes: bool = True, **top) -> str:
    """A small CPU profile of one gloo rank: per step (10 ms apart) an all-reduce of 256 floats."""
    call = {"Input type": ["TensorList"], "Input Dims": [[[256]]]} if shapes else {}
    run = {"Input type": ["float"], "Input Dims": [[256]]} if shapes else {}
    events = []
    for n in steps:
        t = 10_000.0 * n + shift_us
        events += [_event(f"ProfilerStep#{n}", "user_annotation", ts=t, dur=5000.0),
                   _event("aten::mm", ts=t + 10, dur=80.0),
                   _event("c10d::allreduce_", ts=t + 100, dur=50.0, args=call),
                   _event("gloo:all_reduce", tid=2, ts=t + 120, dur=300.0, args=run)]
    data = {"traceEvents": events, "host_name": host, **top, **({"record_shapes": 1} if shapes else {})}
    if rank is not None:
        data["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": world}
    path.write_text(json.dumps(data))
    return str(path)


NOT_ONE_JOB = {  # rank 0 as _gloo_rank makes it, against this rank 1, and the conflict named
    "world sizes": (dict(rank=1, world=4), "is from a world of 2 ranks, "),
    "rank beyond its world": (dict(rank=3), "rank 3, yet its distributedInfo.world_size is 2"),
    "no distributedInfo beside one": (dict(), "no distributedInfo.rank, while "),
    "no step in common": (dict(rank=1, steps=(7, 8)),
                          "rank 0 recorded steps 1, 2; rank 1 recorded steps 7, 8: no step common"),
    # rank 1 of another run, an hour later on the same machine
    "clock far beyond skew": (dict(rank=1, shift_us=3.6e9), "on one host (vm), yet their first collective"),
    # rank 1 of another job running at the same time: its all-reduces 3 ms after rank 0's, none beside them
    "a job beside it": (dict(rank=1, shift_us=3000.0),
                        "rank 0's all_reduce in step 1 overlaps none of rank 1's"),
}


@pytest.mark.parametrize("case", sorted(NOT_ONE_JOB))
def test_files_of_different_jobs_are_refused_naming_the_conflict(tmp_path, capsys, case):
    """Files that cannot be one recording of one job had been imported side by side (numbered by their
    order, aligned on collectives of different runs)."""
    other, reason = NOT_ONE_JOB[case]
    files = [_gloo_rank(tmp_path / "a.json", rank=0), _gloo_rank(tmp_path / "b.json", **other)]
    assert cli_main(["import", *files, "-o", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and reason in err and not (tmp_path / "out.json").exists()


def test_host_calls_that_only_queue_their_collectives_need_not_overlap(tmp_path):
    """A profile with no record of execution (no gloo range, no NCCL kernel: an NCCL job profiled
    without CUDA activities) is read from its host calls, which only queue the work: one job's ranks
    call 2 ms apart, and the check that executions meet had refused it as two jobs."""
    files = []
    for rank in (0, 1):
        path = Path(_gloo_rank(tmp_path / f"r{rank}.json", rank=rank, steps=(1, 2, 3)))
        data = json.loads(path.read_text())
        data["traceEvents"] = [
            {**e, "ts": e["ts"] + 2000.0 * rank, "dur": 50.0} if e["name"] == "c10d::allreduce_" else e
            for e in data["traceEvents"] if e["name"] != "gloo:all_reduce"]
        path.write_text(json.dumps(data))
        files.append(str(path))
    assert import_profile(files).select(kind="all_reduce")


def test_one_job_across_hosts_and_a_rank_cut_short_are_imported(tmp_path, capsys):
    """What may still be one job is imported: clocks of two hosts 3 s apart (aligned on the
    collective), a rank whose profile lacks a step the other has (a warning, on stderr and in meta)."""
    files = [_gloo_rank(tmp_path / "a.json", rank=0, steps=(1, 2, 3), host="node0"),
             _gloo_rank(tmp_path / "b.json", rank=1, host="node1", shift_us=3e6)]
    assert cli_main(["import", *files, "-o", str(tmp_path / "out.json")]) == 0
    err = capsys.readouterr().err
    assert "paralab import: warning: rank 0 recorded steps 1, 2, 3; rank 1 recorded steps 1, 2" in err
    assert err.count("warning") == 1  # once, though import_profile also warns
    trace = Trace.load(tmp_path / "out.json")
    assert trace.meta["clock"]["correction_s"] == pytest.approx([0.0, -3.0])
    assert "rank 1 recorded steps 1, 2" in trace.meta["warnings"][0]


def test_ranks_of_one_host_keep_its_clock_and_hosts_move_by_their_ranks_median(tmp_path):
    """Ranks leave a collective together only to within scheduling (tens of ms on a loaded 2-core box):
    one rank's late exit had moved its whole timeline, its optimizer drawn before its own last
    all-reduce ended. Ranks of one host now keep its clock; a host is moved by its ranks' median."""
    one_host = [_gloo_rank(tmp_path / "a.json", rank=0),
                _gloo_rank(tmp_path / "b.json", rank=1, shift_us=200)]
    trace = import_profile(one_host)
    assert trace.meta["clock"]["method"].startswith("clock") and trace.meta["clock"]["correction_s"] == [0, 0]
    ends = [next(s.end for s in trace.select(rank=r, kind="all_reduce")) for r in (0, 1)]
    assert ends[1] - ends[0] == pytest.approx(200e-6, abs=1e-9)  # the late exit stays late
    # node1 (ranks 1-3) reads a clock 3 s ahead, and its rank 3 leaves 900 us after ranks 1 and 2: the
    # median moves node1 by 3 s, where a mean would move it by 3.0003 s and one rank by 3.0009 s
    shifts = {1: 3e6, 2: 3e6, 3: 3e6 + 900}
    hosts = [_world_of_four_rank(tmp_path / f"h{r}.json", r, "node1" if r else "node0", shifts.get(r, 0.0))
             for r in range(4)]
    correction = import_profile(hosts).meta["clock"]["correction_s"]
    assert correction == pytest.approx([0.0, -3.0, -3.0, -3.0], abs=1e-9)


def test_gloo_collectives_of_a_job_with_no_smaller_group_are_over_all_its_ranks(tmp_path):
    """gloo's ranges do not say their group, and distributedInfo lists the job's groups: when none is
    smaller than the world, every collective is over all ranks. Only a world of two had been read so:
    four ranks on two hosts 5 s apart were left unaligned, their bytes across nodes 0 and their waits
    unsplit."""
    files = []
    for r in range(4):
        path = Path(_gloo_rank(tmp_path / f"r{r}.json", rank=r, world=4, host=f"node{r // 2}",
                               shift_us=5e6 if r >= 2 else 0.0))
        data = json.loads(path.read_text())
        data["distributedInfo"]["pg_config"] = [{"pg_name": "0", "ranks": [0, 1, 2, 3]}]
        path.write_text(json.dumps(data))
        files.append(path)
    trace = import_profile(files)
    assert {s.group_size for s in trace.select(lane=COMM)} == {4}
    assert trace.meta["clock"]["correction_s"] == pytest.approx([0.0, 0.0, -5.0, -5.0], abs=1e-9)
    assert trace.summary()["comm_bytes_by_link"]["inter_node"] > 0


def _world_of_four_rank(path: Path, rank: int, host: str, shift_us: float) -> str:
    """_gloo_rank in a world of 4, its all-reduces named over all of it by record_param_comms (gloo's
    own ranges do not say their group)."""
    data = json.loads(Path(_gloo_rank(path, rank=rank, world=4, host=host, shift_us=shift_us)).read_text())
    events = [e for e in data["traceEvents"] if e["name"] != "gloo:all_reduce"]
    data["traceEvents"] = events + [
        _event("record_param_comms", ts=e["ts"] + 1, dur=e["dur"] - 2,
               args={"Collective name": "allreduce", "Group size": 4, "In msg nelems": 256, "dtype": "Float"})
        for e in events if e["name"] == "c10d::allreduce_"]
    path.write_text(json.dumps(data))
    return str(path)


def _no_comm_rank(path: Path, shift_us: float) -> str:
    """A profile of a process with no process group and no collective: steps of one matmul."""
    events = [e for n in (1, 2) for e in (_event(f"ProfilerStep#{n}", "user_annotation",
                                                 ts=10_000.0 * n + shift_us, dur=5000.0),
                                          _event("aten::mm", ts=10_000.0 * n + shift_us + 10, dur=80.0))]
    path.write_text(json.dumps({"traceEvents": events, "host_name": "vm"}))
    return str(path)


def test_files_without_a_collective_are_one_job_only_if_they_ran_together(tmp_path):
    """Two single-process profiles taken seconds apart on one machine had been imported as one job of
    two ranks, its steps seconds long: with no collective to align on, ranks of one job still run
    their steps together."""
    together = [_no_comm_rank(tmp_path / "a.json", 0.0), _no_comm_rank(tmp_path / "b.json", 300.0)]
    assert import_profile(together).median_step_time() == pytest.approx(5e-3)
    apart = [_no_comm_rank(tmp_path / "c.json", 0.0), _no_comm_rank(tmp_path / "d.json", 4e6)]
    with pytest.raises(ProfileError, match=r"\(vm\), yet their first common steps lie 3.99 s apart"):
        import_profile(apart)


def test_ranks_with_no_collective_are_one_run_only_if_their_steps_meet(tmp_path):
    """A pipeline's last stage can start a step seconds after the first (a long step's backwards run
    one stage after another), yet the stages of one run exchange each step's microbatches within it,
    so their steps meet. Rank 0 of one run and rank 1 of another, 12.5 s later, had been merged (their
    sends paired across the runs): with no collective to align on, only ranks that had no
    communication at all were held to stepping together."""
    stages = [_pipeline_rank(tmp_path / "p0.json", 0, 2, step_us=3e6),
              _pipeline_rank(tmp_path / "p1.json", 1, 2, 1.5e6, step_us=3e6)]
    assert import_profile(stages).ranks == [0, 1]
    runs = [_pipeline_rank(tmp_path / "q0.json", 0, 2), _pipeline_rank(tmp_path / "q1.json", 1, 2, 12.5e6)]
    with pytest.raises(ProfileError, match=r"\(vm\), yet their first common steps lie 12.5 s apart"):
        import_profile(runs)


def test_what_a_profile_cannot_say_per_step_or_per_group_is_said(tmp_path):
    """Figures that had imported without a word: a profile without ProfilerStep ranges (a plain
    ``with profile()``), read as one step; a rank with no operators; gloo collectives in a job with
    process groups smaller than the world, taken as over all ranks."""
    stepless = tmp_path / "stepless.json"
    stepless.write_text(json.dumps({"traceEvents": [_event(), _event(ts=30.0)]}))
    with pytest.warns(ProfileWarning, match="no ProfilerStep ranges"):  # a notebook hears it too
        (said,) = import_profile([stepless]).meta["warnings"]
    assert said.startswith(f"{stepless}: no ProfilerStep ranges") and "the whole profile's" in said
    empty = tmp_path / "empty.json"  # a schedule's last cycle: its steps, nothing in them
    steps = [_event(f"ProfilerStep#{n}", "user_annotation", ts=10_000.0 * n, dur=5000.0) for n in (1, 2)]
    empty.write_text(json.dumps({"traceEvents": steps, "distributedInfo": {"rank": 1, "world_size": 2}}))
    with pytest.warns(ProfileWarning, match=r"rank 1 recorded no operators"):
        import_profile([_gloo_rank(tmp_path / "r0.json", 0), empty])
    # every rank empty: nothing to import (it had imported, exit 0, with a median step of 0.0 ms)
    with pytest.raises(ProfileError, match=r"empty.json: no rank recorded an operator or a collective"):
        import_profile([empty])
    files = [_world_of_four_rank(tmp_path / f"g{r}.json", r, "vm", 0.0) for r in range(4)]
    for r, path in enumerate(files):
        data = json.loads(Path(path).read_text())
        data["traceEvents"] = [e for e in data["traceEvents"] if e["name"] != "record_param_comms"]
        data["distributedInfo"]["pg_config"] = [{"pg_name": "0", "ranks": [0, 1, 2, 3]},
                                                {"pg_name": "1", "ranks": [r - r % 2, r - r % 2 + 1]}]
        Path(path).write_text(json.dumps(data))
    said, unsized = import_profile(files).meta["warnings"]
    assert said.startswith("the job made process groups smaller than the world ([0, 1], [2, 3])")
    # with neither gloo's ranges nor record_param_comms, the calls' tensor lists give no dtype
    assert unsized.endswith("(0 in the trace): " + "; ".join(f"rank {r}'s all_reduce" for r in range(4)))


def test_a_job_with_a_group_of_one_rank_is_not_read_as_every_collective_over_both(tmp_path):
    """dist.new_group([r]) in a world of two: a collective on it puts nothing on the wire. distributedInfo
    lists the group, but only groups of two or more had been kept, and in a world of two every
    collective had been taken as over both ranks (an all-reduce of 2000 floats: 8000 B on the wire,
    said as fact). Which group gloo's collectives ran on is not in the profile: now said so."""
    files = []
    for r in (0, 1):
        path = Path(_gloo_rank(tmp_path / f"r{r}.json", rank=r))
        data = json.loads(path.read_text())
        data["distributedInfo"]["pg_config"] = [{"pg_name": "0", "ranks": [0, 1]},
                                                {"pg_name": str(r + 1), "ranks": [r]}]
        path.write_text(json.dumps(data))
        files.append(path)
    trace = import_profile(files)
    assert {s.group_size for s in trace.select(lane=COMM)} == {0}  # unknown, not 2
    (said,) = trace.meta["warnings"]
    assert said.startswith("the job made process groups smaller than the world ([0], [1])")


def test_ranks_that_start_at_different_steps_align_on_a_step_they_share(tmp_path):
    """Rank 1's profile starts a step later (schedule(wait=rank)): each rank's own first collective had
    been taken as one instant, a step (10 ms here, 3.6 s on a real job) out of line."""
    files = [_gloo_rank(tmp_path / "a.json", rank=0, steps=(1, 2, 3)),
             _gloo_rank(tmp_path / "b.json", rank=1, steps=(2, 3))]
    trace = import_profile(files)
    assert trace.meta["clock"]["correction_s"] == pytest.approx([0.0, 0.0], abs=1e-9)


def test_what_a_job_may_state_alike_or_leave_out_is_no_conflict(tmp_path):
    """A job-wide trace_id (profile(custom_trace_id_callback=...)) had been refused as one recording
    given twice; files that name no host had been taken for one host, their clocks 3 s apart refused."""
    shared = [_gloo_rank(tmp_path / f"t{r}.json", rank=r, trace_id="job-42") for r in (0, 1)]
    assert import_profile(shared).ranks == [0, 1]
    unnamed = [_gloo_rank(tmp_path / "u0.json", rank=0, host=""),
               _gloo_rank(tmp_path / "u1.json", rank=1, host="", shift_us=3e6)]
    assert import_profile(unnamed).meta["clock"]["correction_s"] == pytest.approx([0.0, -3.0])


def test_a_rank_that_shares_no_step_with_the_others_is_refused_whichever_it_is(tmp_path):
    """Steps {1, 2}, {2} and {7, 8}: only rank 0 against the first rank that differed had been checked,
    so rank 2 came in with a warning naming rank 1."""
    files = [_gloo_rank(tmp_path / f"r{r}.json", rank=r, world=3, steps=steps)
             for r, steps in enumerate(((1, 2), (2,), (7, 8)))]
    with pytest.raises(ProfileError, match="rank 2 recorded steps 7, 8: no step common to every rank"):
        import_profile(files)


def test_a_profile_without_record_shapes_says_its_bytes_are_unknown(tmp_path, capsys):
    """Without record_shapes gloo's calls carry no sizes: every byte count had been a silent 0."""
    files = [_gloo_rank(tmp_path / f"r{r}.json", rank=r, shapes=False) for r in (0, 1)]
    assert cli_main(["import", *files, "-o", str(tmp_path / "out.json")]) == 0
    out, err = capsys.readouterr()
    assert "warning: ranks 0, 1 were profiled without record_shapes=True" in err
    assert "all_reduce: bytes unknown (no size recorded: see the warning)" in out and "MiB" not in out
    meta = Trace.load(tmp_path / "out.json").meta
    assert meta["bytes_unknown_ranks"] == [0, 1] and meta["bytes_unknown_ops"] == ["all_reduce"]
    with_shapes = [_gloo_rank(tmp_path / f"s{r}.json", rank=r) for r in (0, 1)]
    trace = import_profile(with_shapes)
    assert "warnings" not in trace.meta
    assert trace.comm_bytes(payload=True) == {"all_reduce": 2 * 1024}  # per step: 1 KiB from each rank


def test_a_size_recorded_without_its_dtype_is_said_to_leave_its_bytes_unknown(tmp_path):
    """A scatter's receiving rank records its output as a tensor list, which has no dtype, and gloo's
    range of it carries no arguments: its bytes had read 0 without a word, shapes recorded."""
    files = [_gloo_rank(tmp_path / f"r{r}.json", rank=r) for r in (0, 1)]
    data = json.loads(Path(files[1]).read_text())
    for event in data["traceEvents"]:
        if event["name"] == "gloo:all_reduce":
            event["args"] = {}
    Path(files[1]).write_text(json.dumps(data))
    trace = import_profile(files)
    assert trace.meta["bytes_unknown_ranks"] == [1] and trace.meta["bytes_unknown_ops"] == ["all_reduce"]
    (said,) = trace.meta["warnings"]
    assert said == ("recorded shapes without a dtype (a tensor list's, as a scatter's receiving ranks "
                    "record) leave some bytes unknown (0 in the trace): rank 1's all_reduce")


def test_only_the_ops_left_unsized_are_said_to_leave_ranks_out():
    """A rank without record_shapes leaves its gloo calls unsized, not an op NCCL sized from its own
    metadata: every op's line had said its ranks were not counted."""
    from paralab.trace_import import _comm_lines

    summary = {"comm_payload_bytes": {"all_reduce": 2**20, "send": 2**20, "recv": 0},
               "comm_bytes": {"all_reduce": 2**20, "send": 2**20}}
    all_reduce, send, recv = _comm_lines(summary, {"send", "recv"})
    assert "not counted" not in all_reduce
    assert send.endswith("(ranks that recorded no size of it not counted)")
    assert recv == "recv: bytes unknown (no size recorded: see the warning)"


def test_paralab_clock_is_the_least_delayed_range():
    """A range opens after the recorder read its clock, by a delay that varies (here 5 us, 2 ms,
    40 us): the offset is the smallest start - clock, and each span starts at its clock, where
    paralab's own trace starts it (the range opened 2 ms late had made that span 2 ms short)."""
    opened = [(0.010, 5e-6), (0.020, 2e-3), (0.030, 40e-6)]  # (clock, delay)
    host = [Event(f"paralab step:step step={i} clock={clock:.6f}", "user_annotation", 1, 1,
                  100.0 + clock + delay, 100.0 + clock + delay + 5e-3, {})
            for i, (clock, delay) in enumerate(opened)]
    profile = RankProfile(Path("r0.json"), 0, 1, "h", 0, {}, host_events=host)
    spans, offset = paralab_spans(profile, 0)
    assert offset == pytest.approx(100.0 + 5e-6)
    assert [s.start - offset for s in spans] == pytest.approx([0.010, 0.020, 0.030])
    assert [s.end - s.start for s in spans] == pytest.approx([5e-3, 5e-3 + 2e-3 - 5e-6, 5e-3 + 35e-6])


# ------------------------------------------------------------------------------------------ real runs
def _no_processes_running(path_part: str) -> bool:
    for proc in psutil.Process().children(recursive=True):
        try:
            if path_part in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            continue
    return True


@pytest.fixture(scope="module")
def ddp_profiles(tmp_path_factory) -> Path:
    """torch DDP on 2 gloo ranks under torchrun, profiling itself (tests/ddp_profiled_job.py)."""
    out = tmp_path_factory.mktemp("ddp_profiles")
    run_torchrun(DDP_JOB, out, nproc=2, timeout_s=240)
    assert _no_processes_running(str(DDP_JOB))
    return out


@pytest.mark.timeout(300)
def test_torch_ddp_profile_every_rank_step_and_all_reduce(ddp_profiles, tmp_path, capsys):
    import ddp_profiled_job as job

    out = tmp_path / "trace.json"
    assert cli_main(["import", str(ddp_profiles / "rank0.json.gz"), str(ddp_profiles / "rank1.json.gz"),
                     "-o", str(out)]) == 0
    assert "imported 2 ranks, 3 steps" in capsys.readouterr().out
    trace = Trace.load(out)
    assert trace.ranks == [0, 1] and list(trace.step_windows()) == [2, 3, 4]  # ProfilerStep#2..4 recorded
    param_bytes = 4 * sum(p.numel() for p in job.model().parameters())
    for rank in (0, 1):
        for step in (2, 3, 4):
            spans = spans_of(trace, rank, step)
            all_reduce = [s for s in spans if s.kind == "all_reduce"]
            assert len(all_reduce) >= 2  # a 0.05 MB bucket cap: the gradients go in several buckets
            # every gradient once per step; two ranks: the wire carries 2 (n-1)/n = 1 x the payload
            assert sum(s.payload_bytes for s in all_reduce) == param_bytes
            assert sum(s.bytes for s in all_reduce) == param_bytes
            kinds = collections.Counter(s.kind for s in spans if s.lane == COMPUTE)
            assert kinds["forward"] >= 1 and kinds["backward"] >= 1 and kinds["optimizer"] >= 1
            forward = min(s.start for s in spans if s.kind == "forward")
            backward = min(s.start for s in spans if s.kind == "backward")
            assert forward < backward < min(s.start for s in all_reduce)  # DDP reduces during backward
    assert trace.comm_bytes(payload=True)["all_reduce"] == 2 * param_bytes  # per step, both ranks
    assert trace.meta["clock"]["method"].startswith("clock")  # one host: its clock stands
    assert trace.meta["clock"]["correction_s"] == [0.0, 0.0]
    assert len(trace.meta["memory_by_kind"]) == 2


@pytest.mark.timeout(300)
def test_profile_of_a_paralab_pipeline_agrees_with_its_own_trace(tmp_path, no_leftover_ranks):
    """paralab run --profile: the profile carries paralab's spans, and importing it gives paralab's own
    trace back: the same spans by kind, the same bytes, on the same clock."""
    profile_dir, own_path = tmp_path / "profile", tmp_path / "own.json"
    assert cli_main(["run", "--strategy", "pp", "--world-size", "2", "--pp", "2", "--schedule", "1f1b",
                     "--microbatches", "4", "--steps", "3", "--profile", str(profile_dir),
                     "--trace", str(own_path), "--json"]) == 0
    own = Trace.load(own_path)
    imported = import_profile(sorted(profile_dir.glob("rank*.json")))
    assert imported.meta["names"] == "paralab" and imported.meta["schedule"] == "1f1b"

    def key(s: Span):
        return s.rank, s.lane, s.kind, s.name, s.step, s.microbatch, s.stage, s.peer, s.bytes, s.payload_bytes

    assert collections.Counter(map(key, imported.spans)) == collections.Counter(map(key, own.spans))
    assert imported.comm_bytes() == own.comm_bytes()
    assert imported.comm_bytes(payload=True) == own.comm_bytes(payload=True)

    def in_order(trace: Trace) -> list[Span]:
        return sorted(trace.spans, key=lambda s: (key(s), s.start))

    late = [b.start - a.start for a, b in zip(in_order(own), in_order(imported))]
    assert statistics.median(map(abs, late)) < 1e-3  # paralab's own clock, both
    # every range opens after its clock read, and the import's clock is the least delayed of them: no
    # span is imported before paralab's own (to the label's microsecond), and one is at it
    assert min(late) == pytest.approx(0.0, abs=2e-6)
    # and the waits: a receive waited for from its wait(), a send from its reaping, both marked by a range
    waits = [(a.waited_s, b.waited_s) for a, b in zip(in_order(own), in_order(imported)) if a.lane == "comm"]
    # receives that waited for their sender, so the comparison below has waits to compare (how many
    # waited is the machine's timing: a quarter of them had been asked, and 12 of 48 failed it once)
    assert any(a > 1e-4 for a, _ in waits)
    assert statistics.median(abs(a - b) for a, b in waits) < 1e-4
    assert sum(b for _, b in waits) == pytest.approx(sum(a for a, _ in waits), rel=0.1)
    # the same profile read as any torch profile: gloo's sends and receives, with their bytes
    as_torch = import_profile(profile_dir, names="torch")
    steps = len(own.step_windows())
    for op in ("send", "recv"):
        moved = sum(s.payload_bytes for s in as_torch.spans if s.kind == op)
        assert moved == own.comm_bytes(payload=True)[op] * steps
        assert {s.peer for s in as_torch.spans if s.kind == op} == {0, 1}


@pytest.mark.timeout(300)
def test_a_tensor_parallel_profile_keeps_its_blocking_calls_out_of_compute(tmp_path, no_leftover_ranks):
    """Every f and g of a tp run blocks its layer: imported from the profile, each is all issue, as in
    paralab's own trace, so the import reads them exposed too (its marks had sat inside the call's
    range, and the import had read a tail of each call as free to compute)."""
    run = paralab.run("tp", 2, steps=3, global_batch=8, profile_dir=str(tmp_path),
                      model=dict(layers=2, hidden=32, heads=4, vocab=64, seq_len=16))
    imported = import_profile(sorted(tmp_path.glob("rank*.json")))
    calls = imported.select(lane=COMM)
    # all of each call (to the nanosecond: shifting a span onto paralab's clock rounds its ends anew)
    assert calls and all(s.issue_s == pytest.approx(s.duration, abs=1e-9) and s.waited_s == 0 for s in calls)
    for rank, b in imported.time_breakdown().items():
        assert b["overlapped_comm_s"] == pytest.approx(0, abs=1e-9), (rank, b)
        assert b["exposed_comm_s"] == pytest.approx(b["comm_s"])
    assert all(s.issue_s == s.duration for s in run.trace.select(lane=COMM))


@pytest.mark.parametrize("facts, message", [
    (["--pp", "-2"], "--pp must be >= 1, got -2"),
    (["--microbatches", "0"], "--microbatches must be >= 1, got 0"),  # had been dropped silently
    (["--tokens-per-step", "-5"], "--tokens-per-step must be >= 1, got -5"),  # had made tokens/s negative
    # facts the profiles or the schedule contradict had been written into the trace
    (["--pp", "3"], "pp 3 does not divide the 2 ranks of these profiles"),
    (["--schedule", "dualpipev", "--pp", "2", "--microbatches", "1"], "dualpipev needs at least as many"),
    (["--schedule", "interleaved", "--pp", "2", "--microbatches", "5"],
     "in max(1, m // stages) = 2 equal rounds"),
])
def test_facts_a_profile_cannot_give_are_checked(capsys, tmp_path, facts, message):
    assert cli_main(["import", str(GPU_FIXTURE), "-o", str(tmp_path / "out.json"), *facts]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("meta, message", [
    ({"tokens_per_step": -5}, "tokens_per_step must be >= 1, got -5"),  # had read as -6,860 tokens/s
    ({"tokens_per_step": float("nan")}, "tokens_per_step must be a whole number, got nan"),
    ({"pp": 0}, "pp must be >= 1, got 0"),
    ({"pp": "2"}, "pp must be a whole number, got '2'"),  # had been a TypeError
    ({"schedule": "bogus", "pp": 1}, "schedule must be one of naive, gpipe, 1f1b"),
    ({"clock": 1}, "unknown fact(s) clock: an import takes schedule, pp, microbatches, tokens_per_step"),
    ("pp", "the facts (meta) must be a dict of schedule, pp"),  # had been an AttributeError
    ({"schedule": "dualpipev", "pp": 2, "microbatches": 1}, "dualpipev needs at least as many"),
])
def test_facts_given_from_python_are_checked_as_the_flags_are(tmp_path, meta, message):
    """import_profile's meta had reached the trace unchecked, where paralab import's flags were checked."""
    with pytest.raises(paralab.ConfigError) as info:
        import_profile(str(tmp_path / "never-read.json"), meta=meta)  # refused before any file is read
    assert message in str(info.value)


@pytest.mark.parametrize("paths", [None, 3, [None], {"rank0": "a.json"}])
def test_paths_that_name_no_file_are_refused_from_python(paths):
    """None or a number had raised TypeError from inside pathlib; a dict had been read key by key."""
    with pytest.raises(paralab.ConfigError, match="paths must be a profile's file, a directory of them or a "
                                                  "list of these, got"):
        import_profile(paths)


def test_a_world_size_beyond_any_cluster_is_refused_and_a_large_one_counted(tmp_path):
    """A profile saying a world of 10**9 ranks had filled the machine's memory with their numbers (24 GB
    in seconds); one of 2**24, the largest a trace holds, is counted without listing them."""
    with pytest.raises(ProfileError, match=r"distributedInfo.world_size 1000000000 is not a world size "
                                           r"\(1..16,777,216\)"):
        import_profile(_gloo_rank(tmp_path / "huge.json", rank=0, world=10**9))
    with pytest.warns(ProfileWarning, match=r"the files hold 1 of the 16777216 ranks of their world \(none "
                                            r"for ranks 1, 2, .*, 8 and 16777207 more\)"):
        import_profile(_gloo_rank(tmp_path / "large.json", rank=0, world=2**24))


def test_an_unknown_schedule_is_refused_naming_the_schedules(capsys, tmp_path):
    with pytest.raises(SystemExit) as info:
        cli_main(["import", str(GPU_FIXTURE), "-o", str(tmp_path / "out.json"), "--schedule", "nope"])
    assert info.value.code == 2 and not (tmp_path / "out.json").exists()
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and "'1f1b'" in err


def test_a_world_imported_in_part_says_which_ranks_are_missing(tmp_path, capsys):
    """One file of a world of two had been imported in silence: a one-rank trace, read as a whole job."""
    only = _gloo_rank(tmp_path / "r0.json", rank=0)
    assert cli_main(["import", only, "-o", str(tmp_path / "out.json")]) == 0
    assert "the files hold 1 of the 2 ranks of their world (none for rank 1)" in capsys.readouterr().err
    both = [only, _gloo_rank(tmp_path / "r1.json", rank=1)]
    assert "warnings" not in import_profile(both).meta


def _pipeline_rank(path: Path, rank: int, microbatches: int, shift_us: float = 0.0,
                   step_us: float = 5000.0) -> str:
    """A pipeline of two gloo ranks, one stage each: per step (``step_us`` long, as long again apart)
    each microbatch's activation sent from rank 0 and its gradient sent back from rank 1 (64 floats),
    as torch's GPipe and 1F1B send them."""
    call = {"Input type": ["TensorList"], "Input Dims": [[[64]]]}
    gloo = {"Input type": ["float"], "Input Dims": [[64]]}
    events = []
    for n in (1, 2):
        t = 2 * step_us * n + shift_us
        events += [_event(f"ProfilerStep#{n}", "user_annotation", ts=t, dur=step_us),
                   _event("aten::mm", ts=t + 10, dur=80.0)]
        events += [e for k in range(microbatches) for e in (
            _event("c10d::send", ts=t + 100 + 200 * k, dur=20.0, args=call),
            _event("gloo:send", ts=t + 101 + 200 * k, dur=18.0, args=gloo))]  # its size as torch records it
    data = {"traceEvents": events, "host_name": "vm", "record_shapes": 1,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}}
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("facts, says", [
    (dict(schedule="1f1b", pp=2, microbatches=4), None),
    (dict(schedule="gpipe", pp=2, microbatches=4), None),  # same messages, another order
    (dict(schedule="1f1b", pp=2, microbatches=1), "1f1b over pp 2 with 1 microbatch sends 1 message a "
                                                  "step from rank 0; the profile records 4"),
    (dict(schedule="zbv", pp=2, microbatches=4), "zbv over pp 2 with 4 microbatches sends 8"),
])
def test_pipeline_facts_given_are_checked_against_the_sends_the_profile_records(tmp_path, facts, says):
    """The bubble figure reads the schedule, pp and microbatches given: a wrong one had been taken as
    given, a DDP profile drawn as a GPipe pipeline."""
    files = [_pipeline_rank(tmp_path / f"r{r}.json", r, microbatches=4) for r in (0, 1)]
    warnings = import_profile(files, meta=facts).meta.get("warnings", [])
    if says is None:
        assert not warnings
    else:
        assert len(warnings) == 1 and says in warnings[0], warnings


def test_the_import_line_says_which_steps_its_median_is_of(tmp_path, capsys):
    """torch.profiler's schedule records after steps of its own (here 1 and 2): both are the job's
    training steps, and the median is of both."""
    files = [_gloo_rank(tmp_path / f"r{r}.json", r) for r in (0, 1)]
    assert cli_main(["import", *files, "-o", str(tmp_path / "t.json")]) == 0
    assert "2 steps" in (out := capsys.readouterr().out) and "median step 5.0 ms (of steps 1-2)" in out


def test_a_directory_without_traces_says_where_below_it_they_are(tmp_path):
    """A TensorBoard log dir keeps each run's traces in plugins/profile/<run>/: the refusal had said
    only that the directory held none."""
    with pytest.raises(ProfileError, match=r"no \.json or \.json\.gz traces in this directory$"):
        import_profile(tmp_path)
    run = tmp_path / "plugins" / "profile" / "2026_12_06"
    run.mkdir(parents=True)
    _gloo_rank(run / "r0.json", 0)
    with pytest.raises(ProfileError, match=f"in this directory: give the directory that holds them, {run}$"):
        import_profile(tmp_path)
    (tmp_path / "other").mkdir()
    _gloo_rank(tmp_path / "other" / "r0.json", 0)
    with pytest.raises(ProfileError, match=r"they are in 2 directories below it, .*; give one run's$"):
        import_profile(tmp_path)
