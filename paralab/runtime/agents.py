"""torchrun agents on this machine (``paralab nodes``, ``paralab elastic``, ``run_torchrun``): tied to
their launcher, tidy, and listening on loopback only.

An agent is torchrun's own main (``torch.distributed.run``), started through :data:`BOOTSTRAP`,
which first asks Linux to SIGKILL it when the launcher dies, and checks that the launcher is still
its parent (it may have died before the request was made). torchrun starts each worker in a session
of its own, so a worker must do the same with its agent: :func:`worker_setup`, first thing in every
worker, with the agent's PID that the bootstrap leaves in the environment. So a killed launcher takes
its agents with it, and each agent its workers, within moments; the launcher's janitor
(paralab.runtime.janitor) kills the agents too, and the workers it was told of (:class:`Workers`: one
stuck before :func:`worker_setup` has not tied its life to its agent yet), and removes the scratch
directory.

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

import contextlib
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

from paralab.runtime import loopback

LAUNCHER_PID, AGENT_PID = "PARALAB_LAUNCHER_PID", "PARALAB_AGENT_PID"
REPORT_DIR = "PARALAB_REPORT_DIR"  # where a failing rank of `paralab nodes` writes its error report
# A standby agent (PARALAB_STANDBY, paralab elastic's joining node) imports torchrun, then waits for a
# line on stdin before it joins the rendezvous. torchrun's main is called as its console script calls it:
# run as a module (runpy) once imported, it warned in every agent's log that it was in sys.modules.
BOOTSTRAP = (
    "import ctypes, os, signal, sys; ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL); "
    f"os.getppid() == int(os.environ['{LAUNCHER_PID}']) or os.kill(os.getpid(), signal.SIGKILL); "
    f"os.environ['{AGENT_PID}'] = str(os.getpid()); "
    "import torch.distributed.run; "
    "os.environ.pop('PARALAB_STANDBY', None) and sys.stdin.readline(); "
    "sys.exit(torch.distributed.run.main())"
)
TORCHRUN_WORKER = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent in every worker it starts
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
    A worker of someone else's torchrun dies with its agent too (torchrun starts it in a session of
    its own, so an agent killed outright had left its ranks training on, adopted by PID 1); its store
    is left as that torchrun set it up."""
    from paralab.runtime.worker import die_with_parent

    agent = os.environ.get(AGENT_PID)
    if agent is None:
        if TORCHRUN_WORKER in os.environ:
            die_with_parent()  # its parent is its agent (a moment ago: an agent gone already is missed)
        return
    die_with_parent(int(agent))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "False":  # rank 0 would host it on every interface
        loopback.serve_env_store()


def children_of(parents: set[int]) -> list[int]:
    """The processes whose parent is one of ``parents`` (Linux's /proc; torchrun's workers are its
    agent's children)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:  # "pid (name) state ppid ...": the name may hold spaces and parentheses
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid in parents:
            children.append(int(stat.parent.name))
    return children


class Workers:
    """The agents' workers, told to the launcher's janitor as they appear (a look a second at most).

    A worker ties its life to its agent only in :func:`worker_setup`, after its imports: one stuck
    before it (stopped, or importing for ever) would outlive its agent, in a session of its own that
    killing the agent's process group misses. Told to the janitor, it goes with the launcher whatever
    ends the launcher; :func:`stop_agents` kills it when the launcher ends the run."""

    LOOK_EVERY_S = 1.0

    def __init__(self, janitor):
        self.janitor, self.told, self.next_look = janitor, set(), 0.0

    def look(self, procs: list[subprocess.Popen]) -> None:
        """Tell the janitor of the workers of the agents still running (a PID of one reaped already
        may be another process's by now)."""
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + self.LOOK_EVERY_S
        self.tell(children_of({proc.pid for proc in procs if proc.poll() is None}))

    def tell(self, pids: list[int]) -> None:
        for pid in set(pids) - self.told:
            self.janitor.kill_at_end(pid)
            self.told.add(pid)


def stop_agents(procs: list[subprocess.Popen], workers: Workers) -> None:
    """SIGKILL the agents still running and their workers, without waiting for anything they do on a
    gentler signal. Each agent is frozen first (SIGSTOP), so that it starts no worker while they are
    listed (an elastic agent restarts failed ones); the workers die before their agents, which
    would leave them adopted by PID 1, out of reach; each agent's process group goes with it."""
    live = [proc for proc in procs if proc.poll() is None]
    for proc in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGSTOP)
    found = children_of({proc.pid for proc in live})
    workers.tell(found)  # a launcher killed from here on still takes them
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in live:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        proc.wait()


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
