"""``paralab elastic ...``: the shell face of elastic training.

Exit codes as everywhere in paralab: 0 success; 2 invalid configuration (message on stderr, no process
started); 1 a run that failed. The same options are read by the worker (paralab.elastic.train), so
what the launcher checks is what the workers run.
"""

from __future__ import annotations

import argparse
import json
import sys

from paralab.cli import EXIT_OK, key_values
from paralab.config import MODEL_PRESETS
from paralab.elastic.config import ElasticConfig


def node_range(text: str) -> tuple[int, int]:
    """torchrun's ``--nnodes``: ``N`` or ``MIN:MAX``."""
    lo, _, hi = text.partition(":")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nnodes takes N or MIN:MAX, got {text!r}") from None


def add_elastic_args(p: argparse.ArgumentParser) -> None:
    d = ElasticConfig()
    p.add_argument("--nnodes", type=node_range, default=(d.min_nodes, d.max_nodes), metavar="MIN:MAX",
                   help="node range of the rendezvous (torchrun's --nnodes); one worker per node")
    p.add_argument("--nodes", type=int, default=0, help="nodes (agents) to start with (default: MAX)")
    p.add_argument("--max-restarts", type=int, default=d.max_restarts, help="restarts each agent allows")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--model", default=d.model, help=f"preset: {', '.join(MODEL_PRESETS)}")
    p.add_argument("--global-batch", type=int, default=d.global_batch, help="samples per step, whatever the world size")
    p.add_argument("--micro-batch", type=int, default=d.micro_batch, help="samples per forward (gradient accumulation)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--optimizer", default=d.optimizer, choices=("adam", "sgd"))
    p.add_argument("--device", default=d.device, choices=("cpu", "cuda"))
    p.add_argument("--checkpoint-dir", help="where checkpoints go (default: a fresh directory per run)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="steps between checkpoints")
    p.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints)
    p.add_argument("--fail", type=key_values, metavar="rank=R,step=K[,during=save]",
                   help="SIGKILL the worker that is rank R (and its agent: the node is lost) at step K")
    p.add_argument("--join-after-step", type=int, metavar="K", help="start one more node after step K (scale-out)")
    p.add_argument("--slow", type=key_values, metavar="rank=R,factor=F", help="make rank R F times slower")
    p.add_argument("--balance", action="store_true", help="split each global batch by measured throughput")
    p.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds a collective may hang")
    p.add_argument("--run-timeout", type=float, default=d.run_timeout_s, help="seconds the whole run may take")
    p.add_argument("--last-call", type=int, default=d.last_call_s,
                   help="rendezvous: seconds to wait for more nodes once MIN have joined")
    p.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: a fair share of the cores)")
    p.add_argument("--no-trace", action="store_true", help="record step spans only")
    p.add_argument("--trace", metavar="PATH", help="write the merged trace in Chrome trace format (Perfetto)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def config_from_args(args) -> ElasticConfig:
    (lo, hi) = args.nnodes
    return ElasticConfig(
        model=args.model, steps=args.steps, global_batch=args.global_batch, micro_batch=args.micro_batch,
        seed=args.seed, lr=args.lr, optimizer=args.optimizer, device=args.device, min_nodes=lo, max_nodes=hi,
        nodes=args.nodes, max_restarts=args.max_restarts, join_after_step=args.join_after_step,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints, fail=args.fail, slow=args.slow, balance=args.balance,
        timeout_s=args.timeout, run_timeout_s=args.run_timeout, last_call_s=args.last_call, threads=args.threads,
        trace=not args.no_trace,
    )


def elastic_main(args) -> int:
    """``paralab elastic``: ConfigError (exit 2) and ElasticError, a RunError (exit 1), are reported by
    paralab.cli.main like every other command's."""
    from paralab.elastic.launch import launch

    result = launch(config_from_args(args))
    if args.trace:
        result.save_trace(args.trace)
    print(json.dumps(result.summary) if args.json else result.describe())
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """``python -m paralab.elastic ...`` is ``paralab elastic ...``."""
    from paralab.cli import main as paralab_main

    return paralab_main(["elastic", *(sys.argv[1:] if argv is None else argv)])
