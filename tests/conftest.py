"""Shared fixtures. Every multi-process test has a timeout (pytest-timeout, pyproject) and is checked
for ranks left behind."""

from __future__ import annotations

import os

import psutil
import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def rank_processes() -> list[psutil.Process]:
    """Rank processes of this test session: the children of paralab's forkserver."""
    out = []
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "forkserver" in cmd:
            out.extend(c for c in child.children(recursive=True) if c.is_running())
    return out


@pytest.fixture
def no_leftover_ranks():
    """Fails the test if any rank process is still alive shortly after it ends."""
    yield
    leftovers = [p for p in rank_processes() if p.status() != psutil.STATUS_ZOMBIE]
    if leftovers:
        _, alive = psutil.wait_procs(leftovers, timeout=5)
        assert not alive, f"rank processes outlived the run: {[p.pid for p in alive]}"


def assert_close_rel(a, b, rel=1e-5, what="value"):
    """Elementwise |a - b| <= rel * max(|b|, tiny), with a message naming the worst element."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, f"{what}: shapes differ {tuple(a.shape)} vs {tuple(b.shape)}"
    err = (a - b).abs() / b.abs().clamp_min(1e-6)
    worst = err.max().item() if err.numel() else 0.0
    assert worst <= rel, f"{what}: relative error {worst:.3g} > {rel:g}"


def assert_same_params(params, reference, rel=1e-5, atol=1e-6):
    """Final parameters equal within fp32 tolerance (relative, with an absolute floor for near-zero)."""
    assert params is not None and set(params) == set(reference), "parameter names differ"
    for name, ref in reference.items():
        diff = (params[name].double() - ref.double()).abs()
        bound = rel * ref.double().abs() + atol
        assert bool((diff <= bound).all()), f"{name}: max abs diff {diff.max().item():.3g}"
