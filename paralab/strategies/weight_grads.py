"""Zero-bubble pipelines' split backward: B (input gradients) now, W (weight gradients) later.

A zero-bubble schedule (Qi et al. 2023) runs a stage's backward in two parts. ``Bi`` computes only
what the previous stage is waiting for, the gradient of the stage input; ``W`` computes the weight
gradients later, in what would have been a bubble. W must not walk the stage's graph again: that
would recompute every activation gradient Bi already made and cost a whole backward. Instead, for
every ``nn.Linear`` in the stage (where nearly all the weight-gradient FLOPs are), the forward keeps
the layer's input and Bi catches the gradient of its output; W is then one GEMM per layer,
``dW = dYᵀ X`` (and ``db = Σ dY``), the same work as one forward GEMM.

Every other parameter (LayerNorm, embeddings, tensor-parallel layers with collectives in their
backward) gets its gradient in Bi: cheap, and exactly what autograd computes. W hands its gradients
to autograd as the gradient of the weight itself, so they accumulate into ``.grad`` through the
usual AccumulateGrad, and the data-parallel bucket hooks (hybrid) fire as they would for any
backward.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn


class DeferredWeightGrads:
    """The pieces W needs, per (stage, microbatch): each linear layer's input and output gradient."""

    def __init__(self, stages: dict[int, nn.Module]):
        self.key = None
        self.pending: dict[tuple[int, int], list[list]] = {}
        deferred: set[int] = set()
        for stage in stages.values():
            for module in stage.modules():
                if type(module) is nn.Linear:
                    module.register_forward_hook(self._seen)
                    deferred.update(id(p) for p in module.parameters())
        self.eager = {s: [p for p in stage.parameters() if id(p) not in deferred] for s, stage in stages.items()}

    @contextmanager
    def recording(self, key: tuple[int, int]):
        """Forwards inside this block belong to (stage, microbatch) ``key``."""
        self.key = key
        try:
            yield
        finally:
            self.key = None

    def _seen(self, module: nn.Linear, args, output: torch.Tensor) -> None:
        if self.key is None or not output.requires_grad:
            return
        entry = [module, args[0], None]
        self.pending.setdefault(self.key, []).append(entry)
        output.register_hook(lambda grad, entry=entry: entry.__setitem__(2, grad))

    def backward_input(self, key: tuple[int, int], out: torch.Tensor, grad, x: torch.Tensor | None) -> None:
        """Bi: gradients of the stage input ``x`` (None on the first stage) and of the eager
        parameters; the graph is freed, the linear layers' inputs and output gradients are kept."""
        inputs = ([x] if x is not None else []) + self.eager[key[0]]
        torch.autograd.backward([out], grad, inputs=inputs)

    def backward_weight(self, key: tuple[int, int]) -> None:
        """W: every linear layer's weight (and bias) gradient from what Bi left, one GEMM each."""
        for module, x, dy in self.pending.pop(key, []):
            if dy is None:
                raise RuntimeError(f"no output gradient reached {module} in Bi of stage {key[0]}: "
                                   "its weight gradient cannot be deferred")
            x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
            params, grads = [module.weight], [dy2.t() @ x2]
            if module.bias is not None:
                params.append(module.bias)
                grads.append(dy2.sum(0))
            torch.autograd.backward(params, grads)
