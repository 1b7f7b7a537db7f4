"""Several torchrun agents on this machine, each acting as one node: multi-node DDP you can watch.

A real cluster runs one ``torchrun`` per node, all meeting at a c10d rendezvous endpoint:

    # on every node (node 0's address as the endpoint)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0:29500 \\
        -m paralab run --strategy ddp --hierarchical --steps 20 --trace-dir out/
    # under Slurm, one task per node:
    srun --nodes 2 --ntasks-per-node 1 torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1):29500 -m paralab run ...

:func:`run_local_nodes` starts exactly those commands (plus ``--local-addr 127.0.0.1`` and a
rendezvous store that it hosts itself on 127.0.0.1), so that a notebook on one machine shows the same
thing: every rank knows its node (torchrun's GROUP_RANK), and the trace splits communication bytes
into intra-node and inter-node traffic. Each agent goes through paralab.runtime.agents' bootstrap: it
dies with the launcher, keeps its temporary files in the run's scratch directory and listens on
loopback only. A rank that fails leaves an error report, so the failure names the rank and carries
its own traceback, not the agents' C++ stack.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from paralab.config import RunConfig
from paralab.runtime import agents, loopback
from paralab.runtime.failures import (
    blame,
    crash_report,
    cut_native_frames,
    how_it_ended,
    is_consequence,
    read_if_there,
    stack_report,
    then_reported,
)
from paralab.runtime.janitor import Janitor
from paralab.runtime.launch import (
    SETTLE_S,
    STACK_WAIT_S,
    release_forkserver,
    slowest_step,
    usable_cores,
    warn_if_cores_are_shared,
)
from paralab.runtime.processes import POLL_S, ProgressWatch, Waited, wait_together
from paralab.runtime.result import RunError
from paralab.trace import Trace


@dataclass
class MultiNodeRun:
    summary: dict
    trace: Trace
    commands: list[list[str]]

    @property
    def losses(self) -> list[float]:
        return self.summary["losses"]


def agent_command(nnodes: int, nproc_per_node: int, endpoint: str, run_id: str, run_args: list[str],
                  options: tuple[str, ...] = ()) -> list[str]:
    """The torchrun command of one node; ``options``: more torchrun options (before the module)."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, *options,
        "-m", "paralab", "run", *run_args,
    ]


def _gpus_of_node(node: int, nnodes: int, nproc_per_node: int) -> dict:
    """Each emulated node sees its own GPUs: ranks pick cuda:LOCAL_RANK, and LOCAL_RANK restarts at 0
    on every node, so without this two nodes on one machine would share GPUs."""
    from paralab.config import cuda_device_count

    if cuda_device_count() < nnodes * nproc_per_node:
        return {}
    first = node * nproc_per_node
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(first, first + nproc_per_node))}


def run_local_nodes(run_args: list[str], nnodes: int = 2, nproc_per_node: int = 2,
                    timeout_s: float | None = None, trace_dir: str | None = None) -> MultiNodeRun:
    """Run ``paralab run <run_args>`` as ``nnodes`` torchrun agents of ``nproc_per_node`` ranks each.

    Returns rank 0's summary and the merged per-rank traces (kept in ``trace_dir`` when given). The
    agents die with this process, and every process and temporary file of the run is gone when it
    returns or raises (paralab.runtime.agents, paralab.runtime.janitor). The run is stopped when no
    rank has made progress for longer than its ``--timeout`` allows, as a local run is
    (paralab.runtime.processes.ProgressWatch), or after ``timeout_s`` when one is given: a long
    healthy run is never cut short.
    """
    if nnodes < 1 or nproc_per_node < 1:
        from paralab.config import ConfigError

        raise ConfigError(f"need at least one node and one rank per node, got {nnodes} x {nproc_per_node}")
    janitor = Janitor()
    try:
        scratch = Path(tempfile.mkdtemp(prefix="paralab-nodes-"))
        janitor.remove_at_end(scratch)
        trace_dir = trace_dir or str(scratch / "traces")
        reports = scratch / "reports"
        reports.mkdir()
        store = loopback.serve_store()  # the rendezvous, hosted here
        options = agents.local_rendezvous()
        flags = _run_flags(run_args)
        warn_if_cores_are_shared(nnodes * nproc_per_node)
        args = [*run_args, *_fair_threads(flags, nnodes * nproc_per_node), "--json", "--trace-dir", trace_dir]
        endpoint, run_id = f"{loopback.HOST}:{store.port}", uuid.uuid4().hex[:8]
        commands = [agent_command(nnodes, nproc_per_node, endpoint, run_id, args, options)
                    for _ in range(nnodes)]
        env = agents.environment(scratch)
        env[agents.REPORT_DIR] = str(reports)
        release_forkserver()  # the agents' workers import torch afresh: the idle forkserver's copy can go
        watch = ProgressWatch(flags.timeout)
        outputs, waited = _run_agents(commands, env, nnodes, nproc_per_node, janitor, reports, watch,
                                      timeout_s)
        stopped = set(waited.running)
        failed = [(node, code, err) for node, (code, _, err) in enumerate(outputs)
                  if code != 0 and node not in stopped]
        if failed or any(reports.glob("rank*.error.json")):
            raise _failure(reports, failed, nnodes * nproc_per_node)
        if stopped:
            why = watch.message() if waited.hung else f"did not finish within {timeout_s:.0f} s"
            stacks = (stack_report(reports, rank, "when the run was stopped")
                      for rank in range(nnodes * nproc_per_node))
            raise RunError(None, f"the {nnodes}-node run was stopped: {why}",
                           "\n\n".join(stack for stack in stacks if stack))
        summaries = [json.loads(line) for _, out, _ in outputs
                     for line in out.splitlines() if line.startswith("{")]
        if not summaries:
            raise RunError(None, "no agent printed a summary",
                           "\n".join(cut_native_frames(err)[-2000:] for _, _, err in outputs))
        return MultiNodeRun(summaries[0], Trace.load(Path(trace_dir)), commands)
    finally:
        janitor.finish()


class _RunFlagsParser(argparse.ArgumentParser):
    """A bad value is a ConfigError, from paralab's Python API as from the shell, not an exit."""

    def error(self, message: str):
        from paralab.config import ConfigError

        raise ConfigError(f"the run's flags: {message}")


def _run_flags(run_args: list[str]) -> argparse.Namespace:
    """The run's ``--timeout`` (how long a collective may wait) and ``--threads``, read as ``paralab
    run`` reads them (spelled whole, ``--threads=3`` too; its other flags are left unread)."""
    parser = _RunFlagsParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--timeout", type=float, default=RunConfig.timeout_s)
    parser.add_argument("--threads", type=int, default=RunConfig.threads_per_rank)
    return parser.parse_known_args(run_args)[0]


def _fair_threads(flags: argparse.Namespace, ranks: int) -> list[str]:
    """``--threads`` for each of the ``ranks`` on this machine, unless the run was given some: an
    agent would size its ranks' share by its own ranks alone, and N nodes had taken N times the
    cores (steps 10-50x slower, and noisy)."""
    return [] if flags.threads else ["--threads", str(max(1, usable_cores() // ranks))]


def _run_agents(commands, env: dict, nnodes: int, nproc_per_node: int, janitor: Janitor, reports: Path,
                watch: ProgressWatch, timeout_s: float | None) -> tuple[list[tuple[int, str, str]], Waited]:
    """Start one agent per node (each in its own process group) and wait for all of them while the
    ranks make progress (their steps, in ``reports``). When one fails the others are stopped: their
    ranks could only wait for its ranks until their own timeout; first their ranks are asked for
    their Python stacks (one of them stopped answering). Returns (exit code, out, err) per agent and
    how the wait ended: the agents still running then were stopped here (the failure, or the hang,
    is someone else's)."""
    procs, drains, workers = [], [], agents.Workers(janitor)
    world = nnodes * nproc_per_node

    def hung() -> bool:
        workers.look(procs)
        watch.saw(slowest_step(reports, world))
        return watch.hung()

    try:
        for node, cmd in enumerate(commands):
            node_env = {**env, **_gpus_of_node(node, nnodes, nproc_per_node)}
            procs.append(subprocess.Popen(agents.command(cmd[3:]), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env=node_env,
                                          start_new_session=True))
            janitor.kill_at_end(procs[-1].pid)
            drains.append(_Drain(procs[-1]))  # read as they write, so that no agent blocks on a full pipe
        waited = wait_together(procs, timeout_s, SETTLE_S, watchdog=hung)
        if waited.running:
            _ask_for_stacks({procs[node].pid for node in waited.running}, reports)
    finally:
        agents.stop_agents(procs, workers)
    return [(proc.returncode, *drain.text()) for proc, drain in zip(procs, drains, strict=True)], waited


def _ask_for_stacks(agent_pids: set[int], reports: Path) -> None:
    """Ask the ranks of these agents (their children) for their Python stacks (worker.dump_stacks: on
    SIGUSR1, to ``rankN.stack`` in ``reports``) and give them STACK_WAIT_S to write them. The agents
    are stopped next, so a child that is not a rank loses nothing to the signal."""
    asked = 0
    for pid in agents.children_of(agent_pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
            asked += 1
    deadline = time.monotonic() + STACK_WAIT_S
    while (time.monotonic() < deadline
           and sum(bool(read_if_there(f)) for f in reports.glob("rank*.stack")) < asked):
        time.sleep(POLL_S)


class _Drain:
    """An agent's stdout and stderr, read by two threads to the end."""

    def __init__(self, proc: subprocess.Popen):
        self.parts: dict[str, list[str]] = {"out": [], "err": []}
        self.threads = [threading.Thread(target=self._read, args=(stream, self.parts[name]), daemon=True)
                        for name, stream in (("out", proc.stdout), ("err", proc.stderr))]
        for thread in self.threads:
            thread.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        into.extend(stream)

    def text(self, wait_s: float = 5.0) -> tuple[str, str]:
        """What was read; a descendant that outlived its agent and still holds the pipe is not waited
        for beyond ``wait_s``."""
        for thread in self.threads:
            thread.join(wait_s)
        return "".join(self.parts["out"]), "".join(self.parts["err"])


_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def _failure(reports: Path, failed: list[tuple[int, int, str]], world: int) -> RunError:
    """The failing rank's own report when it left one (paralab.runtime.torchrun); an agent killed by a
    signal (its ranks died with it, unheard) as that node's death, unless a rank raised on its own; a
    rank that left no report (killed) from its agent's account of it (torchrun's root cause: rank and
    exit code); a rank that neither reported nor ended while its peers timed out waiting as the one
    that stopped answering; else the first failing agent's own words, C++ stack cut. A rank killed by
    a fatal signal left its Python stack as it died (paralab.runtime.torchrun). ``failed``: (node,
    exit code, stderr) of each agent that failed."""
    found = sorted((json.loads(f.read_text()) for f in reports.glob("rank*.error.json")),
                   key=lambda r: r["rank"])
    killed = [(node, code) for node, code, _ in failed if code < 0]
    if killed and all(is_consequence(r) for r in found):
        node, code = killed[0]
        return RunError(None, f"the torchrun agent of node {node} died ({how_it_ended(code)}), and its "
                              f"ranks with it{then_reported(found)}", "")
    ended = {int(rank): int(code) for _, _, err in failed for rank, code in _ROOT_CAUSE.findall(err)}
    silent = [rank for rank in range(world) if rank not in ended and rank not in {r["rank"] for r in found}]
    if found or ended:
        return blame(found, ended, silent, stack_of=lambda rank: stack_report(reports, rank),
                     crash_of=lambda rank: crash_report(reports, rank))
    node, _, err = failed[0]
    return RunError(None, f"the torchrun agent of node {node} failed", cut_native_frames(err)[-4000:])
