"""CUDA paths: NCCL on one GPU per rank, CUDA-event timing (skipped cleanly without a GPU); and the
logic of ``make gpu-check``, which the CPU exercises too."""

import pytest
import torch

import paralab
import paralab.strategies.registry
from tests.conftest import assert_close_rel, requires_cuda


@requires_cuda
@pytest.mark.cuda
def test_ddp_on_gpus_matches_cpu_losses(no_leftover_ranks):
    world = min(torch.cuda.device_count(), 2)
    gpu = paralab.run("ddp", world, steps=3, global_batch=8, device="cuda", bucket_mb=0.1)
    cpu = paralab.run("ddp", world, steps=3, global_batch=8, device="cpu", bucket_mb=0.1)
    assert gpu.summary["device"] == "cuda"
    assert_close_rel(gpu.losses, cpu.losses, rel=1e-4, what="cuda vs cpu losses")
    spans = gpu.trace.select(kind="forward")
    assert spans and all(s.end > s.start for s in spans), "CUDA-event spans must have positive length"
    assert all(b > 0 for b in gpu.summary["peak_memory_bytes"])


# ------------------------------------------------------------------------------- make gpu-check, on CPU
@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_gpu_check_shapes_resolve_on_the_gpu_preset(gpus):
    from paralab.gpu_check import shapes

    for name, options in shapes(gpus, "medium").items():
        options = dict(options)
        paralab.resolve_layout(paralab.RunConfig.build(options.pop("model"), strategy=name, world_size=gpus,
                                                       global_batch=8 * gpus, **options))


def test_gpu_check_without_cuda_says_so_and_passes(monkeypatch, capsys):
    from paralab import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main() == 0
    assert "no CUDA device is visible" in capsys.readouterr().out


def test_gpu_check_passes_every_strategy_on_cpu_ranks(no_leftover_ranks):
    """The check's own logic, run for real on 2 CPU ranks with the tiny model in bf16."""
    from paralab.gpu_check import run_all

    rows = run_all(2, "tiny", "bf16", device="cpu")
    registry = {name for name, s in paralab.strategies.registry.strategies().items() if name != "single"}
    assert {r["strategy"] for r in rows} == registry, "gpu-check runs every strategy"
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
