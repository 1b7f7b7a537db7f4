"""torchrun agents on this machine (``paralab nodes``, ``paralab elastic``, ``run_torchrun``): tied to
their launcher, tidy, and listening on loopback only.

An agent is torchrun's own main (``torch.distributed.run``), started through :data:`BOOTSTRAP`,
which first asks Linux to SIGKILL it when the launcher dies, and checks that the launcher is still
its parent (it may have died before the request was made). torchrun starts each worker in a session
of its own, so a worker must do the same with its agent: :func:`worker_setup`, first thing in every
worker, with the agent's PID that the bootstrap leaves in the environment. So a killed launcher takes
its agents with it, and each agent its workers, within moments; the launcher's janitor
(paralab.runtime.janitor) kills the agents too, and removes the scratch directory.

:func:`environment` is what every agent and worker inherits:

- ``TMPDIR`` inside the launcher's scratch directory, so what torchrun and its workers leave in the
  temporary directory (``torchelastic_*`` log directories, ``pymp-*``) goes when the scratch does;
- gloo and NCCL sockets on the loopback interface (paralab.runtime.loopback);
- ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: the rank-0 agent would otherwise host the workers'
  store on every interface. Without it each new world's rank-0 worker hosts it, and
  :func:`worker_setup` makes that happen on 127.0.0.1.

The rendezvous store itself is hosted by the launcher on 127.0.0.1 (agents get ``is_host=false``).

``python -m paralab.runtime.agents MODULE|SCRIPT ARGS...`` runs a module or a script as a worker
after :func:`worker_setup`: the elastic launcher starts ``paralab.elastic.train`` that way, and
:func:`paralab.runtime.torchrun.run_torchrun` a user's own script.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from paralab.runtime import loopback

LAUNCHER_PID, AGENT_PID = "PARALAB_LAUNCHER_PID", "PARALAB_AGENT_PID"
REPORT_DIR = "PARALAB_REPORT_DIR"  # where a failing rank of `paralab nodes` writes its error report
# A standby agent (PARALAB_STANDBY, paralab elastic's joining node) imports torchrun, then waits for a
# line on stdin before it joins the rendezvous.
BOOTSTRAP = (
    "import ctypes, os, runpy, signal, sys; ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL); "
    f"os.getppid() == int(os.environ['{LAUNCHER_PID}']) or os.kill(os.getpid(), signal.SIGKILL); "
    f"os.environ['{AGENT_PID}'] = str(os.getpid()); "
    "import torch.distributed.run; "
    "os.environ.pop('PARALAB_STANDBY', None) and sys.stdin.readline(); "
    "runpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)"
)
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
            "MASTER_PORT")


def local_rendezvous(conf: str = "") -> tuple[str, ...]:
    """torchrun options that keep a local agent's rendezvous on the launcher's loopback store: the
    agent does not host it (``is_host=false``) and names itself by 127.0.0.1; ``conf``: more
    ``--rdzv-conf`` settings (torchrun reads one such option)."""
    return ("--rdzv-conf", ",".join(s for s in ("is_host=false", conf) if s), "--local-addr", loopback.HOST)


def command(torchrun_args: list[str]) -> list[str]:
    """``torchrun ARGS`` as a local agent started through the bootstrap."""
    return [sys.executable, "-c", BOOTSTRAP, *torchrun_args]


def environment(scratch: Path) -> dict[str, str]:
    """This process's environment for its agents, less the rank variables of a launcher above it (a
    launch from inside a torchrun rank must not hand its agents that rank's world)."""
    tmp = scratch / "tmp"
    tmp.mkdir(exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if k not in RANK_ENV}
    return {**inherited, **loopback.transport_env(), LAUNCHER_PID: str(os.getpid()), "TMPDIR": str(tmp),
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def worker_setup() -> None:
    """In a worker of a local agent: die with the agent; host the process-group store on loopback.
    A worker of someone else's torchrun (no agent PID in the environment) is left alone."""
    agent = os.environ.get(AGENT_PID)
    if agent is None:
        return
    from paralab.runtime.worker import die_with_parent

    die_with_parent(int(agent))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "False":  # rank 0 would host it on every interface
        loopback.serve_env_store()


def run_target(target: str) -> None:
    """Run a module by name, or a script, a folder or a zip by path as ``python PATH`` would (a
    script's folder first on the path, unless Python was told to keep it off: ``-P``)."""
    path = Path(target)
    if not path.exists():
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    if path.is_file() and not sys.flags.safe_path:
        sys.path[0] = str(path.resolve().parent)  # where `python -m` put the working directory
    runpy.run_path(target, run_name="__main__")  # a folder or a zip goes first on the path itself


if __name__ == "__main__":
    worker_setup()
    target, sys.argv = sys.argv[1], sys.argv[1:]
    run_target(target)
