"""Several torchrun agents on this machine, each acting as one node: multi-node DDP you can watch.

A real cluster runs one ``torchrun`` per node, all meeting at a c10d rendezvous endpoint:

    # on every node (node 0's address as the endpoint)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0:29500 \\
        -m paralab run --strategy ddp --hierarchical --steps 20 --trace-dir out/
    # under Slurm, one task per node:
    srun --nodes 2 --ntasks-per-node 1 torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint $(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1):29500 -m paralab run ...

:func:`run_local_nodes` starts exactly those commands, with the endpoint on 127.0.0.1, so that a
notebook on one machine shows the same thing: every rank knows its node (torchrun's GROUP_RANK), and
the trace splits communication bytes into intra-node and inter-node traffic.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from paralab.runtime.launch import free_port
from paralab.runtime.result import RunError
from paralab.trace import Trace

_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class MultiNodeRun:
    summary: dict
    trace: Trace
    commands: list[list[str]]

    @property
    def losses(self) -> list[float]:
        return self.summary["losses"]


def agent_command(nnodes: int, nproc_per_node: int, endpoint: str, run_id: str, run_args: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
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


def run_local_nodes(run_args: list[str], nnodes: int = 2, nproc_per_node: int = 2, timeout_s: float = 600.0,
                    trace_dir: str | None = None) -> MultiNodeRun:
    """Run ``paralab run <run_args>`` as ``nnodes`` torchrun agents of ``nproc_per_node`` ranks each.

    Returns rank 0's summary and the merged per-rank traces. Every agent runs in its own process
    group, killed with everything under it if the run fails or times out.
    """
    if nnodes < 1 or nproc_per_node < 1:
        from paralab.config import ConfigError

        raise ConfigError(f"need at least one node and one rank per node, got {nnodes} x {nproc_per_node}")
    trace_dir = trace_dir or tempfile.mkdtemp(prefix="paralab-nodes-")
    endpoint = f"127.0.0.1:{free_port()}"
    run_id = uuid.uuid4().hex[:8]
    args = [*run_args, "--json", "--trace-dir", trace_dir]
    commands = [agent_command(nnodes, nproc_per_node, endpoint, run_id, args) for _ in range(nnodes)]
    env = {k: v for k, v in os.environ.items() if k not in _RANK_ENV}
    agents = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**env, **_gpus_of_node(node, nnodes, nproc_per_node)}, start_new_session=True)
              for node, cmd in enumerate(commands)]
    outputs = []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=timeout_s)
            outputs.append((agent.returncode, out, err))
    except subprocess.TimeoutExpired:
        raise RunError(None, f"the {nnodes}-node run did not finish within {timeout_s:.0f} s", "") from None
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    failed = [(i, err) for i, (code, _, err) in enumerate(outputs) if code != 0]
    if failed:
        node, err = failed[0]
        raise RunError(None, f"the torchrun agent of node {node} failed", err[-4000:])
    summaries = [json.loads(line) for _, out, _ in outputs for line in out.splitlines() if line.startswith("{")]
    if not summaries:
        raise RunError(None, "no agent printed a summary", "\n".join(err[-2000:] for _, _, err in outputs))
    return MultiNodeRun(summaries[0], Trace.load(Path(trace_dir)), commands)
