"""The code every rank runs, whoever started it (paralab's launcher or torchrun).

``rank_session`` sets up one rank (threads, device, process group, recorder), for ``paralab run``
(``run_rank`` calls the strategy's ``train`` and returns what the rank measured) and for elastic
training alike. ``spawn_entry`` wraps it for ranks started by
paralab.runtime.launch: it reports results and failures through files in a run directory, so the
parent (a script or a Jupyter kernel) never needs to unpickle anything from a rank.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import hashlib
import json
import math
import os
import signal
import socket
import sys
import traceback
import uuid
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from paralab import random_streams
from paralab.config import (
    ConfigError,
    ModelConfig,
    RunConfig,
    TrainingConfig,
    first_difference,
    shared_settings,
)
from paralab.layout import Layout
from paralab.memory import MemoryMeter
from paralab.precision import LossScaler
from paralab.profiling import profile_rank
from paralab.runtime.context import RaiseOrHang, RankContext
from paralab.runtime.failures import cut_native_frames
from paralab.runtime.loopback import transport_env
from paralab.runtime.recorder import Recorder
from paralab.strategies.registry import get_strategy
from paralab.text import count_text

PR_SET_PDEATHSIG = 1


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, or fewer where its cgroup's CPU quota allows
    less (a Binder pod of 1 CPU sees every core of its node, and a rank per core would time-share)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else cores


# A cgroup's CPU quota per period (v2's "quota period" line, then v1's two files; "max" or -1: none)
CGROUP_CPU = ("/sys/fs/cgroup/cpu.max", ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
                                         "/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def _cgroup_cpu_quota() -> float:
    """CPUs' worth of time this process's cgroup may use (1.5: one and a half cores), 0 where none is
    set or none can be read."""
    v2, (quota_file, period_file) = CGROUP_CPU
    try:
        with open(v2) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        try:
            with open(quota_file) as f, open(period_file) as g:
                quota, period = f.read().strip(), g.read().strip()
        except OSError:
            return 0.0
    try:
        return int(quota) / int(period) if quota not in ("max", "-1") and int(period) > 0 else 0.0
    except ValueError:
        return 0.0


MAX_RANKS_PER_CORE = 8  # beyond this, a local run is mostly ranks waiting for a time slice
RANK_MEMORY_BYTES = 256 * 2**20  # a forked CPU rank's own memory (USS), measured with the small model


# A cgroup's memory limit and use (v2, then v1): in a container or a Binder pod /proc/meminfo shows
# the node's memory, and the limit is what the kernel kills at
CGROUP_MEMORY = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/memory.usage_in_bytes"))
NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as the largest page-aligned 64-bit number


def available_memory_bytes() -> int:
    """Memory new processes can take: the kernel's MemAvailable, or less where this process's cgroup
    limits it (its limit less its use), or 0 where neither can be read."""
    known = [n for n in (_meminfo_available(), _cgroup_headroom()) if n]
    return min(known) if known else 0


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):  # pragma: no cover - not Linux
        return 0


def _cgroup_headroom() -> int:
    for limit_file, use_file in CGROUP_MEMORY:
        try:
            with open(limit_file) as f:
                text = f.read().strip()
            with open(use_file) as f:
                used = int(f.read().strip())
            limit = NO_LIMIT if text == "max" else int(text)
        except (OSError, ValueError):
            continue
        return 0 if limit >= NO_LIMIT else max(limit - used, 1)  # at its limit: 1 byte, not "unknown"
    return 0


# bytes a parameter takes at the least, however a run splits it: its fp32 weight and its gradient (Adam's
# two moments add 8 more, mixed precision a 16-bit copy)
LEAST_BYTES_PER_PARAM = 8


def check_model_fits(model: ModelConfig, device: str) -> None:
    """ConfigError, before any process starts, for a CPU run whose model's weights and gradients alone
    would not fit in the memory available, split over its ranks however it is: a vocabulary of 10**12
    had started a rank that failed allocating 256 TB."""
    memory, params = available_memory_bytes(), model.param_count()
    if device == "cpu" and memory and (least := LEAST_BYTES_PER_PARAM * params) > memory:
        raise ConfigError(f"the model's {params:,} parameters need at least "
                          f"{least / 2**30:,.1f} GiB for their weights and gradients, more than the "
                          f"{memory / 2**30:.1f} GiB this machine has available; use a smaller model")


def check_capacity(ranks: int, oversubscribe: bool = False) -> None:
    """ConfigError, before any process starts, when this machine cannot hold ``ranks`` local CPU
    ranks: more than MAX_RANKS_PER_CORE on each core, or more memory than is available. Says what
    would fit; ``oversubscribe`` (``--oversubscribe``) runs anyway."""
    cores, memory = usable_cores(), available_memory_bytes()
    fits = MAX_RANKS_PER_CORE * cores
    if memory:
        fits = min(fits, memory // RANK_MEMORY_BYTES)
    if ranks <= fits or oversubscribe:
        return
    raise ConfigError(
        f"{ranks} ranks do not fit this machine: {count_text(cores, 'core')} and "
        f"{memory / 2**30:.1f} GiB available hold about {fits} (at most {MAX_RANKS_PER_CORE} ranks per "
        f"core, about {RANK_MEMORY_BYTES >> 20} MiB each); use a world size <= {fits}, or "
        "oversubscribe=True to start them anyway")


def threads_for(cfg: TrainingConfig, local_world_size: int) -> int:
    """A fair share of this machine's cores for each rank on it (at least one)."""
    if cfg.threads_per_rank > 0:
        return cfg.threads_per_rank
    return max(1, usable_cores() // max(local_world_size, 1))


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


@contextmanager
def rank_session(cfg: TrainingConfig, layout: Layout, rank: int, world_size: int, local_rank: int,
                 local_world_size: int, init_method: str, nodes: int = 1, faults=None):
    """Set up one rank and yield its RankContext: threads, device, process group, every rank's node,
    recorder and memory meter; the shared clock starts right after a barrier, so all ranks' spans
    sit on one timeline. The process group is destroyed on the way out, whatever happened.

    ``cfg.device`` must be concrete ('cpu' or 'cuda'; the launcher resolves 'auto'): rank r uses
    cuda:LOCAL_RANK. ``nodes`` emulated nodes split a local launch (see :func:`_node_map`).
    ConfigError on every rank where two ranks' settings differ beyond what each may hold for itself
    (:func:`disagreement`)."""
    torch.set_num_threads(threads_for(cfg, local_world_size))
    device = torch.device("cuda", local_rank) if cfg.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    random_streams.seed_rank(cfg.seed, layout.coord(rank), device)
    groups_time_out_as_the_world(cfg.timeout_s)
    try:
        dist.init_process_group(
            backend_for(device.type), init_method=init_method, rank=rank, world_size=world_size,
            timeout=timedelta(seconds=cfg.timeout_s), device_id=device if device.type == "cuda" else None,
        )
    except RuntimeError as exc:  # torch's DistErrors and gloo's plain RuntimeErrors alike
        said = (str(exc).strip().splitlines() or [""])[0]  # the C++ stack follows
        raise GroupNotFormed(f"the process group did not form: {type(exc).__name__}: {said}") from exc
    try:
        node_of = _node_map(rank, world_size, nodes, cfg.to_dict())
        recorder = Recorder(rank, enabled=cfg.trace, cuda=device.type == "cuda", node_of=node_of.__getitem__)
        ctx = RankContext(cfg=cfg, layout=layout, rank=rank, world_size=world_size, local_rank=local_rank,
                          node=node_of[rank], device=device, recorder=recorder,
                          memory=MemoryMeter(device, recorder), faults=faults or RaiseOrHang(cfg, rank),
                          scaler=LossScaler(cfg.dtype, cfg.initial_loss_scale))
        dist.barrier()
        recorder.start_clock(align=_earliest_on_this_machine)
        recorder.activate()
        try:
            yield ctx
        finally:
            recorder.deactivate()
    finally:
        gc.collect()  # seen with gloo: without it a rank may abort at exit after destroy
        dist.destroy_process_group()


def _earliest_on_this_machine(t0: float) -> float:
    """The clock zero of the ranks on this machine: the earliest of theirs. perf_counter reads one
    monotonic clock for every process of a machine, so its ranks share one zero exactly instead of each
    taking its own on leaving the barrier, whose exits differ by milliseconds when ranks share cores
    (which would put a receive before its send). Machines still meet at the barrier."""
    host = socket.gethostname()
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (host, t0))
    return min(t for h, t in everyone if h == host)


def run_rank(cfg: RunConfig, layout: Layout, rank: int, world_size: int, local_rank: int,
             local_world_size: int, init_method: str, heartbeat=None, gather: bool = False):
    """Run one rank of a ``paralab run`` to the end. Returns (rank result, rank trace as a dict); with
    ``gather`` (torchrun, where no parent collects files) rank 0 also gets every rank's (result,
    trace) as a third item."""
    with rank_session(cfg, layout, rank, world_size, local_rank, local_world_size, init_method,
                      nodes=cfg.nodes) as ctx:
        ctx.recorder.on_step = heartbeat
        with profile_rank(ctx):
            result = get_strategy(cfg.strategy).train(ctx)
        meta = {"ranks": {rank: {"node": ctx.node, "device": str(ctx.device), "host": os.uname().nodename}}}
        if gather:  # each rank writes its own file: one id in all of them tells this run's from another's
            meta["run_id"] = _agreed_run_id(rank)
        trace = ctx.recorder.trace(meta=meta).to_dict()
        if not gather:
            return result, trace
        everyone = [None] * world_size if rank == 0 else None
        dist.gather_object((result, trace), everyone, dst=0)
        return result, trace, everyone


def _agreed_run_id(rank: int) -> str:
    """An id rank 0 draws for this run and every rank receives: a rerun of the same flags into the same
    --trace-dir, after a node that failed before writing, had left its stale files to merge in silence
    with the fresh ones (their settings agree)."""
    drawn = [uuid.uuid4().hex if rank == 0 else None]
    dist.broadcast_object_list(drawn, src=0)
    return drawn[0]


class GroupNotFormed(RuntimeError):
    """init_process_group failed: a peer that never joined (stopped or slow to start, which a rank
    waiting for it sees as a store's "Wait timeout"), or a rendezvous address that cannot be used."""


def groups_time_out_as_the_world(seconds: float) -> None:
    """Give every process group this rank makes after the world, paralab's (a pipeline's pairs, a
    hierarchical all-reduce's, expert groups) and torch's (a DeviceMesh's dimensions, FSDP2's, the
    pipelining schedules'), the run's ``--timeout``: torch gives a group made without one its 30-minute
    default, not the world's, so a rank hung inside a pipeline or a mesh had gone unnamed until the
    launcher's watchdog gave up on the whole run (35-43 s, no rank blamed), and under a torchrun of one's
    own for 30 minutes. torch reads the default (NCCL's its own, where NCCL is built) where it makes
    each group, and DeviceMesh passes none."""
    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = timedelta(seconds=seconds)
    if isinstance(distributed_c10d.default_pg_nccl_timeout, timedelta):
        distributed_c10d.default_pg_nccl_timeout = timedelta(seconds=seconds)


def _node_map(rank: int, world_size: int, nodes: int, agreed: dict) -> list[int]:
    """Node index of every rank: the node a launcher names (elastic's PARALAB_NODE, which stays with
    an agent across restarts, or torchrun's GROUP_RANK), else ``nodes`` emulated nodes of
    consecutive ranks on this machine. The same exchange compares the ranks' ``agreed`` settings by a
    digest of them: each rank's whole settings (a kilobyte) to every rank had been 250 MB of gathering
    at the start of a 500-rank run whose settings agree by construction. Only where two digests differ
    are the settings themselves gathered, to name what differs."""
    named = os.environ.get("PARALAB_NODE", os.environ.get("GROUP_RANK"))
    mine = int(named) if named is not None else rank // (world_size // nodes)
    digest = _digest(shared_settings(agreed))
    everyone: list = [None] * world_size
    dist.all_gather_object(everyone, (mine, digest))
    if len({theirs for _, theirs in everyone}) > 1:  # every rank sees the same digests: all gather alike
        settings: list = [None] * world_size
        dist.all_gather_object(settings, agreed)
        if differ := disagreement(settings):  # none where only a form differs (1 against 1.0)
            raise ConfigError(differ)
    return [node for node, _ in everyone]


def _digest(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def disagreement(settings: list[dict]) -> str | None:
    """What the first rank whose settings differ from rank 0's holds otherwise, or None where all agree
    (:func:`first_difference`). Under a torchrun of one's own each node's command line is typed apart:
    a --seed differing between nodes had trained on a mix of the two seeds' data in silence (exit 0),
    and a --steps differing hung until the collective timeout."""
    differ = first_difference([(f"rank {rank}", its) for rank, its in enumerate(settings)])
    if differ is None:
        return None
    rank, said = differ
    return (f"the ranks of this launch were given different settings: {rank} has {said}; "
            "give every node the same flags")


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


def from_the_wire(exc: BaseException) -> bool:
    """Whether the exception came from the communication library (torch.distributed's own errors,
    gloo's, raised as RuntimeError with its source path, or anything that kept the process group from
    forming: a file store's bare "Wait timeout" names no library): only those can be a peer's failure
    seen from here. A TimeoutError of the rank's own (reading a file, say) is its own failure."""
    return (isinstance(exc, (dist.DistError, GroupNotFormed))
            or (isinstance(exc, RuntimeError) and "gloo" in str(exc)))


def describe(exc: BaseException, timeout_s: float) -> str:
    """One line for the parent's RunError (C++ stack cut); a timeout says what it usually means."""
    text = cut_native_frames(f"{type(exc).__name__}: {exc}")
    if not (from_the_wire(exc) and ("timed out" in text.lower() or "timeout" in text.lower())):
        return text
    if isinstance(exc, GroupNotFormed):
        return f"{exc} (waited {timeout_s:g} s): another rank never joined (stopped, or much slower to start)"
    return (f"a collective timed out after {timeout_s:g} s: another rank stopped answering "
            f"(hung, or much slower than this one). {text}")


def write_error_report(report_dir: Path, rank: int, exc: BaseException, timeout_s: float) -> None:
    """What a failing rank leaves for whoever started it: ``rankN.error.json`` (error and traceback,
    and whether the error came from the communication library: paralab.runtime.failures)."""
    write_json(report_dir / f"rank{rank}.error.json", {
        "rank": rank, "error": describe(exc, timeout_s), "from_the_wire": from_the_wire(exc),
        "traceback": cut_native_frames(traceback.format_exc()),
    })


_STACK_FILES = []  # kept open for faulthandler, which writes to them from a signal handler


def dump_stacks(run_dir: Path, rank: int) -> None:
    """Where the launcher reads a rank's Python stack when the rank cannot say it: on SIGUSR1 (a rank
    that stopped answering, asked; it works while the rank sits in C++ code too) to ``rankN.stack``,
    and on a fatal signal (a segmentation fault, an abort in native code) to ``rankN.crash``."""
    for suffix, keep in (("stack", lambda f: faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)),
                         ("crash", lambda f: faulthandler.enable(file=f, all_threads=True))):
        stack_file = open(run_dir / f"rank{rank}.{suffix}", "w")
        _STACK_FILES.append(stack_file)
        keep(stack_file)


def heartbeat_to(run_dir: Path, rank: int):
    """A rank's ``on_step``: the last step it reached, in ``rankN.beat``, where its launcher's
    watchdog reads the run's progress (paralab.runtime.processes.ProgressWatch)."""
    beat = run_dir / f"rank{rank}.beat"
    return lambda step: beat.write_text(str(step))


# where a launcher names a rank's node (torchrun's agents, paralab elastic's): in a locally spawned rank
# such a variable can only be left over from a shell or a launcher above, and would override the nodes
# the run emulates (see _node_map)
NODE_ENV = ("GROUP_RANK", "PARALAB_NODE")


def forget_launchers_above() -> None:
    """Drop what a launcher above this process put in its environment to name a rank's node: a
    spawned rank's node is the one its config emulates."""
    for key in NODE_ENV:
        os.environ.pop(key, None)


def spawn_entry(rank: int, world_size: int, cfg_dict: dict, layout_dict: dict, run_dir: str) -> None:
    """Target of each rank process started by paralab.runtime.launch. Ranks meet through a file store
    in the private run directory, and talk over loopback (paralab.runtime.loopback). A rank ignores
    SIGINT: a terminal's Ctrl-C reaches the whole process group, and the launcher, which gets it too,
    stops every rank; a rank that took it as well could print a KeyboardInterrupt traceback from
    wherever the signal found it (a weak reference's callback reports one and carries on)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    forget_launchers_above()
    os.environ.update(transport_env())
    run_dir_path = Path(run_dir)
    dump_stacks(run_dir_path, rank)
    try:
        cfg, layout = RunConfig.from_dict(cfg_dict), Layout.from_dict(layout_dict)
        result, trace = run_rank(cfg, layout, rank, world_size, rank, world_size,
                                 f"file://{run_dir_path / 'store'}",
                                 heartbeat=heartbeat_to(run_dir_path, rank))
        state = result.pop("state", None)
        if state is not None:
            torch.save(state, run_dir_path / f"rank{rank}.state.pt")
        result["trace"] = trace
        write_json(run_dir_path / f"rank{rank}.json", result)
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        write_error_report(run_dir_path, rank, exc, cfg_dict["timeout_s"])
        sys.stdout.flush()
        os._exit(1)
