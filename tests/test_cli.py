"""The shell face: `paralab run --json` keys, exit codes, and torchrun with per-rank traces."""

import json
import os
import subprocess
import sys

import pytest

from paralab import cli
from paralab.runtime import launch as launch_module

CONTRACT_KEYS = {
    "strategy", "world_size", "dp", "tp", "pp", "schedule", "microbatches", "steps", "losses", "step_time_s",
    "tokens_per_s", "comm_bytes", "comm_payload_bytes", "bubble_fraction", "peak_memory_bytes", "trace",
}


def test_run_json_has_the_contract_keys(tmp_path, capsys, no_leftover_ranks):
    trace_path = tmp_path / "t.json"
    code = cli.main(["run", "--strategy", "ddp", "--world-size", "2", "--steps", "3", "--json",
                     "--trace", str(trace_path), "--bucket-mb", "0.1"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert CONTRACT_KEYS <= set(summary)
    assert len(summary["losses"]) == 3 and summary["world_size"] == 2 and summary["dp"] == 2
    assert len(summary["peak_memory_bytes"]) == 2 and summary["comm_bytes"]["all_reduce"] > 0
    assert summary["trace"] == str(trace_path)
    chrome = json.loads(trace_path.read_text())
    assert any(e.get("cat") == "all_reduce" for e in chrome["traceEvents"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--world-size", "0"], "world size"),
        (["--world-size", "3", "--global-batch", "8"], "not divisible"),
        (["--strategy", "nope"], "unknown strategy"),
        (["--model", "huge"], "unknown model preset"),
        # past any run: had started the ranks, to fail inside them or to run on for ever
        (["--threads", str(10**20)], "threads_per_rank must be <= 4,096"),
        (["--steps", str(10**23)], "steps must be <= 1,000,000,000"),
        (["--timeout", "1e300"], "timeout must be <= 1e+07 s"),
        # each step draws its samples from the corpus once: the ranks had started, then refused
        (["--global-batch", "65538"], "global batch 65,538 is larger than the corpus (65,536 samples)"),
    ],
)
def test_invalid_arguments_exit_2_before_any_process(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    assert cli.main(["run", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, make, message",
    [
        ("--trace", lambda tmp: tmp, "--trace {} is a directory"),
        ("--report", lambda tmp: tmp, "--report {} is a directory"),
        ("--trace-dir", lambda tmp: tmp / "file.txt", "--trace-dir {} exists and is not a directory"),
        ("--trace", lambda tmp: tmp / "file.txt" / "t.json", "is not a directory"),
        ("--profile", lambda tmp: tmp / "file.txt", "--profile {} exists and is not a directory"),
        # root passes the permission bits there, and the run had trained before failing to write
        ("--report", lambda tmp: "/proc/report.html", "--report /proc/report.html: cannot write in /proc"),
        ("--trace-dir", lambda tmp: "/proc/traces", "--trace-dir /proc/traces: cannot write in /proc"),
    ],
)
def test_unwritable_output_paths_exit_2_before_any_process(monkeypatch, capsys, tmp_path, option, make,
                                                           message):
    (tmp_path / "file.txt").write_text("in the way")
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    path = make(tmp_path)
    assert cli.main(["run", option, str(path)]) == 2
    assert message.format(path) in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["elastic", "--nnodes", "1:2", "--trace", "{tmp}"], "--trace {tmp} is a directory"),
        (["nodes", "--trace-dir", "{tmp}/file.txt", "--", "--strategy", "ddp"],
         "--trace-dir {tmp}/file.txt exists and is not a directory"),
        (["nodes", "--", "--strategy", "ddp", "--report", "{tmp}"], "--report {tmp} is a directory"),
        # all the agents' ranks on this machine, checked as one launch of them (they had started)
        (["nodes", "--nnodes", "2", "--nproc-per-node", "512", "--", "--global-batch", "1024"],
         "1024 ranks do not fit this machine"),
        (["import", "{tmp}/rank0.json", "-o", "{tmp}"], "output {tmp} is a directory"),
        # had been named as the world size it made (-1 x 2)
        (["nodes", "--nnodes", "-1", "--", "--strategy", "ddp"], "--nnodes must be >= 1, got -1"),
    ],
    ids=["elastic", "nodes", "nodes' run", "nodes' ranks", "import", "nodes' count"],
)
def test_the_other_commands_check_outputs_and_ranks_before_they_start(monkeypatch, capsys, tmp_path, argv,
                                                                      message):
    """Before a launch (or reading a profile): a path that cannot take the output, or more ranks than
    the machine holds, exits 2 then, not at the end."""
    from paralab.elastic import launch as elastic_launch
    from paralab.runtime import multinode, worker

    monkeypatch.setattr(worker, "usable_cores", lambda: 2)  # 1024 ranks fit no machine of 2 cores

    (tmp_path / "file.txt").write_text("in the way")
    for module, name in ((elastic_launch, "launch"), (multinode, "run_local_nodes")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("a process was about to start"))
    assert cli.main([arg.format(tmp=tmp_path) for arg in argv]) == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


def test_a_failed_run_exits_1_naming_the_rank(capsys, no_leftover_ranks):
    assert cli.main(["run", "--strategy", "dp", "--world-size", "2", "--steps", "3",
                     "--fail", "rank=1,step=1"]) == 1
    assert "rank 1 failed" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["run", "--steps", "many"], "argument --steps: invalid int value: 'many'"),
    (["simulate", "--model", "gpt3-125m", "--zero", "4"], "argument --zero: invalid choice: 4"),
    (["simulate", "--stage-layers", "a,b"], "expected whole numbers separated by commas"),  # was <lambda>
    (["elastic", "--nnodes", "a:b"], "--nnodes takes N or MIN:MAX"),
])
def test_unparseable_arguments_exit_2_in_one_line(capsys, argv, message):
    """As every refusal: one line that names the argument (the usage block is behind --help)."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and err.count("\n") == 1, err
    assert f"(see paralab {argv[0]} --help)" in err


def test_a_reader_that_goes_away_is_not_an_error(monkeypatch, capsys):
    """`paralab plan ... | head -1`: the pipe closes before the output is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", buffering=1) as closed_pipe:  # line-buffered, as on a terminal
        monkeypatch.setattr(sys, "stdout", closed_pipe)
        assert (cli.main(["plan", "--model", "gpt3-13b", "--gpus", "64", "--hardware", "a100"])
                == cli.EXIT_SIGPIPE)
    assert capsys.readouterr().err == ""


def test_a_broken_pipe_elsewhere_is_still_an_error(monkeypatch):
    def broken(args):
        raise BrokenPipeError("a worker's stdin closed")

    monkeypatch.setattr("paralab.sim.cli.plan_main", broken)
    with pytest.raises(BrokenPipeError):
        cli.main(["plan", "--model", "gpt3-13b", "--gpus", "64"])


@pytest.mark.timeout(240)
def test_torchrun_writes_per_rank_traces_that_merge(tmp_path):
    trace_dir = tmp_path / "traces"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    proc = subprocess.run(
        [*torchrun, "--standalone", "--nproc-per-node", "2", "-m", "paralab", "run", "--strategy", "ddp",
         "--steps", "3", "--bucket-mb", "0.1", "--trace-dir", str(trace_dir), "--json"],
        capture_output=True, text=True, timeout=200, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and len(summary["losses"]) == 3
    assert sorted(p.name for p in trace_dir.iterdir()) == ["rank00000.json", "rank00001.json"]
    merged = tmp_path / "merged.json"
    assert cli.main(["merge", str(trace_dir), "-o", str(merged)]) == 0
    from paralab.trace import Trace

    trace = Trace.load(merged)
    assert trace.ranks == [0, 1] and trace.select(kind="all_reduce")
    # every rank's file describes the run: the merged trace's throughput and strategy are the run's
    assert trace.meta["strategy"] == "ddp" and trace.meta["ranks"].keys() == {0, 1}
    assert trace.summary()["tokens_per_s"] > 0
    import paralab

    same = paralab.run("ddp", 2, steps=3, bucket_mb=0.1)
    assert same.losses == pytest.approx(summary["losses"], rel=1e-6)
