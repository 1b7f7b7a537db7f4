"""Elastic training: real SIGKILLs, rescaling, atomic resharding checkpoints, load balancing.

Every run here goes through torchrun's elastic agents on local "nodes" (2 processes each, which is what
makes these tests slow) and is checked against single-device training: whatever the world did, the
final history must have the same losses and every sample of each global batch exactly once.
"""

import dataclasses
import json
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import torch

import paralab
from paralab import cli, elastic, viz
from paralab.config import MODEL_PRESETS
from paralab.data import GlobalBatchSampler, SyntheticCorpus
from paralab.elastic import checkpoint
from paralab.elastic import launch as launch_module
from paralab.elastic.balance import Balancer
from paralab.elastic.config import ElasticConfig
from paralab.models.gpt import GPT, lm_loss
from paralab.strategies.common import make_optimizer
from paralab.viz._common import RANK_COLORS
from tests.conftest import (
    TAG,
    assert_close_rel,
    assert_nothing_left,
    beyond_loopback,
    listening_addresses,
    tagged_processes,
    wait_for,
)

STEPS, BATCH = 8, 12
QUICK = dict(global_batch=BATCH, micro_batch=4, run_timeout_s=170, timeout_s=30)


@contextmanager
def nothing_left_behind():
    """Puts a tag in the environment every agent and worker inherits; fails if a tagged process
    outlives the block."""
    tag = f"elastic-{os.getpid()}-{time.time_ns()}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TAG, tag)
        try:
            yield
        finally:
            deadline = time.time() + 10
            while time.time() < deadline and tagged_processes(tag):
                time.sleep(0.2)
            assert not tagged_processes(tag), "agents or workers outlived the elastic run"


def run_tagged(**options) -> elastic.ElasticResult:
    with nothing_left_behind():
        return elastic.run(**QUICK, **options)


def expected_ids(step: int) -> list[int]:
    return GlobalBatchSampler(SyntheticCorpus(128, 32).num_samples, BATCH).step_ids(step)


def assert_exact_history(result, reference_losses, steps=STEPS, first_step=0):
    """Same losses as single-device training; each step trained on its global batch exactly once."""
    assert [h["step"] for h in result.history] == list(range(first_step, steps))
    assert_close_rel(result.losses, reference_losses[first_step:steps], what="losses")
    for h in result.history:
        assert sorted(h["sample_ids"]) == sorted(expected_ids(h["step"])), (
            f"step {h['step']}: samples lost/repeated")


@pytest.fixture(scope="module")
def reference():
    """Single-device training, the uninterrupted run every elastic history must reproduce."""
    return paralab.run("single", 1, steps=STEPS, global_batch=BATCH).losses


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """4 nodes; the worker that is rank 2 is SIGKILLed (with its agent) at step 5; every checkpoint kept."""
    ckpt = tmp_path_factory.mktemp("killed") / "ckpt"
    result = run_tagged(nodes=4, min_nodes=3, max_nodes=4, steps=STEPS, checkpoint_every=2,
                        keep_checkpoints=10, checkpoint_dir=str(ckpt), fault={"rank": 2, "step": 5},
                        last_call_s=4)
    return result, ckpt


# ---------------------------------------------------------------------------- before any process
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nnodes", "4:2"], "min nodes 4 > max nodes 2"),
        (["--nnodes", "2:4", "--steps", "5", "--fail", "rank=1,step=5"], "fail step 5 is beyond the run"),
        (["--nnodes", "1:2", "--slow", "rank=1,factor=0"], "slow factor must be >= 1"),
        (["--nnodes", "1:2", "--slow", "rank=0,factor=-2"], "slow factor must be >= 1"),
        (["--nnodes", "1:2", "--slow", "rank=0,factor=2,bogus=1"], "slow takes rank and factor"),
        # no world of this run has a rank 2: it had been accepted and slowed nothing
        (["--nnodes", "2:3", "--nodes", "2", "--slow", "rank=2,factor=3"],
         "slow rank must be in [0, 2) (the ranks of the largest world this run has), got 2"),
        (["--nnodes", "3:4", "--fail", "rank=0,step=1", "--nodes", "3"], "fewer than min nodes 3"),
        (["--nnodes", "2:4", "--fail", "rank=0,step=1", "--nodes", "2"],
         "after the failure 1 node remains, fewer than min nodes 2: lower MIN in --nnodes 2:4"),
        # MIN cannot go below 1 (it had advised lowering it): one node has no survivor
        (["--nnodes", "1:1", "--fail", "rank=0,step=1"],
         "after the failure 0 nodes remain, fewer than min nodes 1: start 2 nodes or more "
         "(--nnodes 1:2 --nodes 2)"),
        (["--nnodes", "2:4", "--nodes", "1"], "1 starting node (--nodes) is outside --nnodes 2:4"),
        (["--nnodes", "1:4", "--nodes", "0"], "nodes must be >= 1, got 0"),  # had started 4 agents
        (["--nnodes", "1:1", "--balance"], "--nnodes 1:1 never has more than one node: leave it out"),
        (["--nnodes", "2:4", "--steps", "5", "--checkpoint-every", "2",
          "--fail", "rank=1,step=2,during=save"],
         "no checkpoint is saved after step 2 (every 2 steps: after steps [1, 3, 4])"),
        pytest.param(["--nnodes", "1:2", "--device", "cuda"], "no CUDA device is visible",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")),
    ],
)
def test_invalid_runs_exit_2_before_any_process(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(launch_module, "_agent_starter",
                        lambda *a: pytest.fail("an agent was about to start"))
    assert cli.main(["elastic", *argv]) == 2
    assert message in capsys.readouterr().err


def test_more_workers_than_cores_is_a_warning_as_for_a_run(monkeypatch):
    """8 workers had started on 2 cores without the warning a run of 8 ranks gives."""
    from paralab.runtime import launch as run_launch

    class Started(Exception):
        pass

    monkeypatch.setattr(run_launch, "usable_cores", lambda: 2)
    monkeypatch.setattr(launch_module, "Janitor", lambda: (_ for _ in ()).throw(Started()))
    with pytest.warns(RuntimeWarning, match="world size 4 exceeds the 2 usable CPU cores"), \
            pytest.raises(Started):
        launch_module.launch(ElasticConfig(min_nodes=1, max_nodes=4))


@pytest.mark.parametrize("slow", [{"factor": 3}, {"rank": 1}, [1, 3]])
def test_a_slowdown_from_python_names_what_it_lacks(slow):
    """The flag refuses ``--slow factor=3`` for its missing rank; from Python ``slow={"factor": 3}``
    had been told "slow rank must be in [0, 4), got None"."""
    with pytest.raises(paralab.ConfigError, match=r"slow takes rank and factor, both \(like rank=1"):
        ElasticConfig.build("tiny", min_nodes=1, max_nodes=4, slow=slow).validate()


def test_the_workers_parse_back_the_launchers_whole_config():
    """Every worker is started from ``to_argv``: each field, set away from its default, arrives (the
    reduction's dtype, recompute and the attention kernel had been dropped on the way)."""
    import argparse
    import dataclasses

    from paralab.elastic.cli import add_elastic_args, config_from_args

    cfg = ElasticConfig.build(
        "small", steps=7, global_batch=16, seed=3, device="cpu", lr=0.01, optimizer="sgd", timeout_s=42.0,
        threads_per_rank=1, trace=False, fault={"rank": 1, "step": 2}, oversubscribe=True,
        reduce_dtype="bf16", loss_scale=1024.0, recompute="full", micro_batch=2, min_nodes=2, max_nodes=3,
        nodes=3, max_restarts=5, join_after_step=None, checkpoint_dir="/tmp/ckpt", checkpoint_every=3,
        keep_checkpoints=4, slow={"rank": 0, "factor": 2}, balance=True, run_timeout_s=99.0, last_call_s=5)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention="math"))
    defaults = ElasticConfig()
    left_at_default = [f.name for f in dataclasses.fields(cfg)
                       if getattr(cfg, f.name) == getattr(defaults, f.name) and f.name != "dtype"]
    assert left_at_default == ["join_after_step"], left_at_default  # a join and a fault exclude each other
    parser = argparse.ArgumentParser()
    add_elastic_args(parser)
    assert config_from_args(parser.parse_args(cfg.to_argv())) == cfg
    joining = dataclasses.replace(cfg, fault=None, join_after_step=2)
    assert config_from_args(parser.parse_args(joining.to_argv())) == joining


def test_the_balancer_cuts_by_smoothed_samples_per_second():
    """By hand: 12 samples on 2 ranks, the second 3x slower (6 samples in 1 s and in 3 s): rates 6 and
    2 a second, so the next cut is 9 and 3; each rate then moves half-way to the newest measurement
    (SMOOTHING = 0.5), and a rank given nothing keeps its rate."""
    ids = list(range(12))
    balancer = Balancer(2, enabled=True)
    assert [len(balancer.shard(ids, r)) for r in range(2)] == [6, 6]  # nothing measured yet
    balancer.update([6, 6], [1.0, 3.0])
    assert balancer.rates == [6.0, 2.0] and [len(balancer.shard(ids, r)) for r in range(2)] == [9, 3]
    balancer.update([9, 3], [1.0, 0.5])  # the second rank sped up: 6 a second, smoothed to 4
    assert balancer.rates == [7.5, 4.0]
    balancer.update([12, 0], [1.0, 0.0])
    assert balancer.rates == [9.75, 4.0]
    assert [len(Balancer(2, enabled=False).shard(ids, r)) for r in range(2)] == [6, 6]


def test_the_balancer_gathers_its_measurements_on_the_ranks_device(monkeypatch):
    """NCCL gathers CUDA tensors only: the measurements had been gathered from the CPU whatever the
    rank's device, which an NCCL group refuses ("no backend for device type cpu")."""
    from paralab.elastic import balance

    seen = []

    def gathered(out, mine, name):
        seen.extend([out.device.type, mine.device.type])
        raise StopIteration  # the meta device holds no numbers to go on with

    monkeypatch.setattr(balance.comm, "all_gather", gathered)
    with pytest.raises(StopIteration):
        Balancer(2, enabled=True, device="meta").observe(6, 1.0)
    assert seen == ["meta", "meta"]


def test_a_rank_a_hundred_times_slower_keeps_a_sample_and_wins_its_share_back_when_it_recovers():
    """Rounded by its rate alone it would get none of 12 samples, and a rank given none keeps its old
    rate, so it would never be measured again."""
    ids = list(range(12))
    balancer = Balancer(2, enabled=True)
    balancer.update([6, 6], [0.1, 10.0])  # 60 and 0.6 samples a second
    assert [len(balancer.shard(ids, r)) for r in range(2)] == [11, 1]
    assert sorted(balancer.shard(ids, 0) + balancer.shard(ids, 1)) == ids
    balancer.update([11, 1], [11 / 60, 1 / 60])  # as fast as the other again: 60, smoothed to 30.3
    assert [len(balancer.shard(ids, r)) for r in range(2)] == [8, 4]


@pytest.mark.parametrize("manifest, message", [
    ("{bad", "cannot be read as a checkpoint manifest (JSONDecodeError"),
    ('{"nosig": 1}', "cannot be read as a checkpoint manifest (ValueError: no signature, step"),
    ('{"signature": {}, "step": 1}', "(ValueError: no sampler, rng, world_size)"),
    ('{"signature": {}, "step": "1", "sampler": 0, "rng": 0, "world_size": 1}',
     "(ValueError: step is '1', not a step number)"),
    (None, "exists and is not a directory"),
    ("no metadata", "its .metadata cannot be read (FileNotFoundError"),  # had raised a traceback
])
def test_a_checkpoint_dir_that_cannot_be_resumed_exits_2_before_any_agent(monkeypatch, capsys, tmp_path,
                                                                          manifest, message):
    """A damaged manifest, or a file where the directory belongs: refused, naming it (they had raised
    a traceback, or let the agents start)."""
    monkeypatch.setattr(launch_module, "_agent_starter",
                        lambda *a: pytest.fail("an agent was about to start"))
    root = tmp_path / "ckpt"
    if manifest is None:
        root.write_text("not a directory")
    elif manifest == "no metadata":  # a manifest that matches, beside no DCP metadata at all
        cfg, model, optimizer = _tiny_trained()
        checkpoint.save(root, 1, model, optimizer, ElasticConfig.build("tiny").signature(), {"next_step": 1})
        (root / "step-00000001" / ".metadata").unlink()
    else:
        (root / "step-00000001").mkdir(parents=True)
        (root / "step-00000001" / "manifest.json").write_text(manifest)
    assert cli.main(["elastic", "--nnodes", "1:2", "--checkpoint-dir", str(root)]) == 2
    assert message in capsys.readouterr().err


def test_the_help_offers_only_the_presets_elastic_trains(capsys):
    """It had offered tiny-moe and small-moe, which elastic refuses (a mixture of experts)."""
    with pytest.raises(SystemExit):
        cli.main(["elastic", "--help"])
    offered = capsys.readouterr().out.split("preset: ")[1].split(" (default")[0].split(", ")
    assert offered == [name for name, model in MODEL_PRESETS.items() if not model.experts]
    assert "tiny" in offered and "tiny-moe" not in offered


def test_a_refusal_is_one_line_where_the_workers_would_share_the_cores(monkeypatch, capsys, tmp_path):
    """The warning that 4 workers would share 2 cores had come before the refusal of the run: two lines
    where a refusal is one."""
    from paralab.runtime import launch as run_launch

    monkeypatch.setattr(run_launch, "usable_cores", lambda: 2)
    monkeypatch.setattr(launch_module, "_agent_starter",
                        lambda *a: pytest.fail("an agent was about to start"))
    (tmp_path / "ckpt").write_text("not a directory")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        assert cli.main(["elastic", "--nnodes", "1:4", "--checkpoint-dir", str(tmp_path / "ckpt")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert [str(w.message) for w in warned] == []


def _tiny_trained(steps: int = 1, seed: int = 0):
    cfg = ElasticConfig()
    model = GPT(cfg.model, seed)
    optimizer = make_optimizer(cfg, model.parameters())
    tokens = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(seed))
    for _ in range(steps):
        optimizer.zero_grad()
        lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
        optimizer.step()
    return cfg, model, optimizer


def test_another_models_checkpoint_is_refused_with_exit_2(tmp_path, monkeypatch, capsys):
    cfg, model, optimizer = _tiny_trained()
    theirs = ElasticConfig.build("small").signature()  # the manifest says another model wrote it
    checkpoint.save(tmp_path, 1, model, optimizer, theirs, {"next_step": 1})
    monkeypatch.setattr(launch_module, "_agent_starter",
                        lambda *a: pytest.fail("an agent was about to start"))
    assert cli.main(["elastic", "--nnodes", "1:2", "--checkpoint-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    # the fields that differ, not both models' whole configs
    assert "holds the checkpoint of another run" in err and "model.hidden: checkpoint 256, this run 64" in err
    assert "model.dropout" not in err and "{" not in err


@pytest.mark.parametrize("steps", [2, 3])
def test_a_checkpoint_at_or_past_the_last_step_is_refused_before_any_agent(tmp_path, monkeypatch, steps):
    """Resuming from step 3 with 3 (or 2) steps asked would train nothing; it had exited 0 with no
    losses."""
    cfg, model, optimizer = _tiny_trained()
    checkpoint.save(tmp_path, 3, model, optimizer, cfg.signature(), {"next_step": 3})
    monkeypatch.setattr(launch_module, "_agent_starter",
                        lambda *a: pytest.fail("an agent was about to start"))
    with pytest.raises(paralab.ConfigError, match=f"step-00000003 resumes at step 3, and the run has {steps} "
                                                  "steps: nothing would train"):
        launch_module.launch(dataclasses.replace(cfg, steps=steps, checkpoint_dir=str(tmp_path)))


@pytest.mark.parametrize("held, message", [
    ("gen-000", r"already holds a run \(gen-000\)"), ("checkpoints", r"already holds a run \(checkpoints\)"),
    (None, "is a file"),
])
def test_a_run_directory_that_holds_another_run_is_refused_before_any_agent(tmp_path, monkeypatch, held,
                                                                              message):
    """A second run in one run directory had read the first one's generations as its own (trained
    nothing, exit 0, the first run's losses)."""
    run_dir = tmp_path / "run"
    if held is None:
        run_dir.write_text("not a directory")
    else:
        (run_dir / held).mkdir(parents=True)
    monkeypatch.setattr(launch_module, "_agent_starter",
                        lambda *a: pytest.fail("an agent was about to start"))
    with pytest.raises(paralab.ConfigError, match=message):
        launch_module.launch(ElasticConfig(), run_dir=run_dir)


def test_a_crash_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    cfg, model, optimizer = _tiny_trained(steps=1)
    first = checkpoint.save(tmp_path, 2, model, optimizer, cfg.signature(), {"next_step": 2})
    assert checkpoint.read_manifest(first)["step"] == 2  # every key a resume reads is written
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    _, later, later_opt = _tiny_trained(steps=3)

    def crash():
        raise RuntimeError("worker killed mid-save")

    with pytest.raises(RuntimeError, match="mid-save"):
        checkpoint.save(tmp_path, 4, later, later_opt, cfg.signature(), {"next_step": 4}, before_commit=crash)
    assert (tmp_path / ".tmp-step-00000004" / ".metadata").exists(), "the crash left a complete-looking save"
    assert checkpoint.latest(tmp_path).name == "step-00000002"
    _, fresh, fresh_opt = _tiny_trained(steps=0, seed=7)
    assert checkpoint.load(checkpoint.latest(tmp_path), fresh, fresh_opt)["step"] == 2
    for name, p in fresh.named_parameters():
        assert torch.equal(p, saved[name]), name
    (tmp_path / ".trash-step-00000000" / "model").mkdir(parents=True)  # a retirement killed mid-delete
    checkpoint.save(tmp_path, 4, later, later_opt, cfg.signature(), {"next_step": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000004"]


class _Payload:
    """Whoever unpickles this runs ``open(marker, "w")``: the marker file is the proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_crafted_checkpoint_metadata_is_refused_with_nothing_executed(tmp_path, monkeypatch, capsys):
    cfg, model, optimizer = _tiny_trained()
    ckpt = checkpoint.save(tmp_path / "ckpt", 1, model, optimizer, cfg.signature(), {"next_step": 1})
    crafted = pickle.dumps(_Payload(tmp_path / "pwned"))
    pickle.loads(pickle.dumps(_Payload(tmp_path / "unpickled")))
    assert (tmp_path / "unpickled").exists(), "the payload does run when unpickled"
    (ckpt / ".metadata").write_bytes(crafted)
    monkeypatch.setattr(launch_module, "_agent_starter", lambda *a: pytest.fail("an agent started"))
    assert cli.main(["elastic", "--nnodes", "1:2", "--checkpoint-dir", str(tmp_path / "ckpt")]) == 2
    assert "is not plain checkpoint metadata (it refers to io.open" in capsys.readouterr().err
    _, fresh, fresh_opt = _tiny_trained(steps=0, seed=7)
    with pytest.raises(checkpoint.UnsafeCheckpoint, match="io.open"):
        checkpoint.load(ckpt, fresh, fresh_opt)  # a worker resuming from it refuses it too
    assert not (tmp_path / "pwned").exists()


def test_a_crafted_optimizer_entry_is_refused_with_nothing_executed(tmp_path):
    cfg, model, optimizer = _tiny_trained()
    optimizer.param_groups[0]["lr"] = _Payload(tmp_path / "pwned")  # saved as a pickled non-tensor entry
    ckpt = checkpoint.save(tmp_path / "ckpt", 1, model, optimizer, cfg.signature(), {"next_step": 1})
    checkpoint.check_metadata(ckpt)  # the metadata itself is plain
    _, fresh, fresh_opt = _tiny_trained(steps=0, seed=7)
    with pytest.raises(checkpoint.UnsafeCheckpoint, match="param_groups.*lr.* is not plain data"):
        checkpoint.load(ckpt, fresh, fresh_opt)
    assert not (tmp_path / "pwned").exists()


# ---------------------------------------------------------------------------- real runs
@pytest.mark.timeout(240)
def test_a_killed_worker_is_survived_by_three_with_identical_losses(killed, reference):
    result, _ = killed
    assert result.failure["rank"] == 2 and result.failure["step"] == 5
    (t,) = result.transitions
    assert t["reason"] == "failure" and (t["world_size_before"], t["world_size"]) == (4, 3)
    assert t["checkpoint"] == "step-00000004" and t["steps_redone"] == 1  # step 4 ran in both worlds
    assert result.summary["world_sizes"] == [4, 4, 4, 4, 3, 3, 3, 3]
    # the text says which node went and how (it had said "failure" alone, and "1 step(s) redone")
    assert (f"gen-001: failure of node {t['failed_node']} (rank 2, injected by --fail), world 4 -> 3, "
            "resumed at step 4, 1 step redone") in result.describe()
    assert_exact_history(result, reference)
    every_id = [i for h in result.history for i in h["sample_ids"]]
    assert len(every_id) == len(set(every_id)) == STEPS * BATCH


@pytest.mark.timeout(240)
def test_a_checkpoint_saved_at_world_4_resumes_at_2_and_3(killed, reference, tmp_path):
    result, ckpt = killed
    resumed = result.summary["generations"][1]
    assert (resumed["checkpoint_world_size"], resumed["world_size"], resumed["start_step"]) == (4, 3, 4)
    shutil.copytree(ckpt / "step-00000004", tmp_path / "step-00000004")
    at_two = run_tagged(nodes=2, min_nodes=1, max_nodes=2, steps=STEPS, checkpoint_dir=str(tmp_path))
    assert at_two.summary["generations"][0]["checkpoint_world_size"] == 4
    assert at_two.summary["world_sizes"] == [2, 2, 2, 2]
    assert_exact_history(at_two, reference, first_step=4)
    # its text says which steps it trained (world sizes and losses had read as if from step 0)
    assert f"; resumed from a checkpoint: steps 4-{STEPS - 1} trained here" in at_two.describe()


def phase_labels(fig) -> list[str]:
    return [label for label, _, _ in fig.layout.meta["phases"]]


def assert_no_line_across_a_gap(fig) -> None:
    """In the wall-clock panels, two points are joined only inside one training phase: where no step
    ran, a line has a gap (None), never a segment."""
    training = [(lo, hi) for label, lo, hi in fig.layout.meta["phases"] if label.startswith("training")]
    wall_clock = {fig.get_subplot(row, 1).xaxis.plotly_name.replace("axis", "") for row in (2, 3, 4)}
    lines = [t for t in fig.data
             if t.type == "scatter" and t.xaxis in wall_clock and "lines" in (t.mode or "")]
    assert lines
    for t in lines:
        for a, b in zip(t.x, t.x[1:]):
            if a is not None and b is not None:
                assert any(lo - 1e-3 <= a and b <= hi + 1e-3 for lo, hi in training), (t.name, a, b, training)


def test_the_elastic_figure_tells_the_story_in_phases(killed):
    result, _ = killed
    fig = viz.elastic(result.trace)
    assert phase_labels(fig) == ["start", "training at 4 ranks", "failure", "detected",
                                 "rendezvous", "restore", "training at 3 ranks"]
    starts = [lo for _, lo, _ in fig.layout.meta["phases"]]
    assert starts == sorted(starts) and all(lo <= hi for _, lo, hi in fig.layout.meta["phases"])
    failure = next(lo for label, lo, _ in fig.layout.meta["phases"] if label == "failure")
    assert (failure
            == pytest.approx(next(s.start for s in result.trace.select(lane="event") if s.kind == "failure")))
    assert_no_line_across_a_gap(fig)
    # the rendezvous ends when the first survivor's agent spawned its new worker; the restore holds the
    # workers' start-up (Python, torch), their meeting and the checkpoint load
    spawned = [s for s in result.trace.select(lane="event") if s.kind == "worker_start" and s.start > failure]
    assert len(spawned) == 3 and all(s.start < s.end for s in spawned)
    rendezvous, restore = (next((lo, hi) for label, lo, hi in fig.layout.meta["phases"] if label == name)
                           for name in ("rendezvous", "restore"))
    assert rendezvous[1] == restore[0] == pytest.approx(min(s.start for s in spawned))
    step_time = next(t for t in fig.data if t.name == "step time")
    assert None in step_time.x, "the recovery is a gap in the step-time line"
    # the step-indexed panels: one bar per step, world 4 then 3, each step's samples over the ranks
    assert (fig.layout.meta["steps"] == list(range(STEPS))
            and fig.layout.meta["world_size"] == result.summary["world_sizes"])
    # each node's samples (its lane's colour throughout): the killed node's fall to 0 after the kill
    samples = {t.name: t.y for t in fig.data if t.type == "bar" and (t.name or "").startswith("node ")}
    assert [sum(y[k] for y in samples.values()) for k in range(STEPS)] == [BATCH] * STEPS
    lost_node = f"node {result.transitions[0]['failed_node']}"
    assert set(samples[lost_node][result.transitions[0]["resumed_at_step"]:]) == {0}
    lost = next(t for t in fig.data if t.name == "step lost (redone later)")
    assert list(lost.x) and len(lost.x) == result.transitions[0]["steps_redone"]
    # the box counts the stretch without steps in the summary's step (notebook 07 prints both: they
    # had counted against two medians, 421 and 387 steps' worth of one recovery)
    gap = (next(lo for label, lo, _ in fig.layout.meta["phases"] if label == "training at 3 ranks")
           - next(hi for label, _, hi in fig.layout.meta["phases"] if label == "training at 4 ranks"))
    assert f"{gap / result.summary['step_time_s']:,.0f} steps' worth" in fig.layout.annotations[-1].text
    # the run's own series in greys, apart from the ranks' colours
    series = {t.line.color for t in fig.data if t.name in ("world size", "step time")}
    assert len(series) == 2 and not series & set(RANK_COLORS)


def story_trace(spans=None):
    """A two-world story on the trace clock, by hand: 2 ranks, rank 1 killed at 0.75 s and noticed at
    0.78 s, the survivor's agent spawning its new worker at 7 s, a world of 1 from step 1 on. ``spans``
    filters the event spans (a predicate)."""
    from paralab.trace import Span, Trace

    def event(rank, kind, start, end, name=""):
        return Span(rank, "event", kind, start, end, name=name)

    def record(step, gen, world, start, final=True):
        return {"step": step, "generation": gen, "world_size": world, "samples": [4] * world,
                "compute_s": [0.05] * world, "start": start, "end": start + 0.1, "final": final}

    events = [event(0, "worker_start", -3.0, -0.5), event(1, "worker_start", -2.9, -0.4),
              event(0, "rendezvous", -0.5, 0.0, "rendezvous: world of 2"),
              event(1, "rendezvous", -0.4, 0.0, "rendezvous: world of 2"),
              event(1, "failure", 0.75, 0.75, "SIGKILL"), event(0, "failure_detected", 0.78, 0.78),
              event(0, "worker_start", 7.0, 9.5), event(0, "rendezvous", 9.5, 10.0, "rendezvous: world of 1"),
              event(0, "checkpoint_load", 10.1, 10.3, "load step-00000001")]
    records = [record(0, "gen-000", 2, 0.5), record(1, "gen-000", 2, 0.6, final=False),
               record(1, "gen-001", 1, 10.4), record(2, "gen-001", 1, 10.5)]
    meta = {"generations": [{"name": "gen-000", "world_size": 2, "wall_start": 100.0},
                            {"name": "gen-001", "world_size": 1, "wall_start": 110.0}],
            "step_records": records}
    return Trace(spans=[e for e in events if spans is None or spans(e)], meta=meta)


def test_the_recovery_is_split_where_the_agents_spawned_the_new_workers():
    """The rendezvous phase had ended when the new workers had imported torch and met (12.8 s, where the
    keep-alive and the last call make 9 s): it ends when the first agent spawned its worker, and the
    restore holds the workers' start-up. A trace without ``worker_start`` spans keeps the old cut."""
    phases = {p["label"]: p for p in viz.elastic_phases(story_trace())}
    assert list(phases) == ["start", "training at 2 ranks", "failure", "detected", "rendezvous", "restore",
                            "training at 1 rank"]  # had read "1 ranks"
    # one survivor detects it (had read "last of 1 after 30 ms")
    assert phases["detected"]["detail"] == "by the survivor after 30 ms"
    assert (phases["start"]["start"], phases["start"]["detail"]) == (-3.0, "workers start (Python, torch), "
                                                                           "2 ranks meet, build the model")
    assert (phases["rendezvous"]["start"], phases["rendezvous"]["end"]) == (0.78, 7.0)
    assert (phases["restore"]["start"], phases["restore"]["end"]) == (7.0, 10.4)
    assert phases["restore"]["detail"] == "workers start (Python, torch: 2.50 s), meet, load step-00000001"
    older = story_trace(spans=lambda e: e.kind != "worker_start")
    cut = {p["label"]: p for p in viz.elastic_phases(older)}
    assert cut["rendezvous"]["end"] == cut["restore"]["start"] == 10.0 and cut["start"]["start"] == -0.5


def test_the_story_keeps_its_note_off_the_rows_and_shows_the_kill():
    """Notebook 07's story at 820 pixels: the box in the phases' corner had covered the end of row 1's
    text, the restore's text ("... load step-00000002") had run off the right edge, the start's grey and
    the rendezvous' purple shading (opacity 0.12) had read as one, and the detection (milliseconds) had
    not been seen at all. Now the note sits above the phases, a long text takes two lines (broken
    outside brackets), the shading is stronger in hues apart, and a red line marks the kill."""
    from paralab.viz.elastic import PHASE_COLORS, SHADE, TEXT_WRAP

    fig = viz.elastic(story_trace())
    note = fig.layout.annotations[-1]
    assert (note.xanchor, note.yanchor) == ("left", "bottom") and note.y > 1  # above the phases' panel
    assert note.text == ("<b>training at 2 ranks</b>, then no step ran for 9.65 s (97 steps' worth), "
                         "then <b>training at 1 rank</b>")
    texts = [t.text[0].strip() for t in fig.data if t.type == "scatter" and t.mode == "markers+text"]
    restore = next(t for t in texts if "load step-00000001" in t)
    assert restore == "3.40 s: workers start (Python, torch: 2.50 s),<br>  meet, load step-00000001"
    assert all("<br>" in t or len(t) <= TEXT_WRAP for t in texts)
    kills = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(kills) == 3 and all(s.x0 == s.x1 == 0.75 and s.line.color == PHASE_COLORS["failure"]
                                   for s in kills)  # one per wall-clock panel
    shaded = [s for s in fig.layout.shapes if s.type == "rect"]
    assert shaded and all(s.opacity == SHADE for s in shaded)
    assert len({PHASE_COLORS[p] for p in ("start", "rendezvous", "restore", "detected")}) == 4


def lab(color: str) -> tuple[float, float, float]:
    """CIE L*a*b* of a "#RRGGBB" colour (sRGB, D65): distances in it are differences the eye sees."""
    def linear(c):
        return ((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92

    r, g, b = (linear(int(color[i:i + 2], 16) / 255) for i in (1, 3, 5))
    xyz = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_the_phases_colours_are_not_the_ranks():
    """Notebook 07's story: its phases had been drawn in the ranks' own colours (restore blue, training
    green, detection orange) right under the legend of rank 0 blue, 1 orange, 2 green, so that a reader
    took the restore for rank 0. Every phase's colour is now far (CIE76 distance 20 or more, a
    difference seen at a glance) from those of the first four ranks, and the phases' own clock is
    named on their panel, clear of the panel below."""
    from paralab.viz.elastic import CLOCK, PHASE_COLORS

    def distance(a, b):
        return math.dist(lab(a), lab(b))

    for phase, color in PHASE_COLORS.items():
        for rank, theirs in enumerate(RANK_COLORS[:4]):
            assert distance(color, theirs) >= 20, (phase, color, rank, theirs)
    fig = viz.elastic(story_trace())
    assert fig.layout.xaxis.title.text == CLOCK == "seconds since the first world formed"
    # room under the phases for their ticks, that title and the world-size panel's title (70 pixels):
    # at the old spacing (50) the axis title sat on the subplot title
    plot_height = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert (fig.layout.yaxis.domain[0] - fig.layout.yaxis2.domain[1]) * plot_height >= 70
    bars = {t.name: t.marker.color for t in fig.data if t.type == "bar" and t.xaxis == "x"}
    assert bars and not set(bars.values()) & set(RANK_COLORS[:4])


def test_detection_is_timed_on_the_trace_clock():
    """describe() and notebook 07 had said the detection took 42 ms where the figure, from the trace, said
    43: the transition's detection_s came from the wall-clock times of the fault marker and the error
    reports, each a file write away from the spans the figure draws. It is the trace's now, where both
    spans are there; a node lost from outside has no failure span and keeps the wall clock."""
    from paralab.elastic.history import Generation, _transitions
    from paralab.trace import Span

    def line(rank, kind, at):
        return {"span": dataclasses.asdict(Span(rank, "event", kind, at, at))}

    def generation(name, world, wall_start, start_step, nodes, errors=(), lines=(), last_seen=None):
        meta = {"world_size": world, "wall_start": wall_start, "start_step": start_step, "nodes": nodes,
                "checkpoint": None if start_step == 0 else f"step-{start_step:08d}"}
        steps = {start_step: {"t_end": wall_start + 1.0}}
        return Generation(name, meta, steps, list(errors), list(lines),
                          last_seen or {r: wall_start for r in range(world)})

    traced = [line(1, "failure", 0.75), line(0, "failure_detected", 0.78), line(2, "failure_detected", 0.80)]
    errors = [{"rank": 0, "t": 100.9}, {"rank": 2, "t": 100.95}]  # the wall clock: 100 ms after the marker
    after = generation("gen-001", 2, 110.0, 1, [0, 2])
    failure = {"rank": 1, "step": 1, "t": 100.8}
    (t,) = _transitions([generation("gen-000", 3, 100.0, 0, [0, 1, 2], errors, traced), after], failure)
    assert t["reason"] == "failure" and t["detection_s"] == pytest.approx(0.03)
    (t,) = _transitions([generation("gen-000", 3, 100.0, 0, [0, 1, 2], errors), after], failure)
    assert t["detection_s"] == pytest.approx(0.1)  # no spans: the wall clock, as before
    seen = {0: 100.6, 1: 100.5, 2: 100.6}
    lost = generation("gen-000", 3, 100.0, 0, [0, 1, 2], errors, traced, last_seen=seen)
    (t,) = _transitions([lost, after], None)
    assert (t["cause"], t["detection_s"]) == ("node lost", pytest.approx(0.4))  # from its last sign of life


def test_the_balance_figure_draws_the_share_in_proportion_to_speed():
    """Notebook 07's balance figures: the left subplot's title had been cut at both ends at 820 pixels,
    and nothing showed the share a rank F times slower would get in proportion to speed, 1/(1 + F)."""
    from types import SimpleNamespace

    from paralab.trace import Trace

    records = [{"step": k, "generation": "gen-000", "world_size": 2, "samples": samples, "compute_s": seconds,
                "start": k, "end": k + 0.5, "final": True}
               for k, (samples, seconds) in enumerate([([6, 6], [0.01, 0.03]), ([9, 3], [0.015, 0.015])])]
    trace = Trace(meta={"step_records": records})
    fig = viz.elastic_balance(trace, slow={"rank": 1, "factor": 3})
    assert fig.layout.meta["proportional"] == pytest.approx([0.75, 0.25])
    dotted = [t for t in fig.data if t.type == "scatter" and t.line.dash == "dot"]
    assert [list(t.y) for t in dotted] == [[0.75, 0.75], [0.25, 0.25]] and list(dotted[0].x) == [0, 1]
    # every line drawn has its legend entry: the slow rank's dotted 25% had none
    assert all(t.showlegend is not False for t in fig.data if t.type == "scatter")
    assert [t.name for t in dotted] == ["rank 0: in proportion to speed (75%)",
                                        "rank 1: in proportion to speed (25%, 3x slower)"]
    assert [t.legendgroup for t in dotted] == ["0", "1"]
    assert fig.layout.annotations[0].text == "batch share (solid), throughput share (dashed)"
    assert viz.elastic_balance(trace).layout.meta["proportional"] is None  # no slowdown known
    result = SimpleNamespace(trace=trace, config=SimpleNamespace(slow={"rank": 0, "factor": 5}))
    assert viz.elastic_balance(result).layout.meta["proportional"] == pytest.approx([1 / 6, 5 / 6])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_worker_knows_when_its_agent_spawned_it():
    """The restore phase starts at the new workers' spawn: the process's own start, before it imported
    torch, so before its first reading and after the machine booted. Asked of a fresh interpreter, as a
    new worker is: this test's own had started with the suite, which can be more than the 600 s
    process_started allows a worker's start-up before it gives no answer."""
    probe = ("import json, time, psutil; from paralab.elastic.train import process_started; "
             "print(json.dumps([process_started(), time.time(), psutil.Process().create_time()]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    started, now, created = json.loads(done.stdout)
    assert started is not None and 0.0 < now - started < 600.0
    # psutil counts from the boot time, which /proc gives in whole seconds: the same moment, to a second
    assert abs(started - created) < 2.0


def test_durations_under_a_second_are_said_in_milliseconds():
    """describe() had said "detected 0.0 s after it" of a detection 30 ms after the kill."""
    from paralab.elastic.history import seconds

    assert [seconds(x) for x in (0.03, 0.9994, 0.9996, 12.63)] == ["30 ms", "999 ms", "1.0 s", "12.6 s"]


def test_each_lane_of_an_elastic_trace_is_one_nodes_worker(killed):
    """Spans had been filed under the rank a worker had in its world: the killed worker's lane went on
    with the next world's work of whichever node became that rank, and a survivor's lane ended at the
    failure. Each lane is one node's worker now: the lost node's ends at its kill, the others go on."""
    result, _ = killed
    (t,) = result.transitions
    kill = next(s for s in result.trace.select(lane="event") if s.kind == "failure")
    assert kill.rank == t["failed_node"]
    after = {s.rank for s in result.trace.select(lane="step") if s.start > kill.start}
    assert after == set(result.summary["generations"][1]["nodes"]) and t["failed_node"] not in after
    assert viz.elastic_phases(result.trace)[2]["detail"].startswith(f"node {t['failed_node']}: ")
    titles = {a.text for a in viz.elastic(result.trace).layout.annotations}
    assert "samples per node per step" in titles and "samples per rank per step" not in titles


def test_the_trace_carries_counters_and_membership_events(killed, tmp_path):
    trace = killed[0].trace
    assert {"step_time_s", "cpu_percent", "rss_bytes"} <= {c.name for c in trace.counters}
    events = {s.kind for s in trace.select(lane="event")}
    assert {"worker_start", "rendezvous", "checkpoint_save", "checkpoint_load", "failure",
            "failure_detected"} <= events
    redone = [s for s in trace.select(lane="step") if "redone" in s.name]
    assert redone and all(s.step is None for s in redone)
    assert sorted(trace.step_windows()) == list(range(STEPS))
    chrome = trace.to_chrome()["traceEvents"]
    assert any(e["ph"] == "C" and e["name"] == "cpu_percent" for e in chrome)


@pytest.mark.timeout(240)
def test_a_crash_during_a_save_resumes_from_the_previous_checkpoint_then_a_node_joins(reference):
    """Scale-in by a SIGKILL in the middle of a save, then scale-out by a standby node released once the
    survivor has redone step 3. Rank 0 is slowed 40x so that the short run is still going when the new
    node's workers have started (they import torch afresh): the world of two resumes from a checkpoint
    the world of one wrote (resharded up) and trains every step from there."""
    result = run_tagged(nodes=2, min_nodes=1, max_nodes=2, steps=STEPS, checkpoint_every=2,
                        fault={"rank": 1, "step": 3, "during": "save"}, join_after_step=3,
                        slow={"rank": 0, "factor": 40})
    crash, *_, join = result.transitions
    labels = phase_labels(viz.elastic(result.trace))
    assert labels[:4] == ["start", "training at 2 ranks", "failure", "detected"]
    assert labels[-3:] == ["rendezvous", "restore", "training at 2 ranks"]  # the node that joined
    assert "training at 1 rank" in labels
    assert crash["reason"] == "failure" and crash["checkpoint"] == "step-00000002"
    assert crash["resumed_at_step"] == 2 and crash["steps_redone"] == 2  # steps 2 and 3 ran twice
    assert join["reason"] == "scale-out" and join["world_size"] == 2
    resumed = join["resumed_at_step"]
    assert 2 < resumed < STEPS, f"the join resumed at step {resumed}: it trained nothing, nothing checks it"
    assert result.summary["generations"][-1]["checkpoint_world_size"] == 1  # one rank's shards, read by two
    assert result.summary["world_sizes"] == [2, 2] + [1] * (resumed - 2) + [2] * (STEPS - resumed)
    assert result.summary["join"] == {"after_step": 3, "joined_at_step": resumed}
    assert f"joined, its world resumed at step {resumed}" in result.describe()
    assert_exact_history(result, reference)


def test_a_join_that_never_came_is_said():
    """A node asked to join can miss a short run (its workers import torch afresh, then meet the others
    at a rendezvous): the summary says so rather than nothing; a failure's restart is not a join."""
    from paralab.elastic.history import joined

    cfg = ElasticConfig(nodes=1, min_nodes=1, max_nodes=2, steps=8, join_after_step=3)
    restart = {"reason": "failure", "resumed_at_step": 2}
    assert joined(cfg, [restart]) == {"after_step": 3, "joined_at_step": None}
    assert joined(cfg, [restart, {"reason": "scale-out", "resumed_at_step": 5}])["joined_at_step"] == 5
    assert joined(dataclasses.replace(cfg, join_after_step=None), []) is None


@pytest.mark.timeout(240)
def test_balancing_a_3x_slower_rank_keeps_single_device_losses(reference, capsys, tmp_path):
    with nothing_left_behind():
        code = cli.main(["elastic", "--nnodes", "2:2", "--steps", "5", "--global-batch", str(BATCH),
                         "--slow", "rank=1,factor=3",
                         "--balance", "--json", "--run-timeout", "170", "--trace",
                         str(tmp_path / "balanced.json")])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert_close_rel(summary["losses"], reference[:5], what="losses")
    shares = summary["samples_per_rank"]
    assert shares[0] == [6, 6] and all(sum(s) == BATCH for s in shares)
    assert sum(s[1] for s in shares[1:]) < sum(s[0] for s in shares[1:]), (
        "the slow rank was not given less work")
    for step, ids in enumerate(summary["sample_ids"]):
        assert sorted(ids) == sorted(expected_ids(step))
    # every cut is the balancer's rule applied to the compute seconds measured in the steps before it
    trace = paralab.Trace.load(tmp_path / "balanced.json")
    replay = Balancer(2, enabled=True)
    for record in (r for r in trace.meta["step_records"] if r["final"]):
        ids = expected_ids(record["step"])
        assert record["samples"] == [len(replay.shard(ids, rank)) for rank in range(2)]
        replay.update(record["samples"], record["compute_s"])
    # the figure: each rank's batch share per step, beside its share of the throughput
    fig = viz.elastic_balance(trace)
    meta = fig.layout.meta
    assert meta["steps"] == list(range(5)) and meta["share"] == [[n / BATCH for n in s] for s in shares]
    assert meta["share"][0] == [0.5, 0.5]
    # the dashed throughput share is each rank's samples per compute second (the bars) over the sum
    compute_ms = [list(t.y) for t in fig.data if t.type == "bar"]
    for step, (share, throughput) in enumerate(zip(meta["share"], meta["throughput_share"])):
        rates = [share[rank] / compute_ms[rank][step] for rank in range(len(share))]
        assert throughput == pytest.approx([rate / sum(rates) for rate in rates])


# ---------------------------------------------------------------------------- from outside
LAUNCH = "import json; from paralab import elastic; print(json.dumps(elastic.run(**{options!r}).summary))"


def start_launcher(tmp: Path, tag: str, **options) -> subprocess.Popen:
    """An elastic launcher in a Python of its own, with TMPDIR ``tmp``; it prints the summary."""
    tmp.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", LAUNCH.format(options={**QUICK, **options})],
                            env={**os.environ, TAG: tag, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
                            text=True)


def agent_of_node(launcher: subprocess.Popen, tag: str, node: int) -> psutil.Process:
    (agent,) = [p for p in tagged_processes(tag)
                if p.ppid() == launcher.pid and p.environ().get("PARALAB_NODE") == str(node)]
    return agent


def progress(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "progress.json").read_text())
    except (FileNotFoundError, ValueError):
        return {"step": -1, "generation": None}


def finish(launcher: subprocess.Popen) -> dict:
    out, _ = launcher.communicate(timeout=200)
    assert launcher.returncode == 0, f"the launcher failed (exit {launcher.returncode})"
    return json.loads(out)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_agents_workers_and_checkpoints_listen_on_loopback_and_go_with_their_launcher(tmp_path, sig):
    tag = f"elastic-launcher-{os.getpid()}-{time.time_ns()}"
    tmp = tmp_path / "tmp"
    launcher = start_launcher(tmp, tag, nodes=2, min_nodes=1, max_nodes=2, steps=100000, checkpoint_every=1)
    try:
        saved = wait_for(lambda: any(tmp.glob("paralab-elastic-*/checkpoints/step-*")), 150)
        addresses = listening_addresses(tagged_processes(tag))
    finally:
        launcher.send_signal(sig)
        launcher.wait(timeout=30)
    assert saved, "the run never saved a checkpoint"
    assert addresses, "the stores and gloo sockets were not seen"
    assert not beyond_loopback(addresses), f"listening beyond loopback: {sorted(addresses)}"
    assert_nothing_left(tag, tmp)


@pytest.mark.timeout(240)
def test_a_node_lost_after_the_last_step_does_not_fail_a_finished_run(tmp_path, reference):
    """Node 1's agent is frozen early (its worker trains on), then killed once every step is done: the
    other agent waits for it at torchrun's exit barrier, which would time out after minutes."""
    tag = f"elastic-late-loss-{os.getpid()}-{time.time_ns()}"
    run_dir = tmp_path / "run"
    launcher = start_launcher(tmp_path / "tmp", tag, nodes=2, min_nodes=1, max_nodes=2, steps=STEPS,
                              run_dir=str(run_dir), run_timeout_s=150, slow={"rank": 0, "factor": 10})
    try:
        assert wait_for(lambda: progress(run_dir)["step"] >= 1, 150), "training never started"
        frozen = agent_of_node(launcher, tag, 1)
        frozen.suspend()
        assert wait_for(lambda: any(run_dir.glob("gen-*/done.json")), 150), "training never finished"
        frozen.kill()
        summary = finish(launcher)
    finally:
        launcher.kill()
    assert summary["restarts"] == 0 and summary["world_sizes"] == [2] * STEPS
    assert_close_rel(summary["losses"], reference, what="losses")


@pytest.mark.timeout(300)
def test_a_second_failure_from_outside_is_a_failure_with_a_detection_time(tmp_path, reference):
    """The injected failure takes node 2 at step 2; then node 1 is SIGKILLed from outside (agent and,
    by its parent-death signal, its worker): both transitions are failures, each with its detection."""
    tag = f"elastic-outside-{os.getpid()}-{time.time_ns()}"
    run_dir = tmp_path / "run"
    launcher = start_launcher(tmp_path / "tmp", tag, nodes=3, min_nodes=1, max_nodes=3, steps=STEPS,
                              run_dir=str(run_dir), fault={"rank": 2, "step": 2},
                              slow={"rank": 0, "factor": 10}, last_call_s=4)
    try:
        second_world_at_step_4 = ("gen-001", True)
        assert wait_for(lambda: (progress(run_dir)["generation"], progress(run_dir)["step"] >= 4)
                        == second_world_at_step_4, 200), "the second world never reached step 4"
        agent_of_node(launcher, tag, 1).kill()
        summary = finish(launcher)
    finally:
        launcher.kill()
    injected, outside = summary["transitions"]
    first_world = summary["generations"][0]["nodes"]  # node ids as the workers recorded them, by rank
    assert (injected["reason"], injected["cause"]) == ("failure", "injected")
    assert injected["failed_node"] == first_world[2]
    node_1 = type(first_world[0])(1)
    assert (outside["reason"], outside["cause"], outside["failed_node"]) == ("failure", "node lost", node_1)
    assert (outside["world_size_before"], outside["world_size"]) == (2, 1)
    assert injected["detection_s"] >= 0 and outside["detection_s"] >= 0
    assert_close_rel(summary["losses"], reference, what="losses")
    assert [ids for ids in summary["sample_ids"]] and all(
        sorted(ids) == sorted(expected_ids(step)) for step, ids in enumerate(summary["sample_ids"]))


def test_a_standby_node_that_died_waiting_is_named_not_a_broken_pipe(tmp_path):
    """The join is written to the standby agent's stdin; one that died while waiting had raised a bare
    BrokenPipeError out of the launcher."""
    class Running:
        def poll(self):
            return None

    class DeadStandby:
        class stdin:  # noqa: N801 - stands in for a pipe whose reader has gone
            @staticmethod
            def write(text):
                raise BrokenPipeError(32, "Broken pipe")

        def wait(self):
            return 1

    (tmp_path / "progress.json").write_text(json.dumps({"step": 3}))
    (tmp_path / "agent2.log").write_text("ModuleNotFoundError: no module named 'x'\n")
    cfg = ElasticConfig(nodes=1, min_nodes=1, max_nodes=2, steps=8, join_after_step=3)
    died = r"(?s)the standby node died \(exit 1\) before step 3 released it.*ModuleNotFoundError"
    with pytest.raises(launch_module.ElasticError, match=died):
        launch_module._watch(cfg, tmp_path, [Running()], DeadStandby(), None)


def test_a_node_lost_below_min_ends_the_run_at_once_naming_the_node_and_min(tmp_path):
    """With --nnodes 2:2 a lost node leaves one, which waits in the rendezvous for a second that
    never comes: the launcher had waited its whole --timeout (600 s) without a word."""
    class Running:
        returncode = None

        def poll(self):
            return None

    class Killed:
        returncode = -signal.SIGKILL

        def poll(self):
            return self.returncode

    (tmp_path / "progress.json").write_text(json.dumps({"step": 38}))
    # a deadline short enough that a watch that waited it out fails fast, with another message
    cfg = ElasticConfig(nodes=2, min_nodes=2, max_nodes=2, steps=100, run_timeout_s=30)
    lost = (r"lost node 1 \(signal 9, SIGKILL\): 1 node left, fewer than MIN 2 of --nnodes 2:2, so the "
            r"run cannot go on; a lower MIN rides out the loss \(last step 38\)")
    with pytest.raises(launch_module.ElasticError, match=lost):
        launch_module._watch(cfg, tmp_path, [Running(), Killed()], None, None)
    # as many as MIN left: the run goes on (its rendezvous re-forms), until its own deadline here
    cfg = dataclasses.replace(cfg, min_nodes=1, max_nodes=3, nodes=3, run_timeout_s=0.3)
    with pytest.raises(launch_module.ElasticError, match="did not finish within 0.3 s"):
        launch_module._watch(cfg, tmp_path, [Running(), Killed(), Running()], None, None)


def test_a_balanced_runs_text_says_how_each_step_was_split():
    """--balance's re-split had been in --json alone (samples_per_rank): the text now says it too."""
    from types import SimpleNamespace

    summary = {"model": "tiny", "steps": 3, "first_step": 0, "global_batch": 12, "world_sizes": [2, 2, 2],
               "losses": [4.8, 4.7, 4.6], "transitions": [], "join": None, "step_time_s": 0.02,
               "trace": None, "balance": True, "samples_per_rank": [[6, 6], [9, 3], [9, 3]]}
    lines = elastic.ElasticResult.describe(SimpleNamespace(summary=summary)).splitlines()
    assert "samples per rank, step by step (split by measured throughput): 6/6 9/3 9/3" in lines
    unbalanced = elastic.ElasticResult.describe(SimpleNamespace(summary={**summary, "balance": False}))
    assert "samples per rank" not in unbalanced
