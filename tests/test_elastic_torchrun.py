"""The elastic worker under a torchrun of one's own (``torchrun ... -m paralab.elastic.train``).

``paralab elastic`` checks its settings before any process starts and prints the run's summary; under
someone's torchrun the workers are the first processes there are, so they do both: a setting that
cannot run (or that differs from another node's) is refused on every rank with exit 2 and one line,
and rank 0 of the world that finishes prints the summary. Each had been a traceback and exit 1 (with
torchrun's restarts: 134 s to fail), a silent mix of two seeds, and nothing printed at all.
"""

import json

import pytest
from test_cli import torchrun

import paralab
from paralab.elastic.history import _runs, _some
from paralab.elastic.train import shared_store_warning
from tests.conftest import assert_close_rel

STEPS, BATCH = 4, 12
WORKER = ("-m", "paralab.elastic.train", "--steps", str(STEPS), "--global-batch", str(BATCH),
          "--micro-batch", "4", "--timeout", "60")


@pytest.mark.timeout(240)
def test_a_torchrun_of_ones_own_trains_and_rank_0_prints_the_summary(tmp_path):
    proc = torchrun(*WORKER, "--checkpoint-dir", str(tmp_path / "ckpt"), "--json",
                    "--trace", str(tmp_path / "run.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(printed) == 1  # rank 0 alone
    summary = json.loads(printed[0])
    assert summary["world_sizes"] == [2] * STEPS and summary["trace"] == str(tmp_path / "run.json")
    assert summary["nnodes"] is None  # torchrun does not tell its workers its node range (had read 1:4)
    meta = json.loads((tmp_path / "run.json").read_text())["otherData"]["paralab"]
    assert meta["world_size"] == 2  # the most any world had (it had read the worker's default MAX, 4)
    single = paralab.run("single", 1, steps=STEPS, global_batch=BATCH).losses
    assert_close_rel(summary["losses"], single, what="losses")


@pytest.mark.timeout(240)
def test_nodes_given_different_seeds_are_refused_with_exit_2_naming_the_seed(tmp_path):
    job = tmp_path / "seed_by_rank.py"
    job.write_text("import os, sys\nfrom paralab.elastic.train import main\n"
                   f"sys.exit(main({list(WORKER[2:])!r} + ['--checkpoint-dir', {str(tmp_path / 'ckpt')!r}, "
                   "'--seed', os.environ['RANK']]))\n")
    proc = torchrun(str(job))
    said = ("python -m paralab.elastic.train: the ranks of this launch were given different settings: "
            "rank 1 has seed 1 against rank 0's 0")
    assert said in proc.stderr and "exitcode  : 2" in proc.stderr, proc.stderr[-3000:]
    workers_own = proc.stderr.split("failed (exitcode: 2)")[0]  # before torchrun's own account of it
    assert workers_own.count(said) == 2 and "Traceback" not in workers_own


@pytest.mark.timeout(120)
def test_a_checkpoint_dir_that_is_a_file_is_refused_with_exit_2_in_one_line(tmp_path):
    taken = tmp_path / "ckpt"
    taken.write_text("not a directory")
    proc = torchrun(*WORKER, "--checkpoint-dir", str(taken))
    said = f"python -m paralab.elastic.train: --checkpoint-dir {taken} exists and is not a directory"
    assert said in proc.stderr and "exitcode  : 2" in proc.stderr, proc.stderr[-3000:]
    assert "NotADirectoryError" not in proc.stderr


@pytest.mark.parametrize("flag", [["--max-restarts", "1"], ["--nnodes", "2:4"], ["--last-call", "5"],
                                  ["--max-restarts", "3"], ["--nnodes=1:4"]])  # the defaults, typed
def test_paralab_elastics_own_flags_are_refused_under_a_torchrun_of_ones_own(tmp_path, monkeypatch,
                                                                             capsys, flag):
    """Nothing reads them there: --max-restarts 1 had passed while torchrun restarted as its own flag
    said. Refused before the worker meets any other."""
    from paralab.elastic.train import main
    from paralab.runtime.agents import AGENT_PID

    monkeypatch.delenv(AGENT_PID, raising=False)
    assert main([*WORKER[2:], "--checkpoint-dir", str(tmp_path), *flag]) == 2
    err, name = capsys.readouterr().err.strip(), flag[0].split("=")[0]
    assert err == (f"python -m paralab.elastic.train: {name} is paralab elastic's, which starts the "
                   "agents: under a torchrun of your own, torchrun's --nnodes and --max-restarts say them; "
                   "leave it out")


def test_the_worker_takes_a_flag_only_as_spelled_whole(tmp_path, monkeypatch, capsys):
    """As paralab's own parsers: ``--max-rest 1`` had been read as --max-restarts, ``--thread 3`` as
    --threads."""
    from paralab.elastic.train import main
    from paralab.runtime.agents import AGENT_PID

    monkeypatch.delenv(AGENT_PID, raising=False)
    with pytest.raises(SystemExit) as refused:
        main([*WORKER[2:], "--checkpoint-dir", str(tmp_path), "--max-rest", "1"])
    assert refused.value.code == 2 and "unrecognized arguments: --max-rest 1" in capsys.readouterr().err


def test_paralab_elastics_own_agents_pass_every_flag_to_their_workers(monkeypatch):
    """Its launcher hands each worker the whole config (ElasticConfig.to_argv): none is refused there."""
    import argparse

    from paralab.elastic.cli import add_elastic_args
    from paralab.elastic.config import ElasticConfig
    from paralab.elastic.train import refuse_launcher_flags
    from paralab.runtime.agents import AGENT_PID

    parser = argparse.ArgumentParser()
    add_elastic_args(parser)
    argv = ElasticConfig(join_after_step=2).to_argv()
    monkeypatch.setenv(AGENT_PID, "1")
    refuse_launcher_flags(parser, argv)
    monkeypatch.delenv(AGENT_PID)
    with pytest.raises(paralab.ConfigError, match="--nnodes is paralab elastic's"):
        refuse_launcher_flags(parser, argv)


def test_a_long_runs_text_gives_its_worlds_as_runs_and_its_losses_at_the_ends():
    """A cluster run's thousand world sizes and losses had each filled one line of the summary."""
    assert _runs([4] * 30 + [2] * 70, first_step=10) == "4 (steps 10-39), 2 (40-109)"
    assert _runs([3, 3, 2], first_step=0) == "3 3 2"
    assert _some(str(k) for k in range(20)) == "0 1 2 3 4 5 ... 14 15 16 17 18 19 (20 steps; --json: all)"


def test_a_torchrun_that_shares_its_store_and_may_restart_is_told_how_to_outlive_a_node():
    """Under torch's default, the world formed again after a lost node read the last world's gloo
    addresses from the shared store: every restart of the survivor failed (measured, two agents on one
    machine); with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 the survivor trained on and a restarted node
    rejoined."""
    shared = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3"}
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in shared_store_warning(shared)
    assert shared_store_warning({**shared, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None
    assert shared_store_warning({**shared, "TORCHELASTIC_MAX_RESTARTS": "0"}) is None  # never restarts
