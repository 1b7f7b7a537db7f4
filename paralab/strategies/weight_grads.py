"""Zero-bubble pipelines' split backward: B (input gradients) now, W (weight gradients) later.

A zero-bubble schedule (Qi et al. 2023) runs a stage's backward in two parts. ``Bi`` computes only
what the previous stage is waiting for, the gradient of the stage input; ``W`` computes the weight
gradients later, in what would have been a bubble. W must not walk the stage's graph again: that
would recompute every activation gradient Bi already made and cost a whole backward. Instead, for
every linear map in the stage (where nearly all the weight-gradient FLOPs are), the forward keeps
the matmul's input and Bi catches the gradient of its output; W is then one GEMM per call,
``dW = dYᵀ X`` (and ``db = Σ dY``), the same work as one forward GEMM.

The pipeline installs this from its side: while a stage's forward runs, a torch function mode sees
every ``F.linear`` call (``nn.Linear`` and the tensor-parallel column/row layers alike, whose local
matmuls are plain ``F.linear``; the collectives of f and g stay in Bi, on the input-gradient path),
so no layer needs to know about zero-bubble schedules. With sequence parallelism a column-parallel
layer is one autograd function that gathers its input again in backward
(``tensor_layers._GatheredLinear``): its weight gradient comes in Bi, with that gather. Every other
parameter (LayerNorm, embeddings, a row layer's bias added after g) gets its gradient in Bi, from
autograd. W hands its gradients to autograd from inside a backward node of its own, in one call,
so they accumulate into ``.grad`` through the usual AccumulateGrad (which takes them as they are,
without a copy) and the data-parallel bucket hooks (hybrid) fire once per parameter, as for any
backward.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class _LinearCalls(TorchFunctionMode):
    """Sees every F.linear of a stage's forward and hands (weight, bias, input, output) to ``seen``."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else (kwargs or {}).get("bias")
            self.seen(weight, bias, x, out)
        return out


class DeferredWeightGrads:
    """What W needs, per (stage, microbatch): each linear call's weight, bias, input and output
    (replaced by the output's gradient once Bi has run)."""

    def __init__(self, stages: dict[int, nn.Module]):
        self.stages = stages
        self.key = None
        self.pending: dict[tuple[int, int], list[list]] = {}

    @contextmanager
    def recording(self, key: tuple[int, int]):
        """Forwards inside this block belong to (stage, microbatch) ``key``."""
        self.key = key
        try:
            with _LinearCalls(self.seen):
                yield
        finally:
            self.key = None

    def seen(self, weight, bias, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.key is None or not y.requires_grad or not weight.requires_grad:
            return
        entry = [weight, bias if bias is not None and bias.requires_grad else None, x, y]
        self.pending.setdefault(self.key, []).append(entry)

    def backward_input(self, key: tuple[int, int], out: torch.Tensor, grad, x: torch.Tensor | None) -> None:
        """Bi: gradients of the stage input ``x`` (None on the first stage), of the parameters no
        linear call deferred, and of every linear output (asked for by name, so each one is computed
        even where nothing upstream needs it); the graph is freed, the linear inputs and output
        gradients are kept."""
        entries = self.pending.get(key, [])
        deferred = {id(p) for e in entries for p in e[:2] if p is not None}
        eager = [p for p in self.stages[key[0]].parameters() if p.requires_grad and id(p) not in deferred]
        outputs = [e[3] for e in entries]
        inputs = ([x] if x is not None else []) + eager + outputs
        torch.autograd.backward([out], grad, inputs=inputs)
        for entry, y in zip(entries, outputs):
            if y.grad is None:
                raise RuntimeError(f"no output gradient reached a linear layer in Bi of stage {key[0]}")
            entry[3], y.grad = y.grad, None  # keep the gradient, drop the output itself

    def held_bytes(self, key: tuple[int, int]) -> int:
        """Bytes kept for W after Bi: the linear inputs and output gradients (each storage once)."""
        storages = {}
        for _, _, x, dy in self.pending.get(key, []):
            for t in (x, dy):
                storage = t.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    def backward_weight(self, key: tuple[int, int]) -> None:
        """W: every linear call's weight (and bias) gradient from what Bi left, one GEMM each, handed
        to autograd in one call (a layer called twice gets the sum, and its hooks fire once)."""
        entries = self.pending.pop(key, [])
        params = [p for weight, bias, _, _ in entries for p in (weight, bias) if p is not None]
        if params:
            _WeightGradients.apply(lambda: _gemms(entries), *params).backward()


def _gemms(entries: list[list]) -> list[torch.Tensor]:
    """The weight (and bias) gradients of each linear call, in the order ``backward_weight`` lists
    the parameters: ``dW = dYᵀ X``, ``db = Σ dY``."""
    grads = []
    for _, bias, x, dy in entries:
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        grads.append(dy2.t() @ x2)
        if bias is not None:
            grads.append(dy2.sum(0))
    return grads


class _WeightGradients(torch.autograd.Function):
    """A node whose backward makes W's gradients, so that each reaches its parameter from inside
    autograd: AccumulateGrad takes a gradient only the engine holds as ``.grad`` itself, where one
    handed in from Python is copied, which had held a chunk's weight gradients twice at the end of
    its first W of a step (later ones add into ``.grad`` in place, beside the W's own gradients until
    the last is added, as any backward's are)."""

    @staticmethod
    def forward(ctx, gradients, *params):
        ctx.gradients = gradients
        return params[0].new_zeros(())

    @staticmethod
    def backward(ctx, _):
        gradients, ctx.gradients = ctx.gradients, None  # let go of the linear inputs as soon as W ends
        return None, *gradients()
