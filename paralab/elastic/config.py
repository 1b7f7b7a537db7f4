"""One validated description of an elastic run, shared by the launcher, the CLI and every worker.

The launcher checks it before any process starts (a bad run is a ConfigError, exit 2), then hands it
to each worker as command-line arguments, so ``torchrun ... -m paralab.elastic.train ARGS`` on a
cluster reads exactly the same options as ``paralab elastic ARGS`` on one machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from paralab.config import (
    MAX_TIMEOUT_S,
    MODEL_PRESETS,
    ConfigError,
    PathOption,
    TrainingConfig,
    check_int,
    check_positive,
    finite_number,
    resolve_device,
)
from paralab.text import count_text

STRATEGY = "elastic-ddp"  # what a checkpoint's signature calls the way its weights were trained


@dataclass
class ElasticConfig(TrainingConfig):
    """An elastic run: TrainingConfig's fields (model, steps, batch, optimizer, device, limits, fault)
    plus membership, checkpoints and load balancing. ``fault`` here takes a whole node away: the
    worker that is rank R at step K is SIGKILLed with its agent (``during="save"``: in the middle of
    the checkpoint saved after step K)."""

    # defaults that suit elastic runs: room for a failure and a recovery, a batch that 1-4 nodes
    # split evenly, and a hung peer noticed within a minute
    steps: int = 8
    global_batch: int = 12
    timeout_s: float = 60.0
    micro_batch: int = 4  # gradient accumulation: at most this many samples per forward on a rank
    # membership: torchrun's --nnodes MIN:MAX; `nodes` agents start at once
    min_nodes: int = 1
    max_nodes: int = 4
    nodes: int | None = None  # None: max_nodes
    max_restarts: int = 3
    join_after_step: int | None = None  # start one more agent once this step has completed
    # checkpoints
    checkpoint_dir: PathOption = None  # None: a fresh directory inside the run directory
    checkpoint_every: int = 2
    keep_checkpoints: int = 2
    # load balancing
    slow: dict | None = None  # {"rank": R, "factor": F}
    balance: bool = False
    run_timeout_s: float = 600.0  # the whole run, launcher side
    # rendezvous: seconds to wait for more nodes once min_nodes are in (torchrun: whole s)
    last_call_s: int = 2

    FAULT_OPTIONS = {"during": ("step", "save")}

    def __post_init__(self):
        super().__post_init__()
        if self.nodes is None:
            self.nodes = self.max_nodes

    def signature(self) -> dict:
        """What a checkpoint must match to be resumed by this run: the model, how it is trained and
        the data order (global batch and seed fix which samples each step holds)."""
        return {"model": dataclasses.asdict(self.model), "strategy": STRATEGY,
                "optimizer": self.optimizer, "global_batch": self.global_batch, "seed": self.seed}

    def validate(self) -> ElasticConfig:
        super().validate()
        if self.model_name not in MODEL_PRESETS:
            raise ConfigError(f"elastic workers build the model from a preset name; choose one of "
                              f"{sorted(MODEL_PRESETS)}, not a custom model")
        if self.model.experts:
            raise ConfigError("not supported: elastic training of a mixture of experts "
                              f"({self.model_name!r}): its load-balancing loss is not weighted by each "
                              "worker's share of the batch; use a dense model")
        for name in ("micro_batch", "checkpoint_every", "keep_checkpoints", "min_nodes", "max_nodes",
                     "nodes"):
            check_int(name.replace("_", " "), getattr(self, name), low=1)
        check_int("last call (s)", self.last_call_s, low=1)
        check_int("max restarts", self.max_restarts, low=0)
        check_positive("run timeout", self.run_timeout_s, unit=" s", high=MAX_TIMEOUT_S)
        if self.min_nodes > self.max_nodes:
            raise ConfigError(f"min nodes {self.min_nodes} > max nodes {self.max_nodes}: "
                              "--nnodes takes MIN:MAX with MIN <= MAX, "
                              f"e.g. {self.max_nodes}:{self.min_nodes}")
        if self.balance and self.max_nodes == 1:  # a flag that changes nothing is refused, as run refuses one
            raise ConfigError("--balance splits each global batch over the nodes by their measured speed; "
                              f"--nnodes {self.min_nodes}:1 never has more than one node: leave it out")
        if not self.min_nodes <= self.nodes <= self.max_nodes:
            raise ConfigError(f"{count_text(self.nodes, 'starting node')} (--nodes) is outside --nnodes "
                              f"{self.min_nodes}:{self.max_nodes}")
        if self.global_batch < self.max_nodes:
            raise ConfigError(f"global batch {self.global_batch} is smaller than max nodes {self.max_nodes}: "
                              "every worker needs at least one sample")
        resolve_device(self.device, self.max_nodes)  # one worker per node, every local node its own GPU
        if self.dtype != "fp32":
            raise ConfigError("elastic training runs fp32: its checkpoints reshard the model and optimizer "
                              "with torch.distributed.checkpoint, which does not hold paralab's fp32 master "
                              f"weights beside {self.dtype} parameters; "
                              f"dtype={self.dtype!r} is for paralab run")
        self._validate_fail()
        self._validate_join()
        self._validate_slow()
        return self

    def saves_after(self, step: int) -> bool:
        """A checkpoint is saved after step ``step``: every ``checkpoint_every`` steps, and after the last."""
        return (step + 1) % self.checkpoint_every == 0 or step + 1 == self.steps

    def _validate_fail(self) -> None:
        if self.fault is None:
            return
        rank, step, during = self.fault["rank"], self.fault["step"], self.fault.get("during", "step")
        if rank >= self.nodes:
            raise ConfigError(f"fail rank must be in [0, {self.nodes}) (one worker per node), got {rank!r}")
        if step >= self.steps:
            raise ConfigError(f"fail step {step!r} is beyond the run: steps are 0..{self.steps - 1}")
        if during == "save" and not self.saves_after(step):
            saves = [k for k in range(self.steps) if self.saves_after(k)]
            raise ConfigError(f"no checkpoint is saved after step {step} (every {self.checkpoint_every} "
                              f"steps: after steps {saves})")
        if self.nodes - 1 < self.min_nodes:
            left = self.nodes - 1
            # MIN is 1 at the least: a run of one node has no survivor, whatever MIN says
            remedy = (f"lower MIN in --nnodes {self.min_nodes}:{self.max_nodes}" if self.min_nodes > 1 else
                      f"start 2 nodes or more (--nnodes 1:{max(self.max_nodes, 2)} --nodes 2)")
            raise ConfigError(f"after the failure {count_text(left, 'node')} remain{'s' * (left == 1)}, "
                              f"fewer than min nodes {self.min_nodes}: {remedy}")
        if self.max_restarts < 1:
            raise ConfigError("a failure needs --max-restarts >= 1 for the survivors to restart")

    def _validate_join(self) -> None:
        if self.join_after_step is None:
            return
        if not 0 <= self.join_after_step < self.steps - 1:
            raise ConfigError(f"join after step {self.join_after_step} is outside the run: steps are "
                              f"0..{self.steps - 1} and the new node needs a step left to join")
        if self.nodes - (self.fault is not None) >= self.max_nodes:  # a planned failure makes room
            raise ConfigError(f"no room to join: {self.nodes} nodes already run and max nodes is "
                              f"{self.max_nodes}")

    def _validate_slow(self) -> None:
        if self.slow is None:
            return
        if not isinstance(self.slow, dict) or set(self.slow) != {"rank", "factor"}:
            raise ConfigError(f"slow takes rank and factor, both (like rank=1,factor=3), got {self.slow!r}")
        rank, factor = self.slow.get("rank"), self.slow.get("factor")
        # the largest world the run has: the nodes started, and one more where one joins (a rank beyond
        # them had been accepted, with --nnodes 2:3 and 2 started, and slowed nothing in silence)
        ranks = self.nodes + (self.join_after_step is not None)
        if not isinstance(rank, int) or not 0 <= rank < ranks:
            raise ConfigError(f"slow rank must be in [0, {ranks}) (the ranks of the largest world this run "
                              f"has), got {rank!r}")
        if not finite_number(factor) or factor < 1:
            raise ConfigError("slow factor must be >= 1 (1 = normal speed, 3 = three times slower), "
                              f"got {factor!r}")

    # ------------------------------------------------------------------ to and from workers
    def to_argv(self) -> list[str]:
        """Options for ``python -m paralab.elastic.train``: every field, so that cli.config_from_args
        parses back this very config (tests/test_elastic.py holds the round trip)."""
        argv = ["--model", self.model_name, "--attention", self.model.attention, "--steps", str(self.steps),
                "--global-batch", str(self.global_batch),
                "--micro-batch", str(self.micro_batch), "--seed", str(self.seed), "--lr", repr(self.lr),
                "--optimizer", self.optimizer, "--device", self.device,
                "--dtype", self.dtype, "--reduce-dtype", self.reduce_dtype,
                "--recompute", self.recompute,
                "--nnodes", f"{self.min_nodes}:{self.max_nodes}", "--nodes", str(self.nodes),
                "--max-restarts", str(self.max_restarts),
                "--checkpoint-every", str(self.checkpoint_every),
                "--keep-checkpoints", str(self.keep_checkpoints),
                "--timeout", repr(self.timeout_s), "--threads", str(self.threads_per_rank),
                "--run-timeout", repr(self.run_timeout_s), "--last-call", str(self.last_call_s)]
        if self.loss_scale is not None:  # only when given: elastic runs fp32, which refuses one
            argv += ["--loss-scale", repr(self.loss_scale)]
        if self.join_after_step is not None:
            argv += ["--join-after-step", str(self.join_after_step)]
        if self.oversubscribe:
            argv.append("--oversubscribe")
        if self.checkpoint_dir:
            argv += ["--checkpoint-dir", self.checkpoint_dir]
        if self.fault:
            argv += ["--fail", ",".join(f"{k}={v}" for k, v in self.fault.items())]
        if self.slow:
            argv += ["--slow", ",".join(f"{k}={v}" for k, v in self.slow.items())]
        if self.balance:
            argv.append("--balance")
        if not self.trace:
            argv.append("--no-trace")
        return argv
