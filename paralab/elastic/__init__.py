"""Elastic training (弹性并行): training that survives workers coming and going.

    from paralab import elastic
    res = elastic.run(nodes=4, min_nodes=3, steps=8, fault={"rank": 2, "step": 5})
    res.losses, res.summary["world_sizes"], res.trace

Built on torchrun's elastic agent (paralab.elastic.launch starts one agent per local "node"), with
checkpoints that reshard to any world size (checkpoint), a worker whose maths does not depend on the
world size (train), resource monitoring into the trace (monitor) and throughput-based load balancing
(balance). ``paralab elastic ...`` is the shell face (cli).
"""

from __future__ import annotations

from paralab.elastic.config import ElasticConfig
from paralab.elastic.history import ElasticResult


def run(*, model="tiny", progress=None, trace_path: str | None = None, run_dir: str | None = None,
        **options) -> ElasticResult:
    """Run elastic training on local agents and return what happened.

    ``model`` is a preset name; ``options`` are ElasticConfig fields: nodes, min_nodes, max_nodes,
    steps, global_batch, micro_batch, checkpoint_dir, checkpoint_every, fault={"rank": R, "step": K},
    join_after_step, slow={"rank": R, "factor": F}, balance, ... A run that cannot work raises
    ConfigError before any process starts; a run that fails raises paralab.elastic.launch.ElasticError.
    """
    from paralab.elastic.launch import launch

    result = launch(ElasticConfig.build(model, **options), run_dir=run_dir, progress=progress)
    if trace_path:
        result.save_trace(trace_path)
    return result


__all__ = ["run", "ElasticConfig", "ElasticResult"]
