"""Activation recomputation (Chen et al. 2016; Korthikanti et al. 2022): keep less for backward and
compute it again when backward needs it.

- ``full``: each transformer block keeps only its input; its forward runs a second time at the start
  of its backward. Activation memory per layer falls from about 16 copies of the layer input (plus
  the attention core) to one, for about a third more compute.
- ``selective``: only each attention core is recomputed: the term that grows with the sequence
  squared (the s x s probabilities of the ``math`` kernel; the output and log-sum-exp of the fused
  one) is dropped, for a few percent more compute.

Installed from the strategy's side, on whatever model it built (paralab's GPT, the tensor-parallel
blocks, torch's DTensor and FSDP2 wrappings of them), by swapping in a checkpointed ``forward`` on
each block or core, so parameter names and hooks stay as they were. The second run of a forward,
inside backward, is a ``recompute`` span on the compute lane: the timeline shows the extra work.
The second run drops the same elements as the first: torch's checkpoint restores the default
generator and paralab.random_streams the tensor-parallel ranks' split-region stream.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from paralab import random_streams
from paralab.models.gpt import AttentionCore


def _is_block(module: nn.Module) -> bool:
    """A transformer block of any of paralab's models (each block class declares itself)."""
    return getattr(type(module), "IS_TRANSFORMER_BLOCK", False)


def apply_recompute(model: nn.Module, mode: str, recorder=None, memory=None) -> int:
    """Checkpoint every block (``full``) or every attention core (``selective``) of ``model``;
    returns how many modules were wrapped (0 for ``none``). With a ``memory`` meter, what each
    recomputation rematerialises is counted (MemoryMeter.recomputing)."""
    if mode == "none":
        return 0
    chosen = [m for m in model.modules()
              if (_is_block(m) if mode == "full" else isinstance(m, AttentionCore))]
    for module in chosen:
        module.forward = _checkpointed(module.forward, recorder, memory)
    return len(chosen)


def _checkpointed(forward, recorder, memory):
    def rerun(*args):
        if torch._C._current_graph_task_id() == -1:  # the first run, in the forward
            return forward(*args)
        with ExitStack() as inside_backward:
            if recorder is not None:
                inside_backward.enter_context(recorder.span("recompute"))
            if memory is not None:
                inside_backward.enter_context(memory.recomputing())
            return forward(*args)

    def run(*args):
        if not torch.is_grad_enabled():
            return forward(*args)
        return checkpoint(rerun, *args, use_reentrant=False, context_fn=random_streams.recompute_contexts)

    return run
