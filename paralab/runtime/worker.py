"""The code every rank runs, whoever started it (paralab's launcher or torchrun).

``run_rank`` sets up one rank (threads, device, process group, recorder), calls the strategy's
``train`` and returns what the rank measured. ``spawn_entry`` wraps it for ranks started by
paralab.runtime.launch: it reports results and failures through files in a run directory, so the
parent (a script or a Jupyter kernel) never needs to unpickle anything from a rank.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import json
import os
import signal
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from paralab.config import RunConfig
from paralab.memory import MemoryMeter
from paralab.runtime.context import RankContext
from paralab.runtime.failures import cut_native_frames
from paralab.runtime.loopback import transport_env
from paralab.runtime.recorder import Recorder

PR_SET_PDEATHSIG = 1


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def threads_for(cfg: RunConfig, local_world_size: int) -> int:
    """A fair share of this machine's cores for each rank on it (at least one)."""
    if cfg.threads_per_rank > 0:
        return cfg.threads_per_rank
    return max(1, usable_cores() // max(local_world_size, 1))


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def run_rank(cfg: RunConfig, rank: int, world_size: int, local_rank: int, local_world_size: int,
             init_method: str, heartbeat=None, gather: bool = False):
    """Run one rank to the end. Returns (rank result, rank trace as a dict); with ``gather`` (torchrun,
    where no parent collects files) rank 0 also gets every rank's (result, trace) as a third item."""
    from paralab.strategies import strategy_module

    torch.set_num_threads(threads_for(cfg, local_world_size))
    device_name = cfg.resolved_device()
    device = torch.device("cuda", local_rank) if device_name == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(cfg.seed)
    dist.init_process_group(
        backend_for(device_name), init_method=init_method, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=cfg.timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        nodes = _node_map(cfg, rank, world_size)
        recorder = Recorder(rank, enabled=cfg.trace, cuda=device.type == "cuda", node_of=lambda r: nodes[r])
        if heartbeat is not None:
            recorder.on_step = heartbeat
        ctx = RankContext(cfg=cfg, rank=rank, world_size=world_size, local_rank=local_rank, node=nodes[rank],
                          device=device, recorder=recorder, memory=MemoryMeter(device))
        dist.barrier()
        recorder.start_clock()
        recorder.activate()
        result = strategy_module(cfg.strategy).train(ctx)
        recorder.deactivate()
        trace = recorder.trace(
            meta={"ranks": {rank: {"node": nodes[rank], "device": str(device), "host": os.uname().nodename}}}
        ).to_dict()
        if not gather:
            return result, trace
        everyone = [None] * world_size if rank == 0 else None
        dist.gather_object((result, trace), everyone, dst=0)
        return result, trace, everyone
    finally:
        gc.collect()  # seen with gloo: without it a rank may abort at exit after destroy
        dist.destroy_process_group()


def _node_map(cfg: RunConfig, rank: int, world_size: int) -> list[int]:
    """Node index of every rank: torchrun's GROUP_RANK (the agent's node rank) when torchrun started
    us, else ``cfg.nodes`` emulated nodes of consecutive ranks on this machine."""
    if "GROUP_RANK" in os.environ:
        mine = int(os.environ["GROUP_RANK"])
    else:
        mine = rank // (world_size // cfg.nodes)
    nodes: list[int] = [0] * world_size
    dist.all_gather_object(nodes, mine)
    return nodes


# ---------------------------------------------------------------------------- spawned ranks
def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask Linux to SIGKILL this process if the one that started it dies, so no rank outlives a run
    whose parent (a kernel, a test, an elastic agent) was killed. ``expected_parent``: the PID the
    parent had; if it died before the request was made, this process is gone at once."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if expected_parent is not None and os.getppid() != int(expected_parent):
        os.kill(os.getpid(), signal.SIGKILL)


def write_json(path: Path, data: dict) -> None:
    """Write atomically: a reader polling the file sees the old content or the new, never half."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def describe(exc: BaseException, timeout_s: float) -> str:
    """One line for the parent's RunError (C++ stack cut); a collective timeout says what it usually means."""
    text = cut_native_frames(f"{type(exc).__name__}: {exc}")
    if "timed out" in text.lower() or "timeout" in text.lower():
        return (f"a collective timed out after {timeout_s:g} s: another rank stopped answering "
                f"(hung, or much slower than this one). {text}")
    return text


def write_error_report(report_dir: Path, rank: int, exc: BaseException, timeout_s: float) -> None:
    """What a failing rank leaves for whoever started it: ``rankN.error.json`` (error and traceback)."""
    write_json(report_dir / f"rank{rank}.error.json", {
        "rank": rank, "error": describe(exc, timeout_s),
        "traceback": cut_native_frames(traceback.format_exc()),
    })


_STACK_FILES = []  # kept open for faulthandler, which writes to them from a signal handler


def dump_stack_on_request(path: Path) -> None:
    """On SIGUSR1, write every thread's Python stack to ``path``: how the launcher shows where a rank
    that stopped answering is stuck (it works while the rank sits in C++ code too)."""
    stack_file = open(path, "w")
    _STACK_FILES.append(stack_file)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)


def spawn_entry(rank: int, world_size: int, cfg_dict: dict, run_dir: str) -> None:
    """Target of each rank process started by paralab.runtime.launch. Ranks meet through a file store
    in the private run directory, and talk over loopback (paralab.runtime.loopback)."""
    die_with_parent()
    os.environ.update(transport_env())
    run_dir_path = Path(run_dir)
    beat = run_dir_path / f"rank{rank}.beat"
    dump_stack_on_request(run_dir_path / f"rank{rank}.stack")

    def heartbeat(step: int) -> None:
        beat.write_text(str(step))

    try:
        cfg = RunConfig.from_dict(cfg_dict)
        result, trace = run_rank(cfg, rank, world_size, rank, world_size,
                                 f"file://{run_dir_path / 'store'}", heartbeat=heartbeat)
        state = result.pop("state", None)
        if state is not None:
            torch.save(state, run_dir_path / f"rank{rank}.state.pt")
        result["trace"] = trace
        write_json(run_dir_path / f"rank{rank}.json", result)
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        write_error_report(run_dir_path, rank, exc, cfg_dict["timeout_s"])
        sys.stdout.flush()
        os._exit(1)
