"""The launcher: errors before any process, failing and hung ranks, interrupts, nothing left behind."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import paralab
from paralab.runtime import launch as launch_module
from tests.conftest import (
    TAG,
    assert_nothing_left,
    beyond_loopback,
    listening_addresses,
    tagged_processes,
    wait_for,
)


@pytest.fixture
def no_process_may_start(monkeypatch):
    def refuse():
        raise AssertionError("a process was about to start")

    monkeypatch.setattr(launch_module, "_context", refuse)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(strategy="ddp", world_size=0), "world size must be"),
        (dict(strategy="ddp", world_size=3, global_batch=8), "not divisible by the 3 data-parallel ranks"),
        # a world beyond any cluster, refused at once: a hybrid refusal of 10**9 + 7 ranks had listed the
        # layouts that fit by walking every number up to it, for minutes
        (dict(strategy="hybrid", world_size=10**9 + 7, tp=2), "world size must be <= 16,777,216"),
        (dict(strategy="hybrid", world_size=2**24 - 3, tp=2),  # prime: no layout of tp=2 fits it
         r"dp x tp x pp that fit 16777213 ranks: 1x1x16777213, 1x16777213x1, 16777213x1x1$"),
        # the batches offered are ones the corpus holds (each had been refused in turn)
        (dict(strategy="ddp", world_size=10**5), "at least 100,000 sequences, more than the corpus holds"),
        # a model whose weights and gradients alone outgrow the machine (a rank had failed allocating 256 TB)
        (dict(strategy="ddp", world_size=1, model={"vocab": 10**12}),
         r"the model's 129,000,000,202,112 parameters need at least 961,124.9 GiB .* use a smaller model"),
        # a stage split that is no list: a number had raised TypeError, a string been read char by char
        (dict(strategy="pp", world_size=2, stage_layers=5), "stage_layers must be a list of layer counts"),
        (dict(strategy="pp", world_size=2, stage_layers="2,2"), "one per stage, got '2,2'"),
        (dict(strategy="ddp", world_size=1, model_name="tiny"), "model_name is model's to say"),
        # a model field of the wrong kind, said as its own (None had leaked "unsupported operand" from
        # the ffn's default, or trained a dense model for experts=None; "0.1" read as the number)
        (dict(strategy="ddp", world_size=1, model={"hidden": None}), "model hidden must be a whole number"),
        (dict(strategy="ddp", world_size=1, model={"experts": None}), "model experts must be a whole number"),
        (dict(strategy="ddp", world_size=1, model={"dropout": "0.1"}), r"dropout must be in .*, got '0.1'"),
        # a dense model's routing options change nothing (the command line had refused them; from Python
        # they had run, ignored)
        (dict(strategy="ddp", world_size=1, model={"top_k": 2}), "top_k=2 has no effect: the model is dense"),
        (dict(strategy="ddp", world_size=1, model={"capacity_factor": 1.5, "shared_expert": True}),
         "capacity_factor=1.5 has no effect"),
        (dict(strategy="ddp", world_size=2**14 + 1, global_batch=8),
         r"global batches that fit: \[16385, 32770, 49155\]$"),
        (dict(strategy="nope", world_size=1), "unknown strategy"),
        (dict(strategy="ddp", world_size=1, model="huge"), "unknown model preset"),
        (dict(strategy="ddp", world_size=1, model={"hidden": 30, "heads": 4}), "not divisible by heads"),
        (dict(strategy="ddp", world_size=2, device="cuda", model="tiny"), "cuda"),
        (dict(strategy="single", world_size=2), "one rank"),
    ],
)
def test_bad_configs_fail_before_any_process(no_process_may_start, kwargs, message):
    if kwargs.get("device") == "cuda" and paralab.config.cuda_device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    with pytest.raises(paralab.ConfigError, match=message):
        paralab.run(**kwargs)


def test_outputs_and_progress_are_checked_before_any_process(no_process_may_start, tmp_path):
    """What paralab.run writes and calls is checked as ``paralab run`` checks it: a profile_dir that is
    a file had been found by every rank once it had started (a RunError after seconds), a progress that
    is no function by the launcher's watch once the ranks ran, and trace_path and profile_dir naming
    one path not at all."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("")
    for options, message in [
        (dict(profile_dir=str(a_file)), "profile_dir .*notes.txt exists and is not a directory"),
        (dict(progress=3), r"progress must be a function of \(step, steps\), got 3"),
        (dict(trace_path=str(tmp_path / "out"), profile_dir=str(tmp_path / "out")),
         "trace_path and profile_dir both name"),
    ]:
        with pytest.raises(paralab.ConfigError, match=message):
            paralab.run("single", 1, steps=1, **options)


def test_a_raising_rank_is_named_promptly(no_leftover_ranks):
    with pytest.raises(paralab.RunError) as info:
        paralab.run("ddp", 3, steps=5, global_batch=12, fault={"rank": 2, "step": 2})
    assert info.value.rank == 2
    assert "fault injected on rank 2 at step 2" in str(info.value)
    assert "Traceback" in info.value.remote_traceback


@pytest.mark.timeout(90)
def test_a_hung_collective_ends_in_a_clear_timeout(no_leftover_ranks):
    with pytest.raises(paralab.RunError, match="timed out after 4 s"):
        paralab.run("ddp", 2, steps=3, global_batch=8, timeout_s=4,
                    fault={"rank": 1, "step": 1, "kind": "hang"})


def test_more_ranks_than_cores_warns_naming_the_callers_line(monkeypatch, no_leftover_ranks):
    """It had named a line of paralab/__init__.py, where paralab.run calls the launcher."""
    monkeypatch.setattr(launch_module, "usable_cores", lambda: 1)
    with pytest.warns(RuntimeWarning, match="exceeds the 1 usable CPU cores") as caught:
        paralab.run("dp", 2, steps=1, global_batch=4)
    assert caught[0].filename == __file__


@pytest.mark.timeout(120)
def test_a_janitor_killed_from_outside_fails_no_run_and_leaves_no_run_directory(monkeypatch, tmp_path,
                                                                                 no_leftover_ranks):
    """The run had trained, then raised BrokenPipeError telling the janitor it was done: exit 1, no
    summary, its run directory left behind."""
    import tempfile

    from paralab.runtime.janitor import Janitor

    class KilledAtOnce(Janitor):
        def __init__(self):
            super().__init__()
            self.proc.kill()
            self.proc.wait()

    monkeypatch.setattr(launch_module, "Janitor", KilledAtOnce)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run = paralab.run("dp", 2, steps=1, global_batch=4)
    assert len(run.losses) == 1
    assert not list(tmp_path.glob("paralab-run-*"))


@pytest.mark.timeout(120)
def test_keyboard_interrupt_leaves_no_rank_behind():
    tag = f"interrupt-{os.getpid()}-{time.time()}"
    script = "import paralab; paralab.run('ddp', 2, steps=100000, global_batch=8)"
    parent = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, TAG: tag})
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(tagged_processes(tag)) < 4:  # parent, forkserver, 2 ranks
            time.sleep(0.2)
        assert len(tagged_processes(tag)) >= 4, "the ranks never started"
        time.sleep(1.0)
        parent.send_signal(signal.SIGINT)
        parent.wait(timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
    deadline = time.time() + 10
    while time.time() < deadline and tagged_processes(tag):
        time.sleep(0.2)
    assert not tagged_processes(tag), "processes outlived the interrupted run"


OUTLIVED_S = 0.5  # how long after its script a process of the run may still be seen


@pytest.mark.timeout(120)
def test_no_process_of_a_run_outlives_the_script_that_ran_it(tmp_path):
    """The forkserver that started the ranks (torch loaded) had run on for a second or more after the
    script returned, left to notice its parent's end; the script stops it at exit and waits. (Output
    to a file: a pipe would be held open by the forkserver, and reading it to its end would wait.)"""
    tag = f"exit-{os.getpid()}-{time.time()}"
    script = "import paralab; print(len(paralab.run('dp', 2, steps=1, global_batch=4).losses))"
    with open(tmp_path / "out.txt", "w") as out:
        done = subprocess.run([sys.executable, "-c", script], env={**os.environ, TAG: tag}, stdout=out,
                              stderr=subprocess.STDOUT, timeout=100)
    said = (tmp_path / "out.txt").read_text()
    assert done.returncode == 0 and said.strip().endswith("1"), said[-2000:]
    # the forkserver had run on for a second or more: half of one is allowed for a process the kernel is
    # still tearing down on a loaded machine (CI once saw one "running" at once, unnamed)
    if not wait_for(lambda: not tagged_processes(tag), OUTLIVED_S, poll_s=0.05):
        left = [(p.pid, " ".join(p.cmdline())[:200]) for p in tagged_processes(tag)]
        pytest.fail(f"processes outlived the script by {OUTLIVED_S} s: {left}")


FORKS_AFTER_A_RUN = """
import multiprocessing as mp, time, paralab
paralab.run('dp', 2, steps=1, global_batch=4)
mp.get_context('fork').Process(target=time.sleep, args=(1e9,), daemon=True).start()
print('ending')
"""


@pytest.mark.timeout(120)
def test_a_child_forked_after_a_run_does_not_hang_the_exit(tmp_path):
    """A child forked after the forkserver started holds the forkserver's pipe open: a stop at exit that
    waited for the pipe's end had hung the script forever (the daemon child it would then have ended
    is ended after the stop). The stop signals the forkserver, and its wait is bounded."""
    tag = f"fork-{os.getpid()}-{time.time()}"
    with open(tmp_path / "out.txt", "w") as out:
        done = subprocess.run([sys.executable, "-c", FORKS_AFTER_A_RUN], env={**os.environ, TAG: tag},
                              stdout=out, stderr=subprocess.STDOUT, timeout=90)
    assert done.returncode == 0 and "ending" in (tmp_path / "out.txt").read_text()
    assert wait_for(lambda: not tagged_processes(tag), 10.0), "processes outlived the script"


SURVIVES_AN_INTERRUPT = """
import signal, paralab
def interrupt(*_):
    raise KeyboardInterrupt
signal.signal(signal.SIGALRM, interrupt)
signal.alarm(3)
try:
    paralab.run('ddp', 2, steps=100000, global_batch=8)
except KeyboardInterrupt:
    pass
print(len(paralab.run('ddp', 2, steps=2, global_batch=8).losses))
"""


@pytest.mark.timeout(120)
def test_a_process_that_survives_an_interrupt_runs_again():
    """As a Jupyter kernel does after its Interrupt button: the interrupted run's janitor kills its
    ranks but keeps the forkserver's directory while the process lives, so the next run starts."""
    done = subprocess.run([sys.executable, "-c", SURVIVES_AN_INTERRUPT], capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 0 and done.stdout.split() == ["2"], done.stderr[-2000:]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["piped", "file", "module"])
def test_a_script_runs_without_a_main_guard_however_python_got_it(tmp_path, how):
    """Ranks never re-run the main module: a script piped in ('<stdin>'), a file and `python -m`
    module, none with `if __name__ == '__main__':`, each start their ranks once."""
    script = "import paralab\nprint(len(paralab.run('ddp', 2, steps=1, global_batch=4).losses))\n"
    (tmp_path / "unguarded.py").write_text(script)
    argv = {"piped": ["-"], "file": [str(tmp_path / "unguarded.py")], "module": ["-m", "unguarded"]}[how]
    done = subprocess.run([sys.executable, *argv], input=script if how == "piped" else None,
                          capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1"


# ---------------------------------------------------------------------------- the parent dies
LONG_RUN = "import paralab; paralab.run('ddp', 2, steps=100000, global_batch=8, timeout_s=600{fault})"


def start_parent(script: str, tmp_path, tag: str, **popen) -> subprocess.Popen:
    """A launcher in a Python of its own, with a private TMPDIR, once its 2 ranks are at step 1."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    parent = subprocess.Popen([sys.executable, "-c", script],
                              env={**os.environ, TAG: tag, "TMPDIR": str(tmp)}, **popen)

    def ranks_at_step_1():
        beats = [b.read_text() for b in tmp.glob("paralab-run-*/rank*.beat")]
        return len(beats) == 2 and all(b and int(b) >= 1 for b in beats)

    if not wait_for(ranks_at_step_1, 90):
        parent.kill()
        pytest.fail("the ranks never reached step 1")
    return parent


HANG = ", fault={'rank': 1, 'step': 1, 'kind': 'hang'}"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig, fault", [(signal.SIGKILL, ""), (signal.SIGTERM, HANG)],
                         ids=["SIGKILL", "SIGTERM-hung-rank"])
def test_a_killed_parent_takes_its_ranks_and_temporary_dirs_with_it(tmp_path, sig, fault):
    """As a kernel restart, an out-of-memory kill or a closed terminal would: the parent gets no say."""
    tag = f"killed-parent-{os.getpid()}-{time.time_ns()}"
    parent = start_parent(LONG_RUN.format(fault=fault), tmp_path, tag)
    assert len(tagged_processes(tag)) >= 4, "expected the parent, its janitor, the forkserver and 2 ranks"
    parent.send_signal(sig)
    parent.wait(timeout=30)
    assert_nothing_left(tag, tmp_path / "tmp")


@pytest.mark.timeout(150)
def test_ctrl_c_again_and_again_during_clean_up_still_cleans_up(tmp_path):
    tag = f"ctrl-c-{os.getpid()}-{time.time_ns()}"
    parent = start_parent(LONG_RUN.format(fault=""), tmp_path, tag)
    for _ in range(6):  # the first interrupts the run, the others land somewhere in its clean-up
        parent.send_signal(signal.SIGINT)
        time.sleep(0.03)
    parent.wait(timeout=60)
    assert_nothing_left(tag, tmp_path / "tmp")


@pytest.mark.timeout(150)
def test_ctrl_c_on_paralab_run_says_interrupted_and_exits_130(tmp_path):
    """The command line reports an interrupt in one line, as a shell reports SIGINT (128 + 2), where it
    had printed the launcher's traceback (its poll loop's sleep), and every rank still goes."""
    tag = f"ctrl-c-cli-{os.getpid()}-{time.time_ns()}"
    err = tmp_path / "stderr"
    script = (f"import sys; from paralab import cli; sys.stderr = open({str(err)!r}, 'w', buffering=1); "
              "sys.exit(cli.main(['run', '--world-size', '2', '--steps', '100000', '--global-batch', '8']))")
    parent = start_parent(script, tmp_path, tag)
    parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=60) == 130
    said = err.read_text()
    assert said.strip().splitlines()[-1] == "paralab: interrupted" and "Traceback" not in said, said
    assert_nothing_left(tag, tmp_path / "tmp")


def ignores_sigint(pid: int) -> bool:
    """Whether a process ignores SIGINT: its bit in the kernel's mask of ignored signals."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(mask >> (signal.SIGINT - 1) & 1)


@pytest.mark.timeout(150)
def test_ctrl_c_in_a_terminal_says_one_line_from_every_process(tmp_path):
    """A terminal's Ctrl-C reaches the whole foreground process group, the ranks too: they leave the
    stopping to their launcher, where a rank had printed a KeyboardInterrupt traceback of its own
    (from wherever the signal found it) before the launcher's one line."""
    tag = f"ctrl-c-group-{os.getpid()}-{time.time_ns()}"
    err = tmp_path / "stderr"
    script = "import sys; from paralab import cli; sys.exit(cli.main(['run', '--world-size', '2', " \
             "'--steps', '100000', '--global-batch', '8']))"
    with open(err, "w") as stderr:  # the ranks write to the launcher's stderr, as to a terminal
        parent = start_parent(script, tmp_path, tag, stderr=stderr, start_new_session=True)
        group = [p for p in tagged_processes(tag) if p.pid != parent.pid and os.getpgid(p.pid) == parent.pid]
        assert len(group) >= 3 and all(ignores_sigint(p.pid) for p in group), "the forkserver and the ranks"
        os.killpg(parent.pid, signal.SIGINT)
        assert parent.wait(timeout=60) == 130
    said = err.read_text()
    assert said.strip().splitlines() == ["paralab: interrupted"], said
    assert_nothing_left(tag, tmp_path / "tmp")


@pytest.mark.timeout(150)
def test_a_local_run_listens_on_loopback_only(tmp_path):
    tag = f"listen-{os.getpid()}-{time.time_ns()}"
    parent = start_parent(LONG_RUN.format(fault=""), tmp_path, tag)
    try:
        addresses = listening_addresses(tagged_processes(tag))
    finally:
        parent.kill()
        parent.wait(timeout=30)
    assert addresses, "the ranks' gloo sockets were not seen"
    assert not beyond_loopback(addresses), f"listening beyond loopback: {sorted(addresses)}"
    assert_nothing_left(tag, tmp_path / "tmp")


# ---------------------------------------------------------------------------- the right rank blamed
BLAME = """
import json, multiprocessing, os, signal, paralab

def kill_rank_1(step, steps):
    rank1 = [p for p in multiprocessing.active_children() if p.name == "paralab-rank1"]
    if step >= 2 and rank1:
        os.kill(rank1[0].pid, signal.{signal})

try:
    paralab.run({strategy!r}, 2, steps=100000, global_batch=8, timeout_s=4, **{options})
except paralab.RunError as exc:
    print(json.dumps({{"rank": exc.rank, "error": str(exc), "traceback": exc.remote_traceback}}))
"""


def run_to_blame(options: str, signal: str = "SIGKILL", strategy: str = "ddp") -> dict:
    script = BLAME.format(options=options, signal=signal, strategy=strategy)
    done = subprocess.run([sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip(), done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSEGV"])
def test_a_rank_killed_from_outside_is_named_with_its_signal_not_its_peer(sig):
    """A segmentation fault (native code gone wrong) also leaves the rank's Python stack as it died."""
    failure = run_to_blame("{'progress': kill_rank_1}", sig)
    assert failure["rank"] == 1, failure["error"]
    number = {"SIGKILL": 9, "SIGSEGV": 11}[sig]
    assert f"rank 1 failed: died (signal {number}, {sig})" in failure["error"]
    if sig == "SIGSEGV":
        assert "Python stack of rank 1 as it died" in failure["traceback"], failure["traceback"]
        assert "Segmentation fault" in failure["traceback"]


def test_groups_made_after_the_world_time_out_as_it_does_on_gloo_and_nccl(monkeypatch):
    """torch gives a group made without a timeout its default (NCCL one of its own where NCCL is built),
    not the world's: both defaults are the run's timeout once a rank session starts."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from paralab.runtime.worker import groups_time_out_as_the_world

    monkeypatch.setattr(distributed_c10d, "default_pg_timeout", timedelta(minutes=30))
    monkeypatch.setattr(distributed_c10d, "default_pg_nccl_timeout", timedelta(minutes=10))  # a CUDA build's
    groups_time_out_as_the_world(7.0)
    seven = timedelta(seconds=7)
    # what torch's new_group reads for a group made without a timeout, on each backend
    assert distributed_c10d._get_default_timeout(dist.Backend.GLOO) == seven
    assert distributed_c10d._get_default_timeout(dist.Backend.NCCL) == seven


@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy, options", [("ddp", ""), ("pp", "'microbatches': 2, ")])
def test_a_hung_rank_is_named_as_stopped_answering_with_its_python_stack(strategy, options):
    """Also where the ranks wait in groups made after the world (a pipeline's pairs, a DeviceMesh's):
    those had waited out torch's 30-minute default, not the run's timeout, and no rank was named."""
    hang = f"{{{options}'fault': {{'rank': 1, 'step': 1, 'kind': 'hang'}}}}"
    failure = run_to_blame(hang, strategy=strategy)
    assert failure["rank"] == 1, failure["error"]
    assert "rank 1 failed: stopped answering" in failure["error"]
    assert "rank 0 reported: a collective timed out after 4 s" in failure["error"]
    assert "in check_fault" in failure["traceback"], failure["traceback"]  # where rank 1 sleeps


@pytest.mark.timeout(120)
def test_a_torchrun_job_past_its_timeout_leaves_no_rank_behind(tmp_path):
    """torchrun starts each rank in a session of its own: stopping torchrun's group alone had left the
    ranks of a job that ran past its timeout running."""
    import psutil

    from paralab.runtime.result import RunError
    from paralab.runtime.torchrun import run_torchrun

    job = tmp_path / "sleepy.py"
    job.write_text("import os, sys, time\n"
                   "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(str(os.getpid()))\n"
                   "time.sleep(600)\n")
    with pytest.raises(RunError, match="did not finish within 8 s"):
        run_torchrun(job, tmp_path, nproc=2, timeout_s=8)
    pids = [int((tmp_path / rank).read_text()) for rank in ("0", "1")]
    assert not [pid for pid in pids if psutil.pid_exists(pid)]



@pytest.mark.timeout(120)
def test_a_torchrun_job_listens_on_loopback_only_and_dies_with_a_launcher_killed_outright(tmp_path):
    """A caller SIGKILLed (a restarted Jupyter kernel) cannot stop torchrun: torchrun must die with it,
    and each rank (in a session of its own) with torchrun; its temporary files go too. While it runs,
    the rendezvous, the ranks' store and gloo listen on loopback only."""
    import psutil

    job = tmp_path / "sleepy.py"
    job.write_text("import os, sys, time\nimport torch.distributed as dist\n"
                   "dist.init_process_group('gloo')\ndist.barrier()\n"
                   "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(str(os.getpid()))\n"
                   "time.sleep(600)\n")
    caller = subprocess.Popen([sys.executable, "-c", "import sys; from paralab.runtime.torchrun import "
                               f"run_torchrun; run_torchrun({str(job)!r}, {str(tmp_path)!r}, timeout_s=100)"],
                              env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        pid_files = [tmp_path / rank for rank in ("0", "1")]
        assert wait_for(lambda: all(f.exists() and f.read_text() for f in pid_files), 60), "the job never ran"
        ranks = [psutil.Process(int(f.read_text())) for f in pid_files]
        torchrun = ranks[0].parent()
        addresses = listening_addresses([psutil.Process(caller.pid), torchrun, *ranks])
    finally:
        caller.kill()
        caller.wait()
    _, alive = psutil.wait_procs([*ranks, torchrun], timeout=20)
    for proc in alive:  # so that a failure here leaves nothing behind either
        proc.kill()
    assert not alive, f"outlived their launcher: {alive}"
    assert wait_for(lambda: not list(tmp_path.glob("paralab-torchrun-*")), 10), "temporary files stay"
    assert addresses and not beyond_loopback(addresses), f"listening beyond loopback: {sorted(addresses)}"


def test_a_torchrun_script_that_is_not_there_is_refused_naming_it(tmp_path):
    from paralab.config import ConfigError
    from paralab.runtime.torchrun import run_torchrun

    with pytest.raises(ConfigError, match="no script at .*nope.py"):
        run_torchrun(tmp_path / "nope.py")


def test_a_rank_s_own_timeout_is_the_cause_not_a_peer_s_failure_seen_from_it():
    """A TimeoutError of the rank's own (reading a shard) is not a collective timing out, whatever its
    words: it is blamed, and said as it was, and the peer that lost it is the consequence."""
    from paralab.runtime.failures import blame
    from paralab.runtime.worker import describe, from_the_wire

    own = TimeoutError("reading shard timed out")
    wire = RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    assert describe(own, 5) == "TimeoutError: reading shard timed out" and not from_the_wire(own)
    reports = [{"rank": 0, "error": describe(wire, 5), "from_the_wire": from_the_wire(wire), "traceback": ""},
               {"rank": 1, "error": describe(own, 5), "from_the_wire": from_the_wire(own), "traceback": "t"}]
    failure = blame(reports, {}, [])
    assert failure.rank == 1 and "reading shard timed out" in str(failure)


@pytest.mark.timeout(60)
def test_processes_waited_together_end_at_the_first_failure_wherever_it_is_in_the_list():
    """A process later in the list that fails ends the wait while an earlier one still runs (its
    peers could only wait for it); all ending well, or the deadline, end it too."""
    from paralab.runtime.processes import wait_together

    def start(code: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", code])

    procs = [start("import time; time.sleep(30)"), start("import time; time.sleep(0.3); raise SystemExit(3)")]
    try:
        waited = wait_together(procs, timeout_s=25)
        assert waited.first_failed == [1] and waited.running == [0] and not waited.timed_out
        assert waited.codes[1] == 3
        assert wait_together(procs[:1], timeout_s=0.2).timed_out
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    done = [start("pass"), start("pass")]
    waited = wait_together(done, timeout_s=25)
    assert waited.codes == [0, 0] and not waited.first_failed and not waited.timed_out


# ---------------------------------------------------------------------------- watchdog and agents
def test_a_run_hangs_only_when_no_rank_made_progress_for_longer_than_its_timeout_allows():
    """The watchdog of local runs and of `paralab nodes` (which had stopped healthy runs after a fixed
    600 s): a long run is never cut short while steps go on; before the first step it also allows
    for the ranks' start."""
    from paralab.runtime.processes import HANG_MARGIN_S, STARTUP_GRACE_S, ProgressWatch

    watch = ProgressWatch(timeout_s=10, started=0.0, last_progress=0.0)
    limit = 10 + HANG_MARGIN_S
    assert "the run hung before its first step, or one step takes longer" in watch.message(now=40.0)
    assert not watch.hung(now=limit + STARTUP_GRACE_S - 1) and watch.hung(now=limit + STARTUP_GRACE_S + 1)
    for step in range(1000):  # a healthy run of a thousand steps, ten seconds each
        assert watch.saw(step, now=1000.0 + 10 * step) and not watch.hung(now=1005.0 + 10 * step)
    assert not watch.saw(999, now=50_000.0)  # the same step again is no progress
    assert watch.hung(now=10_990.0 + limit + 1)
    assert watch.message(now=10_990.0 + 50).startswith("no rank made progress for 50 s (timeout 10 s): "
                                                       "the run hung at step 999, or one step takes longer")


@pytest.mark.timeout(60)
def test_processes_waited_together_end_when_the_watchdog_says_they_hung():
    from paralab.runtime.processes import wait_together

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    calls = []
    try:
        waited = wait_together(procs, timeout_s=None, watchdog=lambda: calls.append(1) or len(calls) > 3)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert waited.hung and waited.running == [0, 1] and not waited.timed_out and len(calls) == 4


def test_a_run_without_a_rank_says_details_not_rank_none():
    from paralab.runtime.result import RunError

    text = str(RunError(None, "the 2-node run was stopped", "(Python stack of rank 0, ...)"))
    assert "rank None" not in text and "--- details ---" in text


TORCHRUN_WORKER = ("import os, sys, time; from paralab.runtime.agents import worker_setup; worker_setup(); "
                   "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)")
# a stand-in for torchrun's agent: its worker in a session of its own, as torchrun starts it
AGENT = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], "
         "start_new_session=True).wait()")


@contextlib.contextmanager
def agent_and_worker(worker_code: str, tmp_path, **popen):
    """A stand-in agent and its worker, once the worker has started: (agent Popen, worker psutil
    Process); both are killed on the way out, whatever the test left."""
    import psutil

    pid_file = tmp_path / "worker.pid"
    agent = subprocess.Popen([sys.executable, "-c", AGENT, worker_code, str(pid_file)], **popen)
    worker = None
    try:
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60), "the worker never started"
        worker = psutil.Process(int(pid_file.read_text()))
        yield agent, worker
    finally:
        agent.kill()
        if worker is not None and worker.is_running():
            worker.kill()


@pytest.mark.timeout(90)
def test_a_worker_of_someone_elses_torchrun_dies_with_its_agent(tmp_path):
    """torchrun sets TORCHELASTIC_RUN_ID in its workers and starts each in a session of its own: an
    agent SIGKILLed had left its ranks training on, adopted by PID 1."""
    import psutil

    env = {**os.environ, "TORCHELASTIC_RUN_ID": "someone-elses"}
    env.pop("PARALAB_AGENT_PID", None)
    with agent_and_worker(TORCHRUN_WORKER, tmp_path, env=env) as (agent, worker):
        agent.kill()
        agent.wait()
        _, alive = psutil.wait_procs([worker], timeout=10)
        assert not alive, "the worker outlived its agent"


STUCK_WORKER = ("import os, signal, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
                "os.kill(os.getpid(), signal.SIGSTOP)")


@pytest.mark.timeout(90)
def test_stopping_agents_takes_their_workers_stuck_before_they_tied_their_life_to_them(tmp_path):
    """A worker stopped (or stuck importing) before agents.worker_setup, in a session of its own as
    torchrun starts it: killing its agent's process group had left it behind, adopted by PID 1."""
    import psutil

    from paralab.runtime import agents

    class Told:
        def __init__(self):
            self.pids = []

        def kill_at_end(self, pid):
            self.pids.append(pid)

    with agent_and_worker(STUCK_WORKER, tmp_path, start_new_session=True) as (agent, worker):
        assert wait_for(lambda: worker.status() == psutil.STATUS_STOPPED, 10)
        janitor = Told()
        agents.stop_agents([agent], agents.Workers(janitor))
        assert agent.returncode == -signal.SIGKILL and janitor.pids == [worker.pid]
        _, alive = psutil.wait_procs([worker], timeout=10)
        assert not alive, "the stuck worker outlived its agent"


@pytest.mark.timeout(60)
def test_an_agent_says_nothing_of_its_own_bootstrap():
    """torchrun run as a module once imported had warned "'torch.distributed.run' found in sys.modules"
    in every agent's log."""
    from paralab.runtime import agents

    done = subprocess.run(agents.command(["--help"]), capture_output=True, text=True, timeout=50,
                          env={**os.environ, agents.LAUNCHER_PID: str(os.getpid())})
    assert done.returncode == 0 and "usage: " in done.stdout
    assert "RuntimeWarning" not in done.stderr, done.stderr


# ---------------------------------------------------------------------------- process-group setup
def test_a_rank_whose_peer_never_joined_is_the_consequence_not_the_cause(monkeypatch):
    """A local rank stopped during startup leaves its peer a file store's bare "Wait timeout": that
    peer had been blamed ("rank 0 failed: RuntimeError: Wait timeout")."""
    import torch

    from paralab.config import RunConfig
    from paralab.layout import resolve_layout
    from paralab.runtime import worker
    from paralab.runtime.failures import blame

    def no_peer(*args, **kwargs):
        raise RuntimeError("Wait timeout\nException raised from wait at store.cpp:1 (most recent call first)")

    monkeypatch.setattr(worker.dist, "init_process_group", no_peer)
    cfg = RunConfig.build("tiny", strategy="ddp", world_size=2, timeout_s=4)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(worker.GroupNotFormed) as info, \
                worker.rank_session(cfg, resolve_layout(cfg), 0, 2, 0, 2, "file:///nowhere"):
            pass
    finally:
        torch.set_num_threads(threads)
    exc = info.value
    assert str(exc) == "the process group did not form: RuntimeError: Wait timeout"
    report = {"rank": 0, "error": worker.describe(exc, 4), "from_the_wire": worker.from_the_wire(exc),
              "traceback": ""}
    failure = blame([report], {}, [1])
    assert failure.rank == 1 and "stopped answering" in str(failure), str(failure)
    assert "another rank never joined" in str(failure)


@pytest.mark.timeout(60)
def test_a_torchrun_rank_whose_master_port_is_taken_says_so_in_one_line(monkeypatch, capfd):
    """A MASTER_PORT in use had printed torch's DistNetworkError: 39 lines of C++ and Python frames.
    (capfd: a torchrun rank hands faulthandler the stderr's file descriptor.)"""
    import socket

    from paralab import cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                               MASTER_PORT=str(port)).items():
            monkeypatch.setenv(key, value)
        assert cli.main(["run", "--strategy", "single", "--steps", "1", "--timeout", "5"]) == 1
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("paralab: run failed: rank 0 failed: the process group did not form: ")
    assert "EADDRINUSE" in err and f"(at 127.0.0.1:{port}, world size 1)" in err


@pytest.mark.timeout(120)
def test_a_node_left_in_the_environment_does_not_override_a_local_runs_nodes(monkeypatch,
                                                                             no_leftover_ranks):
    """GROUP_RANK (torchrun's) or PARALAB_NODE (paralab elastic's), left in a shell, had put every
    local rank on that one node: a 2-node run reported no inter-node bytes. The forkserver is
    restarted around the run, so that its ranks see this environment and later runs do not."""
    launch_module.release_forkserver()
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("PARALAB_NODE", "1")
    try:
        run = paralab.run("ddp", 2, nodes=2, steps=1, global_batch=4)
    finally:
        monkeypatch.undo()
        launch_module.release_forkserver()
    assert {info["node"] for info in run.trace.meta["ranks"].values()} == {0, 1}
    assert run.summary["comm_bytes_by_link"]["inter_node"] > 0


def _sleep_forever(ready):
    signal.signal(signal.SIGUSR1, lambda *_: None)  # a rank answers it (worker.dump_stacks)
    ready.set()
    while True:
        time.sleep(1)


@pytest.mark.timeout(60)
def test_a_stopped_rank_is_ended_by_its_sigterm_and_said_to_have_given_no_stack(monkeypatch, tmp_path):
    """A rank stopped with SIGSTOP cannot act on SIGTERM: the run had waited out 5 s more for its
    SIGKILL, and blamed it with no stack and no word of why."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    rank = spawn.Process(target=_sleep_forever, args=(ready,), daemon=True)
    rank.start()
    try:
        assert ready.wait(30)
        os.kill(rank.pid, signal.SIGSTOP)
        monkeypatch.setattr(launch_module, "STACK_WAIT_S", 0.5)
        said = launch_module._stack(rank, 1, tmp_path)
        assert said == "(rank 1 did not write its Python stack when asked: stopped, or stuck outside Python)"
        launch_module._stop([rank])
        assert rank.exitcode == -signal.SIGTERM  # woken to end, not killed after the wait
    finally:
        if rank.is_alive():
            rank.kill()
