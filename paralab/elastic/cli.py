"""``paralab elastic ...``: the shell face of elastic training.

Exit codes as everywhere in paralab: 0 success; 2 invalid configuration (message on stderr, no process
started); 1 a run that failed. The same options are read by the worker (paralab.elastic.train), so
what the launcher checks is what the workers run.
"""

from __future__ import annotations

import argparse

from paralab.cli_args import (
    EXIT_OK,
    NeedsTheKeysOfItsMetavar,
    add_training_args,
    build_config,
    json_text,
    key_values,
)
from paralab.config import MODEL_PRESETS
from paralab.elastic.config import ElasticConfig
from paralab.outputs import check_file


def node_range(text: str) -> tuple[int, int]:
    """torchrun's ``--nnodes``: ``N`` or ``MIN:MAX``."""
    lo, _, hi = text.partition(":")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nnodes takes N or MIN:MAX, got {text!r}") from None


def add_elastic_args(p: argparse.ArgumentParser) -> None:
    d = ElasticConfig()
    add_training_args(p, d, presets=[name for name, model in MODEL_PRESETS.items() if not model.experts],
                      fault_help="its node is lost (during=save: in the middle of a checkpoint)")
    # a default written as typed (argparse parses a string default as it parses the flag): --help shows
    # 1:4, where the tuple had shown Python's (1, 4)
    p.add_argument("--nnodes", type=node_range, default=f"{d.min_nodes}:{d.max_nodes}", metavar="MIN:MAX",
                   help="node range of the rendezvous (torchrun's --nnodes); one worker per node")
    p.add_argument("--nodes", type=int, default=None, help="nodes (agents) to start with (default: MAX)")
    p.add_argument("--max-restarts", type=int, default=d.max_restarts, help="restarts each agent allows")
    p.add_argument("--micro-batch", type=int, default=d.micro_batch,
                   help="samples per forward (gradient accumulation)")
    p.add_argument("--checkpoint-dir", help="where checkpoints go (paralab elastic: a fresh directory per "
                   "run if not given; a worker under a torchrun of your own needs one every node can reach)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                   help="steps between checkpoints")
    p.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints,
                   help="newest checkpoints kept on disk")
    p.add_argument("--join-after-step", type=int, metavar="K",
                   help="start one more node after step K (scale-out)")
    p.add_argument("--slow", type=key_values, action=NeedsTheKeysOfItsMetavar, metavar="rank=R,factor=F",
                   help="make rank R F times slower (whichever worker holds rank R: a world formed again "
                        "after a loss numbers its ranks anew)")
    p.add_argument("--balance", action="store_true", help="split each global batch by measured throughput")
    p.add_argument("--run-timeout", type=float, default=d.run_timeout_s,
                   help="seconds the whole run may take")
    p.add_argument("--last-call", type=int, default=d.last_call_s,
                   help="rendezvous: seconds to wait for more nodes once MIN have joined")


def config_from_args(args) -> ElasticConfig:
    (lo, hi) = args.nnodes
    return build_config(
        ElasticConfig, args, micro_batch=args.micro_batch, min_nodes=lo, max_nodes=hi,
        nodes=args.nodes, max_restarts=args.max_restarts, join_after_step=args.join_after_step,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints, slow=args.slow, balance=args.balance,
        run_timeout_s=args.run_timeout, last_call_s=args.last_call,
    )


def elastic_main(args) -> int:
    """``paralab elastic``: ConfigError (exit 2) and ElasticError, a RunError (exit 1), are reported by
    paralab.cli.main like every other command's."""
    from paralab.elastic.launch import launch

    cfg = config_from_args(args).validate()  # a config that cannot work says so before anything else
    if args.trace:
        check_file(args.trace, "--trace")
    result = launch(cfg)
    if args.trace:
        result.save_trace(args.trace)
    print(json_text(result.summary) if args.json else result.describe())
    return EXIT_OK
