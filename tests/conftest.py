"""Shared fixtures. Every multi-process test has a timeout (pytest-timeout, pyproject) and is checked
for ranks left behind."""

from __future__ import annotations

import ipaddress
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# A test run started in the background by a non-interactive shell (`make test &`) ignores SIGINT, and
# so would every launcher a test starts: the tests that interrupt one (as Ctrl-C in a terminal does)
# need it delivered. A handler here becomes the default disposition in every process started after.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


TAG = "PARALAB_TEST_TAG"  # put in a launcher's environment: every process it starts inherits it


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes, other than this one, whose environment carries PARALAB_TEST_TAG=tag."""
    found = []
    for p in psutil.process_iter(["environ"]):
        try:
            mine = p.pid != os.getpid() and (p.info["environ"] or {}).get(TAG) == tag
            if mine and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_for(predicate, timeout_s: float, poll_s: float = 0.1) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; whether it held."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def assert_nothing_left(tag: str, tmp: Path, within_s: float = 15.0) -> None:
    """Within a few seconds, no tagged process is alive and the run's TMPDIR ``tmp`` holds nothing
    but torch's compile cache (``torchinductor_<user>``, kept across runs by design)."""

    def left() -> list[str]:
        return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))

    wait_for(lambda: not tagged_processes(tag) and not left(), within_s)
    alive = [(p.pid, " ".join(p.cmdline())[:120]) for p in tagged_processes(tag)]
    assert not alive, f"processes outlived their launcher: {alive}"
    assert not left(), f"left in the temporary directory: {left()}"


def listening_addresses(procs: list[psutil.Process]) -> set[str]:
    """The IP addresses these processes listen on (TCP)."""
    found = set()
    for p in procs:
        try:
            found |= {c.laddr.ip for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
    return found


def beyond_loopback(addresses: set[str]) -> set[str]:
    return {a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback}


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


def assert_replicas_agree(run, place=lambda result: ()):
    """Only the first replica's state is collected and compared; every rank at the same ``place`` (a
    key of its rank result: by default all of them) trained the same weights bit for bit, by the digest
    each reports."""
    digests: dict = {}
    for result in run.rank_results:
        digests.setdefault(place(result), set()).add(result["params_digest"])
    assert all(len(d) == 1 and None not in d for d in digests.values()), digests


def assert_same_gradient_norm(grads, reference, rel=1e-3):
    """The final step's gradients have the reference's global norm: what an Adam run can still be held
    to (Adam divides a gradient's scale away, so its losses and parameters cannot show a gradient
    summed where it should be averaged, or a loss scale left in)."""
    def norm(g):
        return sum(t.double().square().sum() for t in g.values()).sqrt().item()

    assert grads is not None and set(grads) == set(reference), "gradient names differ"
    assert norm(grads) == pytest.approx(norm(reference), rel=rel)


def bars(fig) -> int:
    """Bars of spans in a timeline figure (not the waits drawn over calls, nor the blocked compute)."""
    from paralab.viz._common import BLOCKED_LABEL, WAITING_LABEL

    return sum(len(t.x) for t in fig.data if t.type == "bar" and t.name not in (WAITING_LABEL, BLOCKED_LABEL))
