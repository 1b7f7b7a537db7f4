"""Zero-bubble Bi/W split (paralab/strategies/weight_grads.py) against one plain backward, in one
process: same gradients for every parameter, every post-accumulate hook once, W done by GEMMs."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from paralab.strategies.weight_grads import DeferredWeightGrads


class RowLike(nn.Module):
    """Shaped like paralab's row-parallel layer: a plain F.linear (the layer knows nothing of zero
    bubble schedules), a bias added after the matmul, whose gradient comes in Bi."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) / n_in**0.5)
        self.bias = nn.Parameter(torch.randn(n_out))

    def forward(self, x):
        return F.linear(x, self.weight) + self.bias


class Stage(nn.Module):
    """A linear called twice, a linear whose input depends on no stage input (first stage, float
    input), a LayerNorm between linears, a row-like layer and a frozen linear."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.b = nn.Linear(8, 16)
        self.row = RowLike(16, 8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        h = self.a(torch.tanh(self.a(x)))
        return self.frozen(self.row(torch.relu(self.b(self.norm(h))))).square().mean()


def grads_and_hook_counts(split: bool, x_requires_grad: bool):
    torch.manual_seed(0)
    stage = Stage()
    counts = {name: 0 for name, p in stage.named_parameters() if p.requires_grad}
    for name, p in stage.named_parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda p, name=name: counts.__setitem__(name, counts[name] + 1))
    x = torch.randn(3, 5, 8, requires_grad=x_requires_grad)
    if split:
        deferred = DeferredWeightGrads({0: stage})
        with deferred.recording((0, 0)):
            loss = stage(x)
        deferred.backward_input((0, 0), loss, None, x if x_requires_grad else None)
        before_w = {name: p.grad is not None for name, p in stage.named_parameters() if p.requires_grad}
        deferred.backward_weight((0, 0))
        assert not deferred.pending
    else:
        stage(x).backward()
        before_w = None
    grads = {name: p.grad.clone() for name, p in stage.named_parameters() if p.requires_grad}
    return grads, counts, x.grad, before_w


@pytest.mark.parametrize("x_requires_grad", [True, False])
def test_split_backward_equals_one_backward(x_requires_grad):
    plain, plain_counts, plain_x, _ = grads_and_hook_counts(False, x_requires_grad)
    split, split_counts, split_x, before_w = grads_and_hook_counts(True, x_requires_grad)
    assert split.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(split[name], plain[name], rtol=1e-5, atol=1e-6, msg=name)
    assert split_counts == plain_counts == {name: 1 for name in plain}
    if x_requires_grad:
        torch.testing.assert_close(split_x, plain_x)
    # Bi left exactly the linear weights (and column biases) for W; the rest came from autograd in Bi
    assert ({name for name, had in before_w.items() if not had}
            == {"a.weight", "a.bias", "b.weight", "b.bias", "row.weight"})


def test_bytes_held_for_w_are_the_linear_inputs_and_output_gradients():
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    deferred = DeferredWeightGrads({0: stage})
    x = torch.randn(4, 8, requires_grad=True)
    with deferred.recording((0, 0)):
        loss = stage(x).square().sum()  # a real output gradient (sum alone gives an expanded scalar)
    deferred.backward_input((0, 0), loss, None, x)
    # inputs: x (4x8) and the GELU output (4x32); output gradients: 4x32 and 4x8; fp32
    assert deferred.held_bytes((0, 0)) == 4 * 4 * (8 + 32 + 32 + 8)
    deferred.backward_weight((0, 0))
    assert deferred.held_bytes((0, 0)) == 0


def test_w_hands_its_gradients_to_autograd_without_a_copy(monkeypatch):
    """W's GEMM outputs become the weights' ``.grad`` themselves: handed to autograd from Python, each
    had been copied by AccumulateGrad, a chunk's weight gradients held twice at the end of every W. A
    layer called twice gets the sum, a tensor of autograd's own, also taken as it is."""
    from paralab.strategies import weight_grads

    made, gemms = set(), weight_grads._gemms

    def gemms_seen(entries):  # their addresses only: a reference kept here would force the copy
        grads = gemms(entries)
        made.update(g.untyped_storage().data_ptr() for g in grads)
        return grads

    monkeypatch.setattr(weight_grads, "_gemms", gemms_seen)
    torch.manual_seed(0)
    stage = Stage()
    deferred = DeferredWeightGrads({0: stage})
    x = torch.randn(3, 5, 8, requires_grad=True)
    with deferred.recording((0, 0)):
        loss = stage(x)
    deferred.backward_input((0, 0), loss, None, x)
    deferred.backward_weight((0, 0))
    for name in ("b.weight", "b.bias", "row.weight"):  # called once: the very tensor W made
        assert stage.get_parameter(name).grad.untyped_storage().data_ptr() in made, name
