"""Start ``world_size`` ranks from a script or a Jupyter kernel, watch them, collect what they measured.

Why a forkserver: starting a rank with plain ``spawn`` costs seconds (a fresh interpreter imports
torch). The forkserver imports paralab and torch once, then forks each rank from that warm process,
so the second and later runs in a notebook start in a fraction of a second. The rank target is an
importable function (paralab.runtime.worker.spawn_entry), never one defined in a notebook.

Why files: each rank writes its result, or its traceback, into a private run directory. The parent
polls those files and the processes' exit codes, so a rank that raises is reported at once (naming
the rank and carrying its traceback) and the other ranks, which would otherwise wait in a collective
until the process-group timeout, are killed. The rank at fault is named, not a peer that saw it fail
(paralab.runtime.failures). Whatever happens (an error, a timeout, a KeyboardInterrupt in the
notebook), every rank is gone when ``launch`` returns; and if the parent itself is killed, its
janitor (paralab.runtime.janitor) kills the ranks and removes the run directory.

Nothing listens beyond loopback: ranks meet through a file store in the run directory, and gloo's
(or NCCL's) sockets are kept on the loopback interface (paralab.runtime.loopback).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from multiprocessing import util as mp_util
from pathlib import Path

from paralab.config import RunConfig, resolve_device
from paralab.layout import resolve_layout
from paralab.precision import check_dtype
from paralab.runtime.failures import blame, crash_report, is_consequence, read_if_there, stack_report
from paralab.runtime.janitor import Janitor
from paralab.runtime.processes import ProgressWatch
from paralab.runtime.result import RunError, RunResult
from paralab.runtime.worker import check_capacity, check_model_fits, spawn_entry, usable_cores
from paralab.strategies.registry import MODULES as STRATEGY_MODULES
from paralab.warn import warn

POLL_S = 0.05
SETTLE_S = 3.0  # after a first failure: how long to wait for the rest of the evidence
STACK_WAIT_S = 2.0  # for a rank asked for its Python stack to write it


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["paralab.runtime.worker",
                                *(f"paralab.strategies.{m}" for m in STRATEGY_MODULES)])
    return ctx


def release_forkserver() -> None:
    """Stop this process's warm forkserver, if it runs; the next launch starts a new one.

    Launchers whose ranks start afresh call it first (``paralab nodes``, ``paralab elastic``):
    torchrun's agents and workers import torch on their own, while the idle forkserver would keep its
    copy of torch and the strategies (about 230 MB) for nothing — a tenth of a Binder box's 2 GB.
    (multiprocessing keeps its forkserver in a module global with a stop method of its own.)"""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        server._stop()


FORKSERVER_EXIT_S = 5.0  # how long a process at exit waits for its stopped forkserver to be gone


def _stop_forkserver_at_exit() -> None:
    """Stop this process's forkserver and wait for it, a bounded wait: left to notice its parent's end,
    the forkserver (torch loaded) had run on for a second or more after `paralab bench` or a script
    returned. Signalled, not told by closing its pipe as :func:`release_forkserver` does: a child
    forked after it started (a fork-context Process, a DataLoader worker) holds that pipe open, and
    waiting for its end would hang the exit."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + FORKSERVER_EXIT_S
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


atexit.register(_stop_forkserver_at_exit)


def preflight(cfg: RunConfig):
    """What a local launch of ``cfg`` checks before any process starts (ConfigError if one fails): its
    layout, the device every local rank gets, its dtype on that device, and that this machine holds
    the ranks. Returns the layout and the config with its device resolved."""
    layout = resolve_layout(cfg)
    cfg = dataclasses.replace(cfg, device=resolve_device(cfg.device, cfg.world_size))
    check_dtype(cfg.dtype, cfg.device)
    check_capacity(cfg.world_size, cfg.oversubscribe)
    check_model_fits(cfg.model, cfg.device)
    return layout, cfg


def launch(cfg: RunConfig, progress=None) -> RunResult:
    """Resolve ``cfg``'s layout, run it on ``cfg.world_size`` local ranks and return the RunResult.

    ``progress(step, steps)`` is called as the slowest rank reaches each step (widgets use it).
    Raises ConfigError before any process starts, RunError if a rank fails or the run hangs.
    """
    layout, cfg = preflight(cfg)
    warn_if_cores_are_shared(cfg.world_size)
    janitor = Janitor()
    try:
        result = _launch_ranks(cfg, layout, janitor, progress)
    except KeyboardInterrupt:  # an interrupted script is exiting: the janitor may have more to do
        janitor.leave()
        raise
    except BaseException:  # even if a second Ctrl-C cut the stop short: the janitor finishes the job
        janitor.finish()
        raise
    janitor.finish()
    return result


def warn_if_cores_are_shared(ranks: int) -> None:
    """A ParalabWarning when ``ranks`` local ranks outnumber the usable cores."""
    if ranks > usable_cores():
        warn(f"world size {ranks} exceeds the {usable_cores()} usable CPU cores: ranks will time-share "
             "cores, so step times show contention, not scaling")


def _launch_ranks(cfg: RunConfig, layout, janitor: Janitor, progress) -> RunResult:
    """Start the ranks (the janitor told of each), watch them and collect their result."""
    run_dir = Path(tempfile.mkdtemp(prefix="paralab-run-"))
    janitor.remove_at_end(run_dir)
    ctx = _context()
    procs = [
        ctx.Process(target=spawn_entry,
                    args=(rank, cfg.world_size, cfg.to_dict(), layout.to_dict(), str(run_dir)),
                    name=f"paralab-rank{rank}")
        for rank in range(cfg.world_size)
    ]
    try:
        with _main_module_not_reimported():
            for p in procs:
                p.start()
                janitor.kill_at_end(p.pid)
        janitor.remove_if_launcher_dies(mp_util.get_temp_dir())  # the forkserver's socket is there
        _watch(cfg, procs, run_dir, progress)
        return RunResult.collect(cfg, layout, run_dir)
    finally:
        _stop(procs)


@contextlib.contextmanager
def _main_module_not_reimported():
    """Start ranks as from an interactive session: without re-running the user's main module.

    multiprocessing re-imports ``__main__`` in every child (by file, or by name under ``python -m``)
    so that functions defined there can be targets. The ranks' entry point lives in paralab and their
    arguments are plain data, so nothing of the main module is needed; re-running it would call
    ``paralab.run`` again in each rank (a script without ``if __name__ == '__main__':``) or fail
    outright (a script piped in, whose file is '<stdin>'). So its name is hidden while ranks start.
    """
    main = sys.modules.get("__main__")
    saved = {name: getattr(main, name) for name in ("__file__", "__spec__") if hasattr(main, name)}
    if "__file__" in saved:
        del main.__file__
    if "__spec__" in saved:
        main.__spec__ = None
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


def _watch(cfg: RunConfig, procs, run_dir: Path, progress) -> None:
    """Poll until every rank has written its result; raise RunError on the first failure or hang."""
    watch = ProgressWatch(cfg.timeout_s)
    while True:
        if any(run_dir.glob("rank*.error.json")) or _ended_without_result(procs, run_dir):
            raise _failure(procs, run_dir)
        if all((run_dir / f"rank{r}.json").exists() for r in range(len(procs))):
            return
        step = slowest_step(run_dir, len(procs))
        if watch.saw(step) and progress is not None:
            progress(step, cfg.steps)
        if watch.hung():
            raise RunError(None, watch.message(), "")
        time.sleep(POLL_S)


def slowest_step(run_dir: Path, world_size: int) -> int:
    """The step every rank has reached, by the ``rankN.beat`` files in ``run_dir`` (worker.heartbeat_to);
    -1 before every rank has reached one."""
    steps = []
    for rank in range(world_size):
        try:
            steps.append(int((run_dir / f"rank{rank}.beat").read_text() or -1))
        except (FileNotFoundError, ValueError):
            steps.append(-1)
    return min(steps)


def _ended_without_result(procs, run_dir: Path) -> dict[int, int]:
    """rank -> exit code of each rank that ended without writing its result."""
    return {rank: p.exitcode for rank, p in enumerate(procs)
            if p.exitcode is not None and not (run_dir / f"rank{rank}.json").exists()}


def _failure(procs, run_dir: Path) -> RunError:
    """Gather the evidence for paralab.runtime.failures.blame. A killed rank's exit reaches us a
    moment after its peers' reports, and the peers of a hung rank time out within moments of each
    other: so wait, up to SETTLE_S, for a cause, a rank that ended silently, or every rank's word."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        reports = [json.loads(f.read_text()) for f in run_dir.glob("rank*.error.json")]
        reports.sort(key=lambda r: r["rank"])
        ended = _ended_without_result(procs, run_dir)
        reported = {r["rank"] for r in reports}
        silent = [rank for rank in range(len(procs)) if rank not in reported and rank not in ended
                  and not (run_dir / f"rank{rank}.json").exists()]
        settled = (not silent or any(not is_consequence(r) for r in reports)
                   or any(rank not in reported for rank in ended))
        if settled or time.monotonic() > deadline:
            return blame(reports, ended, silent, lambda rank: _stack(procs[rank], rank, run_dir),
                         lambda rank: crash_report(run_dir, rank))
        time.sleep(POLL_S)


def _stack(proc, rank: int, run_dir: Path) -> str:
    """Ask a rank that stopped answering where it is (worker.dump_stacks)."""
    stack_file = run_dir / f"rank{rank}.stack"
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < deadline and not read_if_there(stack_file):
        time.sleep(POLL_S)
    # a rank stopped (SIGSTOP, a debugger) or stuck outside Python cannot answer: said, not left blank
    return stack_report(run_dir, rank) or (f"(rank {rank} did not write its Python stack when asked: "
                                           "stopped, or stuck outside Python)")


def _stop(procs) -> None:
    procs = [p for p in procs if p.pid is not None]  # a start that failed left nothing to stop
    for p in procs:
        if p.is_alive():
            p.terminate()
            # a stopped rank (SIGSTOP) is woken to take its SIGTERM: left stopped, it had kept the
            # run waiting out the 5 s below for its SIGKILL
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
    deadline = time.monotonic() + 5.0
    for p in procs:
        p.join(timeout=max(deadline - time.monotonic(), 0.1))
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)
