"""The launcher: errors before any process, failing and hung ranks, interrupts, nothing left behind."""

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


def test_more_ranks_than_cores_warns(monkeypatch, no_leftover_ranks):
    monkeypatch.setattr(launch_module, "usable_cores", lambda: 1)
    with pytest.warns(RuntimeWarning, match="exceeds the 1 usable CPU cores"):
        paralab.run("dp", 2, steps=1, global_batch=4)


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
    paralab.run("ddp", 2, steps=100000, global_batch=8, timeout_s=4, **{options})
except paralab.RunError as exc:
    print(json.dumps({{"rank": exc.rank, "error": str(exc), "traceback": exc.remote_traceback}}))
"""


def run_to_blame(options: str, signal: str = "SIGKILL") -> dict:
    done = subprocess.run([sys.executable, "-c", BLAME.format(options=options, signal=signal)],
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


@pytest.mark.timeout(150)
def test_a_hung_rank_is_named_as_stopped_answering_with_its_python_stack():
    failure = run_to_blame("{'fault': {'rank': 1, 'step': 1, 'kind': 'hang'}}")
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
