"""The elastic worker: what each process started by torchrun's elastic agent runs.

    torchrun --nnodes 2:4 --nproc-per-node 1 --max-restarts 3 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:PORT -m paralab.elastic.train --steps 100 --checkpoint-dir /shared/ckpt

It is data parallel over whatever world the last rendezvous formed, and it is written so that the
world may change between any two steps without changing the training:

- the global batch of step k is a fixed list of sample ids (paralab.data), cut into one slice per rank
  (evenly, or in proportion to measured speed with ``--balance``); each rank runs its slice in
  micro-batches (gradient accumulation), every sample's loss weighted by 1 / global batch, and the
  gradients are summed over ranks: the update is the global-batch mean whatever the world size;
- every ``--checkpoint-every`` steps the model, optimizer, step and RNG state are checkpointed
  (paralab.elastic.checkpoint); a new world resumes from the last checkpoint, so the steps after it
  are redone by the new world and every sample is trained on exactly once in the final history;
- each rank streams its step records (sample ids, loss, world size) and its trace into a run
  directory, so what a killed worker did survives it (paralab.elastic.history reads them back).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from paralab import comm
from paralab.cli_args import EXIT_INVALID, EXIT_OK, json_text
from paralab.config import ConfigError
from paralab.elastic import checkpoint
from paralab.elastic.balance import Balancer, Slowdown
from paralab.elastic.config import ElasticConfig
from paralab.elastic.history import ElasticResult
from paralab.elastic.monitor import Monitor
from paralab.layout import Layout
from paralab.models.gpt import GPT, lm_loss
from paralab.outputs import check_dir, check_file
from paralab.precision import torch_dtype
from paralab.runtime.worker import die_with_parent, rank_session, write_json
from paralab.strategies.common import (
    GradSync,
    flatten_grads,
    make_buckets,
    make_loader,
    make_optimizer,
    prepare,
    train_loop,
    unflatten_grads,
)

BUCKET_BYTES = 25 * 2**20
PROG = "python -m paralab.elastic.train"
# paralab elastic's flags, which its launcher and agents read: a worker under a torchrun of one's own
# refuses them
LAUNCHER_FLAGS = ("--nnodes", "--nodes", "--max-restarts", "--join-after-step", "--run-timeout",
                  "--last-call")
WHOSE = ("paralab elastic's, which starts the agents: under a torchrun of your own, torchrun's --nnodes "
         "and --max-restarts say them")


class FaultInjector:
    """``--fail rank=R,step=K``: the worker that is rank R at step K loses its node. It SIGKILLs its
    agent and then itself (a real SIGKILL: no exception, no cleanup), so the node leaves the job and the
    survivors rescale without it. ``during=save`` does it in the middle of the checkpoint saved after
    step K. It fires once per run: a marker in the run directory stops a redone step K from firing again.
    """

    def __init__(self, fault: dict | None, rank: int, run_dir: Path, monitor: Monitor):
        self.fault, self.rank, self.monitor = fault, rank, monitor
        self.marker = run_dir / "fault.json"

    def _armed(self, step: int, during: str) -> bool:
        f = self.fault
        return (f is not None and int(f["rank"]) == self.rank and int(f["step"]) == step
                and f.get("during", "step") == during and not self.marker.exists())

    def at_step(self, step: int) -> None:
        if self._armed(step, "step"):
            self._kill(step, "step")

    def during_save(self, step: int):
        return (lambda: self._kill(step, "save")) if self._armed(step, "save") else None

    def _kill(self, step: int, during: str) -> None:
        when = f"during step {step}" if during == "step" else f"while saving the checkpoint after step {step}"
        self.monitor.mark("failure", f"SIGKILL (node lost) {when}",  # not "at step 3, during step"
                          self.monitor.rec.now(), self.monitor.rec.now())
        self.monitor.flush()
        write_json(self.marker, {"rank": self.rank, "step": step, "during": during, "t": time.time()})
        if "TORCHELASTIC_RUN_ID" in os.environ:
            os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class SumGradients(GradSync):
    """Sums the accumulated gradients over ranks in buckets (one all-reduce per bucket). The losses
    were already weighted by 1 / global batch, so the sum is the global-batch mean whatever each
    rank's share of the batch."""

    def __init__(self, model: torch.nn.Module, reduce_dtype: torch.dtype = torch.float32):
        self.buckets = make_buckets([p for p in model.parameters() if p.requires_grad], BUCKET_BYTES)
        self.reduce_dtype = reduce_dtype

    def after_backward(self) -> None:
        flats = [flatten_grads(bucket).to(self.reduce_dtype) for bucket in self.buckets]
        works = [comm.all_reduce(flat, async_op=True, name=f"bucket {i}") for i, flat in enumerate(flats)]
        for bucket, flat, work in zip(self.buckets, flats, works):
            work.wait()
            unflatten_grads(bucket, flat)


class Worker:
    """One elastic worker in the world its rendezvous formed (``ctx``: its rank session)."""

    def __init__(self, cfg: ElasticConfig, run_dir: Path, ctx, entered: float, started: float | None = None):
        self.cfg, self.run_dir, self.ctx = cfg, run_dir, ctx
        self.ckpt_dir = Path(cfg.checkpoint_dir)
        self.rank, self.world, self.rec = ctx.rank, ctx.world_size, ctx.recorder
        shared = [None, time.time()]
        if self.rank == 0:  # name this generation (one per membership)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            shared[0] = f"gen-{len(list(self.run_dir.glob('gen-*'))):03d}"
            (self.run_dir / shared[0]).mkdir()
        dist.broadcast_object_list(shared, src=0)
        self.gen_dir, self.wall_start = self.run_dir / shared[0], shared[1]
        self.nodes = [ctx.recorder.node_of(r) for r in range(self.world)]
        self.monitor = Monitor(self.rec, ctx.device, self.gen_dir / f"rank{self.rank}.trace.jsonl")
        if started is not None:  # from the agent's spawn to the training code: Python, torch, paralab
            self.monitor.mark("worker_start", "worker process starts (Python, torch, paralab)",
                              started - self.wall_start, entered - self.wall_start)
        self.monitor.mark("rendezvous", f"rendezvous: world of {self.world}", entered - self.wall_start, 0.0)
        self.injector = FaultInjector(cfg.fault, self.rank, run_dir, self.monitor)
        ctx.faults = self.injector  # an elastic failure takes the whole node, not just this rank

    def resume(self, model, optimizer) -> int:
        """Load the latest complete checkpoint, whatever world size wrote it; the step to start at."""
        checkpoint.check_signature(self.ckpt_dir, self.cfg.signature())
        chosen = [str(checkpoint.latest(self.ckpt_dir) or "")]
        dist.broadcast_object_list(chosen, src=0)  # every rank loads the same one
        start, saved_world = 0, None
        if chosen[0]:
            path = Path(chosen[0])
            with self.monitor.event("checkpoint_load", f"load {path.name}"):
                manifest = checkpoint.load(path, model, optimizer)
            start, saved_world = manifest["step"], manifest["world_size"]
        if self.rank == 0:
            write_json(self.gen_dir / "meta.json", {
                "world_size": self.world, "start_step": start, "checkpoint": Path(chosen[0]).name or None,
                "checkpoint_world_size": saved_world, "wall_start": self.wall_start, "nodes": self.nodes,
                "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            })
        return start

    # ------------------------------------------------------------------ training
    def train(self) -> None:
        """The shared training loop (paralab.strategies.common.train_loop), with this rank's slice of
        each global batch cut by the balancer, gradients summed over ranks, and after each step the
        step record, the monitor's sample and, every few steps, a checkpoint."""
        cfg, ctx = self.cfg, self.ctx
        model = prepare(ctx, GPT(cfg.model, cfg.seed))
        optimizer = make_optimizer(cfg, model.parameters(), ctx)
        ctx.memory.watch(list(model.parameters()), optimizer)
        start = self.resume(model, optimizer)
        data = make_loader(ctx)
        balancer, slowdown = Balancer(self.world, cfg.balance, ctx.device), Slowdown(cfg.slow, self.rank)
        records = open(self.gen_dir / f"rank{self.rank}.steps.jsonl", "a")
        this_step: dict = {}

        def batch_of(step: int) -> list[list[int]]:
            ids = balancer.shard(data.global_ids(step), self.rank)
            this_step.update(ids=ids, began=time.time(), t0=self.rec.now(), compute_s=0.0)
            return [ids[lo : lo + cfg.micro_batch] for lo in range(0, len(ids), cfg.micro_batch)]

        def forward_backward(chunks: list[list[int]]) -> float:
            """Each micro-batch's loss weighted by its share of the global batch: the gradients
            accumulate to this rank's part of the global-batch mean."""
            loss_part = 0.0
            for mb, chunk in enumerate(chunks):
                began = time.perf_counter()
                self.rec.set_context(microbatch=mb)
                inputs, targets = data.corpus.batch(chunk, ctx.device)
                with self.rec.span("forward"):
                    loss = lm_loss(model(inputs), targets) * (len(chunk) / cfg.global_batch)
                with self.rec.span("backward"):
                    ctx.scaler.scale(loss).backward()
                loss_part += loss.item()
                if slowdown.factor > 1.0:
                    with self.rec.span("slowdown", name=f"slowdown x{slowdown.factor:g}"):
                        slowdown.after(time.perf_counter() - began)
                this_step["compute_s"] += time.perf_counter() - began
            self.rec.set_context(microbatch=None)
            return loss_part

        def after_step(step: int, loss: float) -> None:
            step_time = self.rec.now() - this_step["t0"]
            ids = this_step["ids"]
            balancer.observe(len(ids), this_step["compute_s"])
            records.write(json.dumps({"step": step, "world_size": self.world, "loss": loss, "ids": ids,
                                      "compute_s": this_step["compute_s"], "t_start": this_step["began"],
                                      "t_end": time.time()}) + "\n")
            records.flush()
            self.monitor.sample(step_time, self.world)
            if cfg.saves_after(step):
                self.save(step, model, optimizer, data)
            if self.rank == 0:
                write_json(self.run_dir / "progress.json", {"step": step, "generation": self.gen_dir.name})
            self.monitor.flush()

        train_loop(ctx, optimizer, SumGradients(model, torch_dtype(cfg.reduce_dtype)),
                   forward_backward, batch_of, first_step=start, after_step=after_step)
        records.close()
        if self.rank == 0:
            write_json(self.gen_dir / "done.json", {"steps": cfg.steps, "t": time.time()})

    def save(self, step: int, model, optimizer, data) -> None:
        done = step + 1
        epoch, index = divmod(done, data.sampler.steps_per_epoch)
        with self.monitor.event("checkpoint_save", f"save step-{done:08d}"):
            checkpoint.save(self.ckpt_dir, done, model, optimizer, self.cfg.signature(),
                            {"next_step": done, "epoch": epoch, "step_in_epoch": index},
                            keep=self.cfg.keep_checkpoints, before_commit=self.injector.during_save(step))

    def report_error(self, exc: BaseException) -> None:
        """Survivors of a failure land here (a collective with a dead peer raises): the time is when
        the failure was detected."""
        write_json(self.gen_dir / f"rank{self.rank}.error.json",
                   {"t": time.time(), "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()})
        self.monitor.mark("failure_detected", f"peer lost: {type(exc).__name__}", self.rec.now(),
                          self.rec.now())
        self.monitor.flush()


def process_started() -> float | None:
    """When this process started, on the wall clock: the moment its agent spawned it, which comes right
    after the agent's rendezvous and before Python imported torch. From /proc (10 ms ticks, counted
    against the uptime rather than the boot time, which /proc gives in whole seconds); None elsewhere,
    or where the two disagree (a container whose /proc/uptime is its own, not the kernel's)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        return None
    now = time.time()
    started = now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    return started if 0.0 <= now - started < 600.0 else None  # Python and torch start in seconds


def default_run_dir(cfg: ElasticConfig) -> Path:
    return Path(cfg.checkpoint_dir) / f"run-{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}"


def main(argv: list[str] | None = None) -> int:
    """A worker's life: exit 2, one line, where its settings cannot run (a flag's value, a checkpoint
    directory that is not one, nodes given different flags: torchrun's error file names it, and each
    restart torchrun allows is refused alike); 0 once trained. Under a torchrun of one's own, rank 0 of
    the world that finishes prints the run's summary (``--json``: as JSON) and writes ``--trace``, as
    ``paralab elastic`` does; under ``paralab elastic`` its launcher does both."""
    from paralab.elastic.cli import add_elastic_args, config_from_args
    from paralab.runtime.torchrun import errors_told_to_torchrun

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0], allow_abbrev=False,
                                     epilog=f"{', '.join(LAUNCHER_FLAGS[:-1])} and {LAUNCHER_FLAGS[-1]} "
                                            f"are {WHOSE}")
    add_elastic_args(parser)
    parser.add_argument("--run-dir",
                        help="where step records and traces go (default: inside --checkpoint-dir)")
    args = parser.parse_args(argv)
    try:
        with errors_told_to_torchrun():
            refuse_launcher_flags(parser, sys.argv[1:] if argv is None else argv)
            result = _train(args, config_from_args(args))
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if result is not None:
        if args.trace:
            result.save_trace(args.trace)
        print(json_text(result.summary) if args.json else result.describe())
    return EXIT_OK


def refuse_launcher_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """ConfigError for a flag of :data:`LAUNCHER_FLAGS` given to a worker under a torchrun of one's
    own, where nothing reads it, whatever its value: ``--max-restarts 1`` had passed, and torchrun
    restarted as its own flag said. What was given is read by parsing ``argv`` again with no defaults
    (a value equal to the default is given too, and ``--flag=value`` is read as argparse reads it; an
    abbreviation is refused, as ``paralab``'s own flags refuse one)."""
    from paralab.runtime.agents import AGENT_PID

    if AGENT_PID in os.environ:  # paralab elastic's own agents pass every flag
        return
    bare = copy.deepcopy(parser)
    for action in bare._actions:  # argparse keeps no public list of a parser's flags
        action.default = argparse.SUPPRESS
    given = vars(bare.parse_args(argv))
    for flag in LAUNCHER_FLAGS:
        if flag[2:].replace("-", "_") in given:
            raise ConfigError(f"{flag} is {WHOSE}; leave it out")


def shared_store_warning(env) -> str | None:
    """What a torchrun that shares its rendezvous store with its workers (torch's default) does to an
    elastic job, where it may restart: the store outlives the world, so the world formed again after a
    node is lost reads its gloo addresses from the last one's keys and may never form (torch 2.13: the
    survivor's restarts all failed connecting to a dead worker's address; with the store not shared, as
    ``paralab elastic``'s agents run, the world of the survivor trained on 45 s after the kill, and a
    node started again rejoined). None where it does not apply."""
    shared = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if not shared or int(env.get("TORCHELASTIC_MAX_RESTARTS", 0)) == 0:
        return None
    return ("torchrun shares its rendezvous store with these workers: a world formed again after a node "
            "is lost may read the last world's addresses from it and never form; for the job to outlive a "
            "node, start each torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment")


def _train(args, cfg: ElasticConfig) -> ElasticResult | None:
    """Train this rank; the run's result on the rank that reports it (see :func:`main`), else None."""
    from paralab.runtime.agents import AGENT_PID

    said = shared_store_warning(os.environ)
    if said and os.environ.get("RANK") == "0" and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        print(f"{PROG}: warning: {said}", file=sys.stderr)
    cfg.validate()
    if not cfg.checkpoint_dir:
        raise ConfigError("--checkpoint-dir is required (a directory every node can reach)")
    check_dir(cfg.checkpoint_dir, "--checkpoint-dir")
    if args.trace:
        check_file(args.trace, "--trace")
    die_with_parent()  # a node whose agent is gone is gone
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(cfg)
    entered, started = time.time(), process_started()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    layout = Layout("elastic", world, cfg.global_batch, dp=world)  # data parallel over whoever is here
    with rank_session(cfg, layout, rank, world, int(os.environ.get("LOCAL_RANK", 0)),
                      int(os.environ.get("LOCAL_WORLD_SIZE", 1)), "env://") as ctx:
        worker = Worker(cfg, run_dir, ctx, entered, started)
        try:
            worker.train()
        except BaseException as exc:
            worker.report_error(exc)
            raise
        if AGENT_PID in os.environ:  # paralab elastic's own agents: its launcher collects the run
            return None
        dist.barrier()  # every rank's records and trace written
        return ElasticResult.collect(cfg, run_dir, own_agents=False) if rank == 0 else None


if __name__ == "__main__":
    from paralab.runtime.torchrun import end_rank

    end_rank(main())  # without the interpreter's teardown, which could fail a generation that finished
