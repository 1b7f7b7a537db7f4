"""Running under torchrun (or any launcher that sets RANK / WORLD_SIZE / LOCAL_RANK).

The ranks already exist, so paralab only runs the same worker code in this process: rendezvous comes
from the environment (``env://``), each rank can write its own trace file (``--trace-dir``, merged
later by ``paralab merge``) and rank 0 gathers everyone's results to print the summary. A rank first
ties its life to its agent (paralab.runtime.agents); under paralab's own local agents (``paralab
nodes``) it also keeps its store on loopback, beats at each step for the launcher's watchdog, and
leaves an error report for the launcher if it fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from paralab.config import ConfigError, RunConfig, resolve_device
from paralab.layout import resolve_layout
from paralab.outputs import rank_trace_name
from paralab.precision import check_dtype
from paralab.runtime import agents, loopback
from paralab.runtime.janitor import Janitor
from paralab.runtime.result import RunError, RunResult, measured_run_meta, run_meta
from paralab.trace import Trace

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    return all(k in os.environ for k in ENV_KEYS)


def refuse_half_a_launch() -> None:
    """ConfigError where a launcher's rank variables (RANK, WORLD_SIZE, LOCAL_RANK) are set but not all
    of ENV_KEYS: a wrapper that forgot MASTER_PORT had had every "rank" train alone as a local run and
    exit 0. The store's address alone (MASTER_ADDR, MASTER_PORT) is no launch: a local run it stays."""
    if not any(k in os.environ for k in ENV_KEYS[:3]):
        return
    missing = [k for k in ENV_KEYS if k not in os.environ]
    if missing:
        given = [k for k in ENV_KEYS if k in os.environ]
        raise ConfigError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} set but "
                          f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not: a rank of a "
                          f"launch (torchrun's) needs all of {', '.join(ENV_KEYS)}; unset them for a local "
                          "run")


def launched_nodes(world_size: int, local_world: int) -> int:
    """The nodes torchrun started the ranks on, as a config's ``nodes`` names them (what the simulator
    prices a run's collectives over and the figures group ranks by): its GROUP_WORLD_SIZE agents of
    ``local_world`` ranks each (torchrun's launch: every agent starts as many), or 1 where this rank's
    node times the agents is not the world. Read from this rank's environment alone: with nodes of
    unequal size (which a hierarchical all-reduce refuses on every rank) a rank whose node's size
    happens to fit that product still names the agents."""
    agents = int(os.environ.get("GROUP_WORLD_SIZE", 1))
    return agents if agents * local_world == world_size else 1


def launched_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the world size and nodes this process's torchrun environment launched."""
    world_size = int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return dataclasses.replace(cfg, world_size=world_size, nodes=launched_nodes(world_size, local_world))


def run_under_torchrun(cfg: RunConfig, trace_dir: str | None = None) -> RunResult | None:
    """Run this process's rank. Rank 0 returns the RunResult of the whole run; other ranks None.
    RunError, in one line, if the process group cannot form (a MASTER_PORT in use, a peer that never
    came): torch's own account of it is a page of C++ and Python frames."""
    from paralab.runtime.agents import REPORT_DIR, worker_setup
    from paralab.runtime.worker import GroupNotFormed, dump_stacks, heartbeat_to, run_rank, write_error_report

    worker_setup()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    reports = Path(os.environ[REPORT_DIR]) if REPORT_DIR in os.environ else None
    if reports:  # paralab's own agents: the launcher reads the stack of a rank that died, and its steps
        dump_stacks(reports, rank)
    else:  # someone's torchrun: a rank killed by a fatal signal prints its Python stack in its output,
        # and so does one torchrun stops (SIGTERM, once another rank failed): a rank that hung had been
        # stopped without a word, its peer's timeout blamed as the root cause
        faulthandler.enable(all_threads=True)
        faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    cfg = launched_config(cfg)
    world_size, local_world = cfg.world_size, int(os.environ.get("LOCAL_WORLD_SIZE", cfg.world_size))
    try:
        layout = resolve_layout(cfg)
        # GPUs per node, not world
        cfg = dataclasses.replace(cfg, device=resolve_device(cfg.device, local_world))
        check_dtype(cfg.dtype, cfg.device)
        result, trace, everyone = run_rank(cfg, layout, rank, world_size, local_rank, local_world, "env://",
                                           heartbeat=heartbeat_to(reports, rank) if reports else None,
                                           gather=True)
    except BaseException as exc:  # the launcher of local nodes reads the report (paralab.runtime.multinode)
        if reports:
            write_error_report(reports, rank, exc, cfg.timeout_s)
        if isinstance(exc, GroupNotFormed):
            raise RunError(rank, f"{exc} (at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}, "
                                 f"world size {world_size})", "") from None
        raise
    if trace_dir:  # each rank's file describes the run, so `paralab merge/report DIR` can read any of them
        rank_trace = Trace.from_dict(trace)  # and rank 0's, which a merge keeps, what every rank measured
        rank_trace.meta.update(measured_run_meta(cfg, layout, [res for res, _ in everyone])
                               if everyone else run_meta(cfg, layout))
        rank_trace.save(Path(trace_dir) / rank_trace_name(rank))
    if rank != 0:
        return None
    results = []
    for res, tr in everyone:
        res.pop("state", None)
        results.append({**res, "trace": tr})
    return RunResult.from_rank_results(cfg, layout, results, [None] * world_size)


@contextlib.contextmanager
def errors_told_to_torchrun():
    """A torchrun rank's error (a refused configuration, a fault, a timeout) written where torchrun
    reads it (torch's ``ErrorHandler``, as its ``@record`` writes it), so that the summary torchrun
    prints names it as the root cause: it had said ``error_file: <N/A>`` and pointed at torch's
    documentation, leaving a peer's knock-on error to read as the cause (``TORCHELASTIC_ERROR_FILE``,
    which the handler reads itself: nothing is written without it). The error goes on as before."""
    try:
        yield
    except Exception as exc:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)
        raise


def end_rank(code: int) -> NoReturn:
    """End a torchrun rank whose work is written, without the interpreter's teardown, as paralab's own
    spawned ranks end (multiprocessing leaves a child by ``os._exit``). torchrun fails a whole job when
    one rank exits badly, even after the job's work is done; and a gloo rank under ``paralab nodes``
    was once seen to die of SIGABRT without a word, most likely in that teardown (gloo is known to
    abort at exit when its objects are torn down late), which the spawned ranks have never shown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# torchrun gives its ranks 30 s after SIGTERM, then SIGKILLs them (LocalElasticAgent._shutdown); it is
# killed itself if it has not ended a while after that
STOP_WAIT_S = 45.0


def run_torchrun(script, *args, nproc: int = 2, timeout_s: float = 300.0) -> str:
    """Run ``torchrun --nproc-per-node NPROC SCRIPT ARGS`` on this machine and return what it printed.
    RunError (with its stderr) if it fails or runs past ``timeout_s``.

    torchrun runs as one of paralab's local agents (paralab.runtime.agents), so the job lives no
    longer than the caller, even one killed outright (a restarted Jupyter kernel): torchrun dies with
    this process and each rank with torchrun, the janitor removes the job's temporary files, and the
    rendezvous (hosted here), the ranks' store and gloo's sockets stay on 127.0.0.1. The script runs
    as ``python SCRIPT`` would (paralab only ties its life to torchrun's first). A call that ends
    early (timeout, error, Ctrl-C) asks torchrun to stop with SIGTERM, which it passes to its ranks,
    SIGKILLing any still running 30 s later; torchrun is killed if it has not ended after
    ``STOP_WAIT_S``."""
    if not Path(script).exists():
        raise ConfigError(f"no script at {str(script)!r} to run under torchrun")
    janitor = Janitor()
    try:
        scratch = Path(tempfile.mkdtemp(prefix="paralab-torchrun-"))
        janitor.remove_at_end(scratch)
        store = loopback.serve_store()  # the rendezvous, hosted here
        torchrun_args = ["--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", f"{loopback.HOST}:{store.port}", *agents.local_rendezvous(),
                         "-m", "paralab.runtime.agents", str(Path(script).resolve()), *map(str, args)]
        proc = subprocess.Popen(agents.command(torchrun_args), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=agents.environment(scratch),
                                start_new_session=True)
        janitor.kill_at_end(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RunError(None, f"torchrun {script} did not finish within {timeout_s:.0f} s", "") from None
        finally:
            if proc.poll() is None:  # ended early: torchrun stops its ranks on SIGTERM
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    finally:
        janitor.finish()
    if proc.returncode != 0:
        raise RunError(None, f"torchrun {script} exited with {proc.returncode}", err[-4000:])
    return out
