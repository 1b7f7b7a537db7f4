"""Start local "nodes" as torchrun elastic agents, watch them, and read back what happened.

Each node is one ``torch.distributed.run`` agent (``--nnodes MIN:MAX --nproc-per-node 1``) running
``python -m paralab.elastic.train``: the membership logic is torchrun's own, not paralab's. When a
worker dies its peers' collectives fail, their agents restart them, and the c10d rendezvous forms a new
world from the nodes still alive (once the dead node's keep-alive has lapsed); a node started later is
seen as waiting and the agents restart into a larger world. The joining node (``--join-after-step K``)
boots with the others but holds before its rendezvous until the launcher releases it after step K, like a
standby node: starting a Python with torch takes seconds, and a late node must not miss a short run.

Three choices make that work on one machine and keep tests short:

- the rendezvous store is hosted here, in the launcher, on 127.0.0.1 (agents get ``is_host=false``),
  so killing any node, even the first, leaves the rendezvous alive, as a dedicated rendezvous host
  does on a cluster;
- ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: each new world bootstraps its process group from a fresh
  store on its rank 0 (on 127.0.0.1 too), not from the store of whichever agent was rank 0 before (and
  may be dead now);
- short keep-alives and a short last call (``--rdzv-conf``), so a dead node is noticed in seconds (5 s
  of silence: shorter misreads a live agent on a loaded machine as dead).

Agents and workers start as paralab.runtime.agents describes: every agent dies with the launcher and
every worker with its agent, their temporary files live in the run's scratch directory, and nothing
listens beyond loopback. ``launch`` stops them all on every exit path, and the janitor
(paralab.runtime.janitor) does if the launcher itself is killed, so no process or temporary directory
outlives a run (the checkpoints too, unless a checkpoint or run directory was given).

A run whose every step completed is a success, even if a node is lost afterwards: the survivors'
agents would wait for it at torchrun's exit barrier (minutes), so they are stopped instead.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from paralab.config import ConfigError, cuda_device_count, resolve_device
from paralab.elastic import checkpoint
from paralab.elastic.config import ElasticConfig
from paralab.elastic.history import ElasticResult
from paralab.runtime import agents, loopback
from paralab.runtime.failures import how_it_ended
from paralab.runtime.janitor import Janitor
from paralab.runtime.launch import release_forkserver, warn_if_cores_are_shared
from paralab.runtime.result import RunError
from paralab.runtime.worker import check_capacity, check_model_fits, usable_cores
from paralab.text import count_text

POLL_S = 0.1
EXIT_GRACE_S = 5.0  # once every step is done: how long agents may take to leave torchrun's exit barrier


class ElasticError(RunError):
    """The elastic run did not finish: what the workers reported and the agents' last log lines."""

    def __init__(self, message: str):
        super().__init__(None, message, "")


def launch(cfg: ElasticConfig, run_dir: str | Path | None = None, progress=None) -> ElasticResult:
    """Validate ``cfg``, run it on ``cfg.nodes`` local agents and return what happened.

    Raises ConfigError before any process starts; ElasticError if the run fails or times out.
    ``run_dir`` keeps the step records, traces and agent logs (default: a temporary directory, removed).
    ``progress(step, steps)`` is called as steps complete.
    """
    cfg.validate()
    check_capacity(cfg.max_nodes, cfg.oversubscribe)
    check_model_fits(cfg.model, "cuda" if cfg.device == "cuda" else "cpu")  # "auto" checked as the CPU
    if run_dir is not None:
        check_run_dir(Path(run_dir))
    if cfg.checkpoint_dir:
        checkpoint.check_resumable(cfg.checkpoint_dir, cfg.signature(), cfg.steps)
    warn_if_cores_are_shared(cfg.max_nodes)  # as a run's ranks: its workers may all run
    janitor = Janitor()
    try:
        scratch = Path(tempfile.mkdtemp(prefix="paralab-elastic-"))
        janitor.remove_at_end(scratch)
        run_dir = Path(run_dir) if run_dir is not None else scratch
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg = dataclasses.replace(
            cfg, checkpoint_dir=cfg.checkpoint_dir or str(run_dir / "checkpoints"),
            threads_per_rank=cfg.threads_per_rank or max(1, usable_cores() // cfg.max_nodes),
            device=resolve_device(cfg.device, cfg.max_nodes),
        )
        store = loopback.serve_store()  # the rendezvous, hosted here
        release_forkserver()  # the agents' workers import torch afresh: the idle forkserver's copy can go
        started: list[subprocess.Popen] = []
        workers = agents.Workers(janitor)
        try:
            start = _agent_starter(cfg, run_dir, agents.environment(scratch), store.port,
                                   f"paralab-{uuid.uuid4().hex[:12]}", janitor, started)
            nodes = [start(node) for node in range(cfg.nodes)]
            standby = start(cfg.nodes, standby=True) if cfg.join_after_step is not None else None
            _watch(cfg, run_dir, nodes, standby, progress,
                   on_poll=lambda: workers.look(started))
            return ElasticResult.collect(cfg, run_dir, own_agents=True)
        finally:
            agents.stop_agents(started, workers)
    finally:
        janitor.finish()


def check_run_dir(run_dir: Path) -> None:
    """A run directory records one run: another run's generations would be read as this one's (and its
    checkpoints resumed), so it must be new or empty of them."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} is a file")
    held = sorted(p.name for p in run_dir.glob("gen-*")) if run_dir.is_dir() else []
    if held or (run_dir / "checkpoints").exists():
        raise ConfigError(f"run directory {run_dir} already holds a run ({', '.join(held) or 'checkpoints'})"
                          ": its records would be read as this run's; give a new or empty directory")


def _agent_starter(cfg: ElasticConfig, run_dir: Path, env: dict, port: int, run_id: str, janitor: Janitor,
                   started: list):
    rdzv_conf = (f"join_timeout={max(30, int(cfg.run_timeout_s))},"
                 f"last_call_timeout={cfg.last_call_s},"
                 "close_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=5")
    cmd = agents.command([
        "--nnodes", f"{cfg.min_nodes}:{cfg.max_nodes}", "--nproc-per-node", "1",
        "--max-restarts", str(cfg.max_restarts), "--monitor-interval", "0.1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{loopback.HOST}:{port}", "--rdzv-id", run_id,
        *agents.local_rendezvous(rdzv_conf),
        "-m", "paralab.runtime.agents", "paralab.elastic.train", *cfg.to_argv(), "--run-dir", str(run_dir),
    ])

    def start(node: int, standby: bool = False) -> subprocess.Popen:
        node_env = {**env, "PARALAB_NODE": str(node), "OMP_NUM_THREADS": str(cfg.threads_per_rank),
                    "PYTHONUNBUFFERED": "1"}
        if cfg.device == "cuda":  # local "nodes" share this machine's GPUs: one each, by node index
            node_env["CUDA_VISIBLE_DEVICES"] = str(node % cuda_device_count())
        if standby:
            node_env["PARALAB_STANDBY"] = "1"
        log = open(run_dir / f"agent{node}.log", "w")
        with log:
            agent = subprocess.Popen(cmd, env=node_env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.PIPE if standby else subprocess.DEVNULL, text=True)
        started.append(agent)
        janitor.kill_at_end(agent.pid)
        return agent

    return start


def _progress_step(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "progress.json").read_text())["step"]
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def _watch(cfg: ElasticConfig, run_dir: Path, agents: list, standby, progress, on_poll=lambda: None) -> None:
    """Poll until every agent has exited, or every step is done and the agents had time to leave;
    release the standby node once its step has completed. ElasticError as soon as the nodes left
    alive are fewer than the run's MIN: they would wait in the rendezvous until its timeout.
    ``on_poll()`` is called on every pass."""
    deadline = time.monotonic() + cfg.run_timeout_s
    last_step, finished = -1, None
    while any(a.poll() is None for a in agents):
        on_poll()
        step = _progress_step(run_dir)
        if step != last_step:
            last_step = step
            if progress is not None:
                progress(step, cfg.steps)
        if standby is not None and step >= cfg.join_after_step:
            try:
                standby.stdin.write("join\n")
                standby.stdin.close()
            except BrokenPipeError:  # it died waiting: its log says why
                raise ElasticError(f"the standby node died (exit {standby.wait()}) before step "
                                   f"{cfg.join_after_step} released it" + _diagnosis(run_dir)) from None
            agents.append(standby)
            standby = None
        if finished is None and _every_step_done(run_dir):
            finished = time.monotonic()
        if finished is not None and time.monotonic() - finished > EXIT_GRACE_S:
            return  # agents left waiting at torchrun's exit barrier wait for a node that is gone
        if finished is None and (lost := _too_few_left(cfg, agents)):
            raise ElasticError(lost + f" (last step {last_step})" + _diagnosis(run_dir))
        if time.monotonic() > deadline:
            raise ElasticError(f"the run did not finish within {cfg.run_timeout_s:g} s "
                               f"(last step {last_step})" + _diagnosis(run_dir))
        time.sleep(POLL_S)
    if not _every_step_done(run_dir):
        codes = ", ".join(f"node {n}: {a.returncode}" for n, a in enumerate(agents))
        raise ElasticError(f"every agent exited ({codes}) before training finished (last step {last_step})"
                           + _diagnosis(run_dir))


def _too_few_left(cfg: ElasticConfig, agents: list) -> str:
    """Why the run cannot go on, when a node was lost and fewer than MIN are left alive (a standby not
    released yet joins only after a step these cannot take); else empty."""
    lost = [(node, a.returncode) for node, a in enumerate(agents) if a.poll() not in (None, 0)]
    alive = sum(a.poll() is None for a in agents)
    if not lost or alive >= cfg.min_nodes:
        return ""
    said = ", ".join(f"node {node} ({how_it_ended(code)})" for node, code in lost)
    return (f"lost {said}: {count_text(alive, 'node')} left, fewer than MIN {cfg.min_nodes} of --nnodes "
            f"{cfg.min_nodes}:{cfg.max_nodes}, so the run cannot go on; a lower MIN rides out the loss")


def _every_step_done(run_dir: Path) -> bool:
    """A generation's rank 0 wrote done.json: it completed the last step (paralab.elastic.train)."""
    return any(run_dir.glob("gen-*/done.json"))


def _diagnosis(run_dir: Path) -> str:
    """The first worker error and the tail of each agent's log, for the error message."""
    parts = []
    for err in sorted(run_dir.glob("gen-*/rank*.error.json"))[:1]:
        report = json.loads(err.read_text())
        parts.append(f"{err.parent.name}/{err.name}: {report['error']}")
    for log in sorted(run_dir.glob("agent*.log")):
        tail = log.read_text(errors="replace").strip().splitlines()[-6:]
        parts.append(f"--- {log.name} (last lines) ---\n" + "\n".join(tail))
    return ("\n" + "\n".join(parts)) if parts else ""
