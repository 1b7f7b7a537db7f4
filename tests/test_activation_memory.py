"""The simulator's activation count against what autograd really keeps.

``counting.activation_bytes_per_layer`` (Korthikanti et al. 2022, Table 2, with the lab's kernels)
is what every memory prediction stands on. Here it meets the bytes one of the lab's GPT blocks
saves for backward, counted by the same saved-tensor hooks a run's MemoryMeter uses, for each
attention kernel, recomputation mode and dtype, and with dropout (whose CPU masks the bridge knows
are full width). One layer's share is the difference between three blocks and two, so the input of
the first block (which the previous layer owns) is not counted twice.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paralab.config import MODEL_PRESETS, RunConfig
from paralab.memory import MemoryMeter
from paralab.models.gpt import Block
from paralab.precision import TORCH_DTYPES
from paralab.sim import counting
from paralab.sim.bridge import specs_from_run
from paralab.sim.presets import get_model
from paralab.strategies.recompute import apply_recompute

MICRO_BATCH = 2


def saved_bytes(model_cfg, layers: int, recompute: str, dtype: torch.dtype,
                micro_batch: int = MICRO_BATCH) -> int:
    torch.manual_seed(0)
    blocks = torch.nn.Sequential(*[Block(model_cfg, i) for i in range(layers)]).to(dtype)
    apply_recompute(blocks, recompute)
    meter = MemoryMeter(torch.device("cpu"))
    meter.watch(blocks.parameters())
    x = torch.randn(micro_batch, model_cfg.seq_len, model_cfg.hidden, dtype=dtype, requires_grad=True)
    with meter.saving("microbatch"):
        out = blocks(x)  # held, as a run holds its loss: the graph, and what it saves, lives while it does
    del out
    return meter.report()["max_by_kind"]["activations"]


# torch's CPU attention has no fused kernel with dropout: it falls back to a math path that computes
# a 16-bit attention in fp32 (its scores, mask and dropout output at 4 bytes, and fp32 copies of Q, K
# and V). The simulator prices the kernels a GPU runs, so this one CPU corner is counted short.
CPU_FALLBACK = pytest.mark.xfail(strict=True, reason="CPU sdpa with dropout computes bf16 attention in fp32")
CASES = [
    pytest.param(attention, recompute, dtype, dropout, marks=CPU_FALLBACK
                 if (attention, recompute, dtype, dropout) == ("sdpa", "none", "bf16", 0.1) else ())
    for attention in ("math", "sdpa") for recompute in ("none", "selective", "full")
    for dtype in ("fp32", "bf16") for dropout in (0.0, 0.1)
]  # fmt: skip


@pytest.mark.parametrize("attention, recompute, dtype, dropout", CASES)
def test_predicted_activations_per_layer_match_what_autograd_keeps(attention, recompute, dtype, dropout):
    model_cfg = dataclasses.replace(MODEL_PRESETS["small"], attention=attention, dropout=dropout)
    cfg = RunConfig(model=model_cfg, model_name="small", device="cpu", dtype=dtype, recompute=recompute)
    model, parallel = specs_from_run(cfg)
    torch_dtype = TORCH_DTYPES[dtype]
    measured = (saved_bytes(model_cfg, 3, recompute, torch_dtype)
                - saved_bytes(model_cfg, 2, recompute, torch_dtype))
    predicted = counting.activation_bytes_per_layer(model, MICRO_BATCH, recompute=parallel.recompute)
    assert measured == pytest.approx(predicted, rel=0.05)


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_cpu_sdpa_with_dropout_keeps_the_whole_qkv_output_at_a_micro_batch_of_one(micro_batch):
    """With dropout torch's CPU SDPA runs its math path, which scales Q and K into copies and saves V
    for its second matmul: at a micro-batch of one V's reshape is a view, and it keeps the whole fused
    QKV output alive (``ModelSpec.math_sdpa``); at two it is a copy. Priced as Q, K and V alone, a
    layer had read 8% under at one (pipelines of one-sequence microbatches 2-4% under their peaks)."""
    model_cfg = dataclasses.replace(MODEL_PRESETS["small"], attention="sdpa", dropout=0.1)
    model, _ = specs_from_run(RunConfig(model=model_cfg, model_name="small", device="cpu"))
    assert model.math_sdpa
    measured = (saved_bytes(model_cfg, 3, "none", torch.float32, micro_batch)
                - saved_bytes(model_cfg, 2, "none", torch.float32, micro_batch))
    assert measured == pytest.approx(counting.activation_bytes_per_layer(model, micro_batch), rel=0.01)


def test_the_attention_kernel_and_recomputation_order_the_activations_as_the_lessons_say():
    """The figures notebook 09 draws: the written-out scores cost the most, the fused kernel or
    selective recomputation drop them, full recomputation keeps only the block's input."""
    def per_layer(attention, recompute):
        model_cfg = dataclasses.replace(MODEL_PRESETS["small"], attention=attention)
        return (saved_bytes(model_cfg, 2, recompute, torch.float32)
                - saved_bytes(model_cfg, 1, recompute, torch.float32))

    math_none, sdpa_none = per_layer("math", "none"), per_layer("sdpa", "none")
    math_selective, full = per_layer("math", "selective"), per_layer("math", "full")
    assert math_none > sdpa_none > full and math_none > math_selective > full
    cfg = MODEL_PRESETS["small"]
    assert full == 4 * MICRO_BATCH * cfg.seq_len * cfg.hidden  # one fp32 copy of the block's input


def test_the_meter_sees_a_recomputed_layer_and_lets_go_of_what_backward_frees():
    """Under full recompute the forward keeps each block's input; the backward's peak is those inputs
    plus the block it has just rematerialised. Those tensors live on into the block's backward, each
    until the node that saved it has run: when its first weight gradient is made (the MLP's output
    projection, beside which a ZeRO unit's whole gradient buffer appears) most are still held (the
    meter had let go of all of them as the rerun ended, so a peak there read low: ZeRO-3 under full
    recompute 6% under the prediction, which holds the buffer beside them). After backward autograd
    has freed everything, and so has the meter's count (it follows the lifetimes of the saved
    tensors, not only the microbatch)."""
    model_cfg = MODEL_PRESETS["small"]
    torch.manual_seed(0)
    blocks = torch.nn.Sequential(*[Block(model_cfg, i) for i in range(3)])
    meter = MemoryMeter(torch.device("cpu"))
    meter.watch(blocks.parameters())
    apply_recompute(blocks, "full", memory=meter)
    x = torch.randn(MICRO_BATCH, model_cfg.seq_len, model_cfg.hidden, requires_grad=True)
    with meter.saving("microbatch"):
        out = blocks(x)
    inputs = meter.report()["max_by_kind"]["activations"]
    assert inputs == 3 * x.numel() * 4
    held = []
    blocks[2].mlp.proj.weight.register_hook(lambda grad: held.append(meter.activations()))
    out.sum().backward()
    fp32 = torch.float32
    one_layer = saved_bytes(model_cfg, 2, "none", fp32) - saved_bytes(model_cfg, 1, "none", fp32)
    rematerialised = one_layer - x.numel() * 4  # the block less its input, kept already
    # the last block's input is counted once: kept by the checkpoint, not again by its rerun
    assert meter.report()["max_by_kind"]["activations"] == inputs + rematerialised
    assert held[0] - inputs > rematerialised / 2, (held[0] - inputs, rematerialised)
    assert meter.activations() == 0


class _Region(torch.nn.Module):
    """A block full recompute checkpoints: it drops a branch it computed (whose tensors die while the
    rerun runs) and masks with a tensor kept across steps (which checkpoint keeps as it is)."""

    IS_TRANSFORMER_BLOCK = True

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(64, 64))
        self.register_buffer("mask", torch.rand(8, 64) > 0.5)

    def forward(self, x):
        torch.sin(x * 1.0)  # a branch whose output is dropped
        return torch.cos(x @ self.weight * 1.0).masked_fill(self.mask, 0.0)


def test_the_meter_outlives_a_rerun_tensor_that_dies_early_and_forgets_one_kept_across_steps():
    """A rematerialised tensor that dies while the rerun still runs had made the meter forget the
    rerun's count and fail at its next tensor (KeyError inside backward); a tensor that needs no
    gradient, kept across steps (a cached mask), had stayed counted as an activation after every
    backward. Three steps end with nothing counted."""
    region = _Region()
    meter = MemoryMeter(torch.device("cpu"))
    meter.watch(region.parameters())
    apply_recompute(region, "full", memory=meter)
    for step in range(3):
        x = torch.randn(8, 64, requires_grad=True)
        with meter.saving(step):
            out = region(x * 1.0)
        out.sum().backward()
        meter.release(step)
        assert meter.activations() == 0



def test_the_unfused_losses_peak_at_what_the_simulator_counts_per_logit():
    """torch's cross-entropy on upcast logits and its loss parallel, every storage they create
    counted from birth to free (tests/loss_peak_job.py): the transients at the loss's peak, in its
    backward, are what the simulator adds per logit at the last stage's ends."""
    job = Path(__file__).with_name("loss_peak_job.py")
    out = subprocess.run([sys.executable, str(job)], capture_output=True, text=True, timeout=120, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    model = get_model("llama3-8b").replace(fused_loss=False)
    assert measured["torch"] == pytest.approx(counting.loss_bytes_per_logit(model, tp=1), abs=0.25)
    assert measured["loss_parallel"] == pytest.approx(counting.loss_bytes_per_logit(model, tp=8), abs=0.25)


@pytest.mark.parametrize("hand_over", ["watch", "count_held"])
def test_the_cuda_allocators_peak_is_counted_from_the_end_of_set_up(monkeypatch, hand_over):
    """A model built whole and then sharded (ZeRO-3) had peaked at the whole model before training
    began: the allocator's peak is reset where the strategy hands the meter what it keeps. Only the
    call is checked here (no GPU); gpu-check runs it for real."""
    resets = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", resets.append)
    cuda = torch.device("cuda", 0)
    meter = MemoryMeter(cuda)
    assert resets == []
    if hand_over == "watch":
        meter.watch([torch.zeros(2)])
    else:
        meter.count_held(lambda: {"params": [], "grads": []})
    assert resets == [cuda]
    MemoryMeter(torch.device("cpu")).watch([torch.zeros(2)])
    assert resets == [cuda]  # nothing to reset on a CPU rank
