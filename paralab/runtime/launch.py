"""Start ``world_size`` ranks from a script or a Jupyter kernel, watch them, collect what they measured.

Why a forkserver: starting a rank with plain ``spawn`` costs seconds (a fresh interpreter imports
torch). The forkserver imports paralab and torch once, then forks each rank from that warm process,
so the second and later runs in a notebook start in a fraction of a second. The rank target is an
importable function (paralab.runtime.worker.spawn_entry), never one defined in a notebook.

Why files: each rank writes its result, or its traceback, into a private run directory. The parent
polls those files and the processes' exit codes, so a rank that raises is reported at once (naming
the rank and carrying its traceback) and the other ranks, which would otherwise wait in a collective
until the process-group timeout, are killed. Whatever happens (an error, a timeout, a
KeyboardInterrupt in the notebook), every rank is gone when ``launch`` returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing as mp
import shutil
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path

from paralab.config import RunConfig, resolve_device
from paralab.layout import resolve_layout
from paralab.precision import check_dtype
from paralab.runtime.result import RunError, RunResult
from paralab.runtime.worker import check_capacity, spawn_entry, usable_cores
from paralab.strategies.registry import MODULES as STRATEGY_MODULES

POLL_S = 0.05
STARTUP_GRACE_S = 120.0  # first run: the forkserver imports torch before any rank beats


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["paralab.runtime.worker", *(f"paralab.strategies.{m}" for m in STRATEGY_MODULES)])
    return ctx


def launch(cfg: RunConfig, progress=None) -> RunResult:
    """Resolve ``cfg``'s layout, run it on ``cfg.world_size`` local ranks and return the RunResult.

    ``progress(step, steps)`` is called as the slowest rank reaches each step (widgets use it).
    Raises ConfigError before any process starts, RunError if a rank fails or the run hangs.
    """
    layout = resolve_layout(cfg)
    cfg = dataclasses.replace(cfg, device=resolve_device(cfg.device, cfg.world_size))
    check_dtype(cfg.dtype, cfg.device)
    check_capacity(cfg.world_size, cfg.oversubscribe)
    if cfg.world_size > usable_cores():
        warnings.warn(
            f"world size {cfg.world_size} exceeds the {usable_cores()} usable CPU cores: ranks will "
            "time-share cores, so step times show contention, not scaling",
            RuntimeWarning,
            stacklevel=2,
        )
    run_dir = Path(tempfile.mkdtemp(prefix="paralab-run-"))
    port = free_port()
    ctx = _context()
    procs = [
        ctx.Process(target=spawn_entry,
                    args=(rank, cfg.world_size, cfg.to_dict(), layout.to_dict(), port, str(run_dir)),
                    name=f"paralab-rank{rank}")
        for rank in range(cfg.world_size)
    ]
    try:
        with _main_module_not_reimported():
            for p in procs:
                p.start()
        _watch(cfg, procs, run_dir, progress)
        return RunResult.collect(cfg, layout, run_dir)
    finally:
        _stop(procs)
        shutil.rmtree(run_dir, ignore_errors=True)


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
    started = last_progress = time.monotonic()
    last_step = -1
    while True:
        errors = sorted(run_dir.glob("rank*.error.json"))
        if errors:
            _raise_rank_error(errors)
        done = [(run_dir / f"rank{r}.json").exists() for r in range(len(procs))]
        if all(done):
            return
        for rank, p in enumerate(procs):
            if p.exitcode is not None and not done[rank]:
                time.sleep(0.2)  # the rank may be writing its error file
                if sorted(run_dir.glob("rank*.error.json")):
                    continue
                how = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit code {p.exitcode}"
                raise RunError(rank, f"rank {rank} died ({how}) without reporting a result", "")
        step = _slowest_step(run_dir, len(procs))
        now = time.monotonic()
        if step > last_step:
            last_step, last_progress = step, now
            if progress is not None and step >= 0:
                progress(step, cfg.steps)
        grace = STARTUP_GRACE_S if last_step < 0 else 0.0
        if now - last_progress > cfg.timeout_s + 30.0 + grace:
            raise RunError(
                None,
                f"no rank made progress for {now - last_progress:.0f} s (timeout {cfg.timeout_s:.0f} s): "
                f"the run hung at step {last_step}; started {now - started:.0f} s ago",
                "",
            )
        time.sleep(POLL_S)


def _slowest_step(run_dir: Path, world_size: int) -> int:
    steps = []
    for rank in range(world_size):
        try:
            steps.append(int((run_dir / f"rank{rank}.beat").read_text() or -1))
        except (FileNotFoundError, ValueError):
            steps.append(-1)
    return min(steps)


def _raise_rank_error(error_files: list[Path]) -> None:
    """Report the first failing rank. A rank whose peer failed usually errors too (connection reset),
    so prefer a rank whose error is not a communication failure caused by another rank."""
    reports = [json.loads(f.read_text()) for f in error_files]
    secondary = ("Connection closed by peer", "Connection reset", "Broken pipe", "connection refused")
    primary = [r for r in reports if not any(s.lower() in r["error"].lower() for s in secondary)]
    first = (primary or reports)[0]
    raise RunError(first["rank"], first["error"], first["traceback"])


def _stop(procs) -> None:
    procs = [p for p in procs if p.pid is not None]  # a start that failed left nothing to stop
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        p.join(timeout=max(deadline - time.monotonic(), 0.1))
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)
