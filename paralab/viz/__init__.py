"""Figure builders: Trace / results -> plotly figures.

Every function takes a :class:`paralab.trace.Trace` (measured or simulated) or a RunResult and
returns a ``plotly.graph_objects.Figure``. plotly is imported only when a figure is built, so this
package imports on a machine without it. Each figure records what it drew in ``fig.layout.meta``
(ranks, rows, totals), which the widgets and tests read.
"""

from paralab.viz.bubble import bubble, bubble_vs_microbatches
from paralab.viz.comm import comm_by_dimension, comm_by_op, comm_link_split, comm_matrix, comm_matrix_data
from paralab.viz.context import activation_growth, attention_per_rank, cp_modes
from paralab.viz.elastic import elastic, elastic_balance, elastic_phases
from paralab.viz.loss import loss_curves
from paralab.viz.memory import measured_vs_predicted, memory, memory_vs
from paralab.viz.mesh import mesh
from paralab.viz.moe import expert_cost, expert_load
from paralab.viz.published import published_errors, published_scaling
from paralab.viz.scaling import scaling, speedup_timeline
from paralab.viz.timeline import timeline

__all__ = [
    "timeline", "bubble", "bubble_vs_microbatches", "comm_by_op", "comm_by_dimension", "comm_matrix",
    "comm_matrix_data", "comm_link_split", "scaling", "speedup_timeline", "memory", "measured_vs_predicted",
    "memory_vs", "elastic", "elastic_balance", "elastic_phases",
    "loss_curves", "mesh", "attention_per_rank", "activation_growth", "cp_modes", "expert_load",
    "expert_cost", "published_errors", "published_scaling",
]
