"""The launcher: errors before any process, failing and hung ranks, interrupts, nothing left behind."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import paralab
from paralab.runtime import launch as launch_module


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
        paralab.run("ddp", 2, steps=3, global_batch=8, timeout_s=4, fault={"rank": 1, "step": 1, "kind": "hang"})


def test_more_ranks_than_cores_warns(monkeypatch, no_leftover_ranks):
    monkeypatch.setattr(launch_module, "usable_cores", lambda: 1)
    with pytest.warns(RuntimeWarning, match="exceeds the 1 usable CPU cores"):
        paralab.run("dp", 2, steps=1, global_batch=4)


def _processes_with(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["environ"]):
        try:
            if (p.info["environ"] or {}).get("PARALAB_TEST_TAG") == tag:
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.timeout(120)
def test_keyboard_interrupt_leaves_no_rank_behind():
    tag = f"interrupt-{os.getpid()}-{time.time()}"
    script = "import paralab; paralab.run('ddp', 2, steps=100000, global_batch=8)"
    parent = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PARALAB_TEST_TAG": tag})
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(_processes_with(tag)) < 4:  # parent, forkserver, 2 ranks
            time.sleep(0.2)
        assert len(_processes_with(tag)) >= 4, "the ranks never started"
        time.sleep(1.0)
        parent.send_signal(signal.SIGINT)
        parent.wait(timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
    deadline = time.time() + 10
    while time.time() < deadline and _processes_with(tag):
        time.sleep(0.2)
    assert not _processes_with(tag), "processes outlived the interrupted run"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["piped", "file", "module"])
def test_a_script_runs_without_a_main_guard_however_python_got_it(tmp_path, how):
    """Ranks never re-run the main module: a script piped in ('<stdin>'), a file and `python -m`
    module, none with `if __name__ == '__main__':`, each start their ranks once."""
    script = "import paralab\nprint(len(paralab.run('ddp', 2, steps=1, global_batch=4).losses))\n"
    (tmp_path / "unguarded.py").write_text(script)
    argv = {"piped": ["-"], "file": [str(tmp_path / "unguarded.py")], "module": ["-m", "unguarded"]}[how]
    done = subprocess.run([sys.executable, *argv], input=script if how == "piped" else None, capture_output=True,
                          text=True, timeout=150, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1"
