"""Multi-node DDP: nodes known per rank, intra/inter-node byte split, hierarchical all-reduce; local
torchrun agents that name a failing rank, listen on loopback only and die with their launcher."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import paralab
from paralab import cli
from paralab.config import RunConfig
from paralab.runtime.multinode import run_local_nodes
from paralab.runtime.torchrun import launched_nodes
from paralab.sim.bridge import specs_from_run
from paralab.viz.comm_compare import links_per_rank_step, per_rank_step, predicted_comm_trace
from tests.conftest import (
    TAG,
    assert_close_rel,
    assert_nothing_left,
    assert_same_params,
    beyond_loopback,
    listening_addresses,
    tagged_processes,
    wait_for,
)


def expected_inter_node_bytes(grad_bytes: int, nodes: int, per_node: int, hierarchical: bool) -> int:
    """Bytes leaving nodes per step, over all ranks, under ring accounting.

    Flat ring over N = nodes x per_node ranks (node-major order): each rank sends 2(N-1)/N of the
    gradient to its successor, and exactly ``nodes`` of the N links cross a node boundary.
    Hierarchical: the inter-node all-reduce runs on shards of 1/per_node, in per_node rings of
    ``nodes`` ranks whose every link crosses nodes: per_node x nodes x 2(nodes-1)/nodes x grad/per_node.
    """
    n = nodes * per_node
    if hierarchical:
        return 2 * (nodes - 1) * grad_bytes
    return nodes * 2 * (n - 1) * grad_bytes // n


def test_hierarchical_all_reduce_same_losses_fewer_inter_node_bytes(no_leftover_ranks):
    """Two microbatches a step: each bucket leaves once both backward passes have added into it. SGD,
    whose parameters show a gradient reduced by the wrong factor (Adam's would not)."""
    common = dict(steps=3, nodes=2, bucket_mb=0.2, microbatches=2, optimizer="sgd", lr=0.1,
                  collect_state=True)
    flat = paralab.run("ddp", 4, **common)
    tiered = paralab.run("ddp", 4, hierarchical=True, **common)
    assert_close_rel(tiered.losses, flat.losses)
    assert_same_params(tiered.params, flat.params)
    grad_bytes = flat.config.model.param_count() * 4
    flat_inter = flat.summary["comm_bytes_by_link"]["inter_node"]
    tiered_inter = tiered.summary["comm_bytes_by_link"]["inter_node"]
    assert flat_inter == pytest.approx(expected_inter_node_bytes(grad_bytes, 2, 2, False), abs=64)
    assert tiered_inter == pytest.approx(expected_inter_node_bytes(grad_bytes, 2, 2, True), abs=64)
    assert flat_inter / tiered_inter == pytest.approx(1.5, rel=1e-3)
    assert set(tiered.summary["comm_bytes"]) == {"reduce_scatter", "all_reduce", "all_gather"}
    # the simulator counts the three steps as the run sent them, op by op and link by link
    predicted = predicted_comm_trace(*specs_from_run(tiered.config), gpus_per_node=2)
    assert per_rank_step(predicted) == pytest.approx(per_rank_step(tiered.trace), rel=1e-3)
    assert links_per_rank_step(predicted) == pytest.approx(links_per_rank_step(tiered.trace), rel=1e-3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(world_size=2, hierarchical=True), "at least 2 nodes"),
        (dict(world_size=4, nodes=3), "cannot split world size 4 evenly: nodes that do are 1, 2, 4"),
        (dict(world_size=4, nodes=2, hierarchical=True, strategy="dp"), "ddp option"),
    ],
)
def test_bad_node_layouts_are_refused(kwargs, message):
    kwargs = {"strategy": "ddp", **kwargs}
    with pytest.raises(paralab.ConfigError, match=message):
        paralab.run(**kwargs)


@pytest.mark.parametrize("per_node, refused", [(4, True), (2, False)])
def test_a_torchrun_hierarchy_needs_two_nodes(monkeypatch, per_node, refused):
    """Under torchrun a rank knows the nodes from its environment (WORLD_SIZE over LOCAL_WORLD_SIZE):
    a hierarchical all-reduce on one node is refused before training, as with one emulated node (it had
    run as a reduce-scatter and an all-gather among every rank)."""
    from paralab.layout import resolve_layout

    env = {**TORCHRUN_RANK_ENV, "GROUP_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": str(per_node)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = RunConfig.build("tiny", strategy="ddp", world_size=4, hierarchical=True)
    if refused:
        with pytest.raises(paralab.ConfigError, match="at least 2 nodes"):
            resolve_layout(cfg)
    else:
        assert resolve_layout(cfg).dp == 4


def test_a_group_rank_left_in_a_shell_does_not_pass_a_local_run_for_several_nodes(monkeypatch):
    """A local run's nodes are its config's: a GROUP_RANK left in the shell (no torchrun launched this
    process) had let a hierarchical all-reduce on one emulated node through."""
    from paralab.layout import resolve_layout

    monkeypatch.setenv("GROUP_RANK", "1")
    cfg = RunConfig.build("tiny", strategy="ddp", world_size=4, hierarchical=True)
    with pytest.raises(paralab.ConfigError, match="at least 2 nodes: set nodes=2"):
        resolve_layout(cfg)


TORCHRUN_RANK_ENV = {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("agents, per_node, nodes", [(2, 2, 2), (1, 4, 1), (3, 2, 1)])
def test_a_torchrun_run_names_the_nodes_its_ranks_were_started_on(monkeypatch, agents, per_node, nodes):
    """torchrun's GROUP_WORLD_SIZE agents of LOCAL_WORLD_SIZE ranks each are the config's nodes (it had
    kept nodes=1, so a hierarchical run over real nodes was predicted as a flat all-reduce); where
    this rank's node times the agents is not the world (3 agents of 2 for 4 ranks) it stays one."""
    monkeypatch.setenv("GROUP_WORLD_SIZE", str(agents))
    assert launched_nodes(world_size=4, local_world=per_node) == nodes


def test_nodes_of_unequal_size_are_counted_as_the_nodes_the_ranks_ran_on():
    """A torchrun node of one rank beside a node of two: the config keeps nodes 1 (see above), but the
    summary had said so too, and its text hid the bytes that crossed between the nodes."""
    from paralab.layout import resolve_layout
    from paralab.runtime.result import RunResult
    from paralab.trace import COMM, STEP, Span, Trace

    cfg = RunConfig.build("tiny", strategy="ddp", world_size=3, global_batch=6)
    spans = [Span(rank, STEP, "step", 0.0, 1.0, step=0) for rank in range(3)]
    spans.append(Span(1, COMM, "all_reduce", 0.2, 0.4, bytes=100, payload_bytes=100, group_size=3, step=0,
                      inter_node=True))
    memory = {"peak_bytes": 0, "peak_by_kind": {}, "max_by_kind": {}}
    ranks = [{"rank": rank, "node": node, "memory": memory} for rank, node in enumerate((0, 1, 1))]
    summary = RunResult(cfg, resolve_layout(cfg), [1.0], Trace(spans=spans), ranks).summary
    assert summary["nodes"] == 2
    assert "by link: 0 B intra-node, 100 B inter-node per step" in cli.format_summary(summary)


@pytest.mark.timeout(300)
def test_two_torchrun_agents_act_as_two_nodes(tmp_path):
    run = run_local_nodes(["--strategy", "ddp", "--steps", "3", "--bucket-mb", "0.2", "--hierarchical"],
                          nnodes=2, nproc_per_node=2, timeout_s=240, trace_dir=str(tmp_path))
    nodes = {rank: info["node"] for rank, info in run.trace.meta["ranks"].items()}
    assert sorted(nodes) == [0, 1, 2, 3] and sorted(set(nodes.values())) == [0, 1]
    assert run.summary["comm_bytes_by_link"]["inter_node"] > 0 and run.summary["nodes"] == 2
    assert any(line.startswith("by link: ") for line in cli.format_summary(run.summary).splitlines())
    # the config names the nodes too, so the simulator prices the three steps the ranks ran
    cfg = RunConfig.from_dict(run.trace.meta["config"])
    assert cfg.nodes == 2 and specs_from_run(cfg)[1].hierarchical_dp == 2
    local = paralab.run("ddp", 4, steps=3, nodes=2, bucket_mb=0.2, hierarchical=True)
    assert_close_rel(run.losses, local.losses)
    assert all("--rdzv-backend" in cmd for cmd in run.commands)


def test_a_failing_rank_is_named_with_its_own_traceback_not_the_agents_stack(capsys):
    code = cli.main(["nodes", "--nnodes", "2", "--nproc-per-node", "1", "--",
                     "--strategy", "ddp", "--steps", "3", "--fail", "rank=1,step=1"])
    err = capsys.readouterr().err
    assert code == 1
    assert "rank 1 failed: InjectedFault: fault injected on rank 1 at step 1" in err
    assert "--- traceback on rank 1 ---" in err and "in check_fault" in err
    assert "frame #" not in err and "agent of node" not in err


@pytest.mark.timeout(150)
@pytest.mark.parametrize("hung", [0, 1])
def test_a_node_that_fails_stops_the_others_and_the_hung_rank_is_named(capsys, hung):
    """One rank hangs; its peer's collective times out after 5 s and that agent fails. The other agent,
    whose rank would hang on, is stopped (whichever node it is), and the rank that stopped answering
    is named, as `paralab run` names it, with the Python stack it hangs in, instead of the launcher
    waiting out its 600 s."""
    code = cli.main(["nodes", "--nnodes", "2", "--nproc-per-node", "1", "--", "--strategy", "ddp",
                     "--steps", "3", "--timeout", "5", "--fail", f"rank={hung},step=1,kind=hang"])
    err = capsys.readouterr().err
    assert code == 1 and f"rank {hung} failed: stopped answering" in err, err
    assert f"then rank {1 - hung} reported: a collective timed out after 5 s" in err
    marker = f"(Python stack of rank {hung}, which stopped answering)"
    assert marker in err, err
    assert "in at_step" in err.split(marker)[1], err  # where the hung rank sleeps (paralab.runtime.context)


def _workers(tag: str) -> list[psutil.Process]:
    out = []
    for p in tagged_processes(tag):
        try:
            if "RANK" in p.environ():
                out.append(p)
        except psutil.Error:
            continue
    return out


TRAINING_BYTES = 2**20  # written by a rank past its group's forming: the first step's gradients (~0.9 MB)


def _training(workers: list[psutil.Process]) -> bool:
    """Whether both workers are past init_process_group: each has written a step's gradients to its
    peer. Forming the group writes about 2 KB. A connected pair of gloo sockets came too early: a CI
    run's rank 1, signalled inside ProcessGroupGloo's constructor, left rank 0 waiting there with
    nothing to report."""
    try:
        return all(w.io_counters().write_chars > TRAINING_BYTES for w in workers)
    except psutil.Error:
        return False


def start_nodes(tag: str, tmp, **popen) -> subprocess.Popen:
    """`paralab nodes` (2 x 1 ranks, a long run) in a Python of its own, once its workers formed their
    process group and train (each worker's gloo sockets listen, and gradients flow)."""
    launcher = subprocess.Popen([sys.executable, "-m", "paralab", "nodes", "--nnodes", "2",
                                 "--nproc-per-node", "1", "--", "--strategy", "ddp", "--steps", "100000"],
                                env={**os.environ, TAG: tag, "TMPDIR": str(tmp)}, **popen)

    def training() -> bool:
        workers = _workers(tag)
        return len(workers) == 2 and all(listening_addresses([w]) for w in workers) and _training(workers)

    if not wait_for(training, 150):
        launcher.kill()
        pytest.fail("the two workers never started training")
    return launcher


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_agents_and_workers_listen_on_loopback_only_and_die_with_their_launcher(tmp_path, sig):
    tag = f"nodes-{os.getpid()}-{time.time_ns()}"
    launcher = start_nodes(tag, tmp_path)
    try:
        addresses = listening_addresses(tagged_processes(tag))
    finally:
        launcher.send_signal(sig)
        launcher.wait(timeout=30)
    assert not beyond_loopback(addresses), f"listening beyond loopback: {sorted(addresses)}"
    assert_nothing_left(tag, tmp_path)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGABRT], ids=["SIGKILL", "SIGABRT"])
def test_a_rank_killed_from_outside_is_named_with_its_signal_not_its_peer(tmp_path, sig):
    """Named with its signal; one that a fatal signal let speak (an abort in native code, say) also
    shows the Python stack it died in."""
    tag = f"nodes-kill-{os.getpid()}-{time.time_ns()}"
    launcher = start_nodes(tag, tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        (rank1,) = [w for w in _workers(tag) if w.environ()["RANK"] == "1"]
        rank1.send_signal(sig)
        _, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 1
    blamed = (f"rank 1 failed: died (signal {int(sig)}, {sig.name}) without reporting a result; "
              "then rank 0 reported")
    assert blamed in err, err
    if sig == signal.SIGABRT:
        marker = "(Python stack of rank 1 as it died)"
        assert marker in err, err
        stack = err.split(marker)[1]
        assert "Fatal Python error: Aborted" in stack and 'File "' in stack, err


def _forkservers() -> list[int]:
    return [p.pid for p in psutil.Process().children() if "forkserver" in " ".join(p.cmdline())]


@pytest.mark.timeout(300)
def test_agents_release_the_warm_forkserver_and_a_later_run_warms_a_new_one(no_leftover_ranks):
    """torchrun's workers import torch afresh, so the launcher stops its idle forkserver (about 230 MB)
    before starting agents; the next local run starts a new one and trains exactly as before."""
    first = paralab.run("ddp", 2, steps=2, global_batch=8)
    assert _forkservers(), "a local run leaves its forkserver warm"
    agents = run_local_nodes(["--strategy", "ddp", "--model", "tiny", "--device", "cpu", "--steps", "2",
                              "--global-batch", "8"], nnodes=2, nproc_per_node=1)
    assert _forkservers() == []
    assert_close_rel(agents.losses, first.losses, what="two agents against one launch")
    again = paralab.run("ddp", 2, steps=2, global_batch=8)
    assert again.losses == first.losses and len(_forkservers()) == 1


# ---------------------------------------------------------------------------- what nodes hands its agents
@pytest.fixture
def agents_started(monkeypatch):
    """run_local_nodes up to its agents' start: the commands it would start them with. This machine
    has 8 cores."""
    from paralab.runtime import launch, multinode

    started = {}

    def record(commands, *args):
        started["commands"] = commands
        raise paralab.RunError(None, "stopped before any agent started", "")

    monkeypatch.setattr(multinode, "_run_agents", record)
    monkeypatch.setattr(multinode, "release_forkserver", lambda: None)  # kept warm for the next tests
    for module in (launch, multinode):
        monkeypatch.setattr(module, "usable_cores", lambda: 8)
    return started


@pytest.mark.parametrize("argv, threads", [
    (["--nnodes", "2", "--nproc-per-node", "2", "--"], ["--threads", "2"]),
    (["--nnodes", "4", "--nproc-per-node", "2", "--"], ["--threads", "1"]),
    (["--nnodes", "2", "--nproc-per-node", "2", "--", "--threads", "3"], ["--threads", "3"]),  # as given
])
def test_nodes_gives_each_rank_its_share_of_the_machine_not_of_its_agent(agents_started, argv, threads):
    """An agent sizes its ranks' threads by its own ranks: N nodes on one machine had taken N times
    its cores (steps 10-50x slower, and noisy)."""
    assert cli.main(["nodes", *argv, "--strategy", "ddp"]) == 1
    for command in agents_started["commands"]:
        run_args = command[command.index("run") + 1:]
        at = run_args.index("--threads")
        assert run_args[at:at + 2] == threads and run_args.count("--threads") == 1


@pytest.mark.parametrize("given", [["--threads=3"], ["--threads", "3"]])
def test_nodes_keeps_the_threads_given(agents_started, given):
    """nodes appends each rank's share of the cores only where the run was given no ``--threads``: a
    share appended after the run's own would override it."""
    assert cli.main(["nodes", "--nnodes", "2", "--nproc-per-node", "2", "--", "--strategy", "ddp",
                     *given]) == 1
    for command in agents_started["commands"]:
        run_args = command[command.index("run") + 1:]
        assert "--threads" not in run_args[run_args.index(given[0]) + len(given):], run_args


@pytest.mark.parametrize("command", [["run"], ["nodes", "--"]])
def test_a_flag_is_taken_only_as_spelled_whole(agents_started, capsys, command):
    """argparse's prefix matching had read ``run --seq 64`` as ``--sequence-parallel`` and then refused
    the stray "64", and ``--thread 3`` as ``--threads 3`` (simulate has a ``--seq`` of its own)."""
    for flag in (["--seq", "64"], ["--thread", "3"]):
        with pytest.raises(SystemExit) as refused:
            cli.main([*command, "--strategy", "ddp", *flag])
        assert refused.value.code == 2
        assert f"paralab run: unrecognized arguments: {' '.join(flag)}" in capsys.readouterr().err
    assert "commands" not in agents_started  # refused before any agent or rank started


def test_nodes_warns_when_its_ranks_outnumber_the_cores(agents_started, monkeypatch):
    from paralab.runtime import launch, multinode

    for module in (launch, multinode):
        monkeypatch.setattr(module, "usable_cores", lambda: 2)
    with pytest.warns(RuntimeWarning, match="world size 4 exceeds the 2 usable CPU cores"):
        assert cli.main(["nodes", "--nnodes", "2", "--nproc-per-node", "2", "--", "--strategy", "ddp"]) == 1


def test_the_watchdog_of_nodes_allows_the_runs_own_collective_timeout():
    from paralab.runtime.multinode import _run_flags

    assert _run_flags(["--strategy", "ddp", "--timeout", "12", "--steps", "3"]).timeout == 12.0
    assert _run_flags(["--strategy", "ddp"]).timeout == RunConfig().timeout_s
    with pytest.raises(paralab.ConfigError, match="the run's flags: .*--threads: invalid int value"):
        _run_flags(["--threads", "many"])


# ---------------------------------------------------------------------------- an agent that died
def test_an_agent_killed_by_a_signal_is_named_as_its_nodes_death_not_a_rank_that_stopped_answering(tmp_path):
    """The ranks of an agent SIGKILLed die with it, unheard; its peers see a closed connection. That
    had been reported as "rank 1 failed: stopped answering (hung...)"."""
    from paralab.runtime.multinode import _failure

    (tmp_path / "rank0.error.json").write_text(json.dumps({
        "rank": 0, "from_the_wire": True, "traceback": "",
        "error": "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:3"}))
    failure = _failure(tmp_path, [(1, -signal.SIGKILL, "")], world=2)
    assert str(failure).startswith("the torchrun agent of node 1 died (signal 9, SIGKILL), and its ranks "
                                   "with it; then rank 0 reported: RuntimeError: "), str(failure)
    assert "stopped answering" not in str(failure)


@pytest.mark.timeout(150)
def test_a_rank_stopped_before_it_tied_its_life_to_its_agent_goes_with_the_run(tmp_path):
    """A rank stopped while it imports (before agents.worker_setup) is in a session of its own: the
    launcher had killed the agents' process groups and exited 1, and the rank stayed behind, adopted
    by PID 1."""
    tag = f"nodes-stopped-{os.getpid()}-{time.time_ns()}"
    launcher = subprocess.Popen([sys.executable, "-m", "paralab", "nodes", "--nnodes", "2",
                                 "--nproc-per-node", "1", "--", "--strategy", "ddp", "--steps", "50",
                                 "--timeout", "5"],
                                env={**os.environ, TAG: tag, "TMPDIR": str(tmp_path)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(_workers(tag)) == 2, 90, poll_s=0.02), "the workers never started"
        max(_workers(tag), key=lambda w: w.pid).suspend()  # the younger: still importing torch
        _, err = launcher.communicate(timeout=100)
    finally:
        launcher.kill()
    assert_nothing_left(tag, tmp_path)
    assert launcher.returncode == 1, err
    assert "stopped answering" in err and "another rank never joined" in err, err
