"""CUDA paths: NCCL on one GPU per rank, CUDA-event timing. Skipped cleanly without a GPU."""

import pytest
import torch

import paralab
from tests.conftest import assert_close_rel, requires_cuda

pytestmark = [requires_cuda, pytest.mark.cuda]


def test_ddp_on_gpus_matches_cpu_losses(no_leftover_ranks):
    world = min(torch.cuda.device_count(), 2)
    gpu = paralab.run("ddp", world, steps=3, global_batch=8, device="cuda", bucket_mb=0.1)
    cpu = paralab.run("ddp", world, steps=3, global_batch=8, device="cpu", bucket_mb=0.1)
    assert gpu.summary["device"] == "cuda"
    assert_close_rel(gpu.losses, cpu.losses, rel=1e-4, what="cuda vs cpu losses")
    spans = gpu.trace.select(kind="forward")
    assert spans and all(s.end > s.start for s in spans), "CUDA-event spans must have positive length"
    assert all(b > 0 for b in gpu.summary["peak_memory_bytes"])
