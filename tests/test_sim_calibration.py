"""The local calibration's fits: they must give back what generated the data, and curves must cost
collectives the way a ring runs them. No timing of this machine is asserted."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
import warnings

import pytest

from paralab.config import ModelConfig
from paralab.sim import calibration, cost, counting, hardware
from paralab.sim.hardware import local
from paralab.sim.presets import lab_model
from paralab.sim.specs import HardwareSpec, ModelSpec, ParallelSpec

CPU = HardwareSpec(
    name="test-cpu", peak_flops={"fp32": 80e9}, memory_bytes=16 * 2**30, memory_bandwidth=30e9,
    gpus_per_node=2, intra_bw=1e9, intra_latency=100e-6, inter_bw=1e9, inter_latency=100e-6,
    matmul_max_efficiency=1.0, matmul_half_dim=4.0, kernel_overhead_s=0.0,
    host_overhead_s={"layer_forward": 3e-4, "layer_backward": 4e-4, "tensor_update": 2e-5},
)
CURVE = [[4, 2e-4], [2**16, 1e-3], [2**20, 3e-3], [2**22, 6e-3]]


def test_interpolate_is_exact_at_points_log_linear_between_and_extends_by_the_last_bandwidth():
    for n, t in CURVE:
        assert cost.interpolate(CURVE, n) == pytest.approx(t)
    assert cost.interpolate(CURVE, 1) == CURVE[0][1]
    mid = math.sqrt(2**16 * 2**20)  # halfway in log size: geometric mean in time
    assert cost.interpolate(CURVE, mid) == pytest.approx(math.sqrt(1e-3 * 3e-3))
    bw = (2**22 - 2**16) / (6e-3 - 1e-3)  # over the last three points
    assert cost.interpolate(CURVE, 2**23) == pytest.approx(6e-3 + 2**22 / bw)
    flat_top = [[4, 2e-4], [2**16, 3e-3], [2**20, 3e-3], [2**22, 3e-3]]  # monotone() flattened a noisy top
    assert cost.interpolate(flat_top, 2**23) == pytest.approx(6e-3)
    assert cost.interpolate(flat_top, 2**23) > cost.interpolate(flat_top, 2**22)


def test_a_measured_curve_costs_every_ring_step_as_half_a_two_rank_all_reduce():
    hw = dataclasses.replace(CPU, gpus_per_node=8, allreduce_curve=CURVE)
    n = 2**20
    assert cost.collective_time(hw, "all_reduce", n, 2, 1) == pytest.approx(cost.interpolate(CURVE, n))
    # 4 ranks: 2 x 3 steps, each moving a quarter of the tensor
    step = cost.interpolate(CURVE, 2 * n / 4) / 2
    assert cost.collective_time(hw, "all_reduce", n, 4, 1) == pytest.approx(6 * step)
    assert cost.collective_time(hw, "all_gather", n, 4, 1) == pytest.approx(3 * step)
    # ten messages pay the small-message cost ten times
    assert cost.collective_time(hw, "all_reduce", n, 2, 1, messages=10) == pytest.approx(
        10 * cost.interpolate(CURVE, n / 10))
    # without a curve: alpha-beta
    assert cost.collective_time(CPU, "all_reduce", n, 2, 1) == pytest.approx(2 * 100e-6 + n / 1e9)


def test_an_all_gather_or_reduce_scatter_with_its_own_curve_costs_a_step_of_it_not_half_an_all_reduce():
    """gloo's reduce-scatter of a tensor costs more than its all-reduce of it: each op reads its own
    measured curve (a 2-rank one is one ring step on two chunks); an op without one, the all-reduce's."""
    slow = [[n, 1.5 * t] for n, t in CURVE]
    hw = dataclasses.replace(CPU, gpus_per_node=8, allreduce_curve=CURVE, reducescatter_curve=slow,
                             allgather_curve=CURVE)
    n = 2**20
    assert cost.collective_time(hw, "reduce_scatter", n, 2, 1) == pytest.approx(
        1.5 * cost.interpolate(CURVE, n))
    assert cost.collective_time(hw, "reduce_scatter", n, 4, 1) == pytest.approx(
        3 * 1.5 * cost.interpolate(CURVE, 2 * n / 4))
    assert cost.collective_time(hw, "all_gather", n, 2, 1) == pytest.approx(cost.interpolate(CURVE, n))
    assert cost.collective_time(hw, "all_reduce", n, 2, 1) == pytest.approx(cost.interpolate(CURVE, n))
    assert cost.measured_curve(hw, "broadcast") == (CURVE, "all_reduce")
    assert cost.measured_curve(CPU, "all_gather") == ([], "all_reduce")


def test_monotone_pools_adjacent_violators():
    assert calibration.monotone([1, 3, 2, 4, 0, 5]) == pytest.approx([1, 2.25, 2.25, 2.25, 2.25, 5])
    assert calibration.monotone([1, 2, 3]) == [1, 2, 3]
    values = [5.0, 1.0, 4.0, 2.0, 9.0]
    fitted = calibration.monotone(values)
    assert all(a <= b for a, b in zip(fitted, fitted[1:]))
    assert sum(fitted) == pytest.approx(sum(values))  # pooling keeps the mean


def block_rows(hw: HardwareSpec, elementwise_bw: float, backward_bw: float | None = None) -> list[list]:
    """Block timings as the cost model says a machine with these non-GEMM rates would show them."""
    rows = []
    for b, h, heads, s in calibration.BLOCK_SHAPES:
        model = lab_model(calibration.block_config(h, heads, s))
        work = cost.layer_work(model, ParallelSpec(micro_batch=b, microbatches=1).resolved(), hw)
        forward = work.elementwise_bytes / elementwise_bw
        backward = work.elementwise_bytes / (backward_bw or elementwise_bw)
        host = hw.host_overhead_s
        rows.append([b, h, heads, s, work.linear + work.core + forward + host["layer_forward"],
                     2 * work.linear + work.core_backward + 2 * backward + host["layer_backward"]])
    return rows


def test_elementwise_fit_recovers_the_rates_that_made_the_timings_forward_and_backward_apart():
    assert calibration.fit_elementwise_bandwidths(CPU, block_rows(CPU, 7e9)) == pytest.approx((7e9, 7e9))
    assert calibration.fit_elementwise_bandwidths(CPU, block_rows(CPU, 4e9, 6e9)) == pytest.approx((4e9, 6e9))
    # and the cost model prices a backward's non-GEMM work at its own rate
    model = lab_model(ModelConfig(layers=2, hidden=64, heads=4, vocab=128, seq_len=32))
    p = ParallelSpec(micro_batch=4, microbatches=1)
    same, faster_back = (dataclasses.replace(CPU, elementwise_bw=4e9, elementwise_backward_bw=bw)
                         for bw in (0, 8e9))
    (one,), (two,) = (cost.stage_times(model, p, hw) for hw in (same, faster_back))
    assert two.forward == pytest.approx(one.forward) and two.backward < one.backward


def test_elementwise_fit_falls_back_when_gemms_explain_everything():
    rows = [[*r[:4], r[4] / 100, r[5] / 100] for r in block_rows(CPU, 7e9)]
    assert calibration.fit_elementwise_bandwidths(CPU, rows) == (0.0, 0.0)


def test_fitted_rates_drive_the_prediction():
    model = lab_model(ModelConfig(layers=2, hidden=64, heads=4, vocab=128, seq_len=32))
    p = ParallelSpec(dp=2, micro_batch=4, microbatches=1)
    fast, slow = (dataclasses.replace(CPU, elementwise_bw=bw, optimizer_bw=bw) for bw in (30e9, 3e9))
    assert cost.predict(model, p, slow).step_time_s > cost.predict(model, p, fast).step_time_s
    # the optimizer's traffic term scales as 1 / optimizer_bw; its per-tensor host time does not
    per_tensor = counting.stage_tensors(model, p, 0) * CPU.host_overhead_s["tensor_update"]
    fast_opt, slow_opt = (cost.predict(model, p, hw).breakdown_s["optimizer"] - per_tensor
                          for hw in (fast, slow))
    assert slow_opt == pytest.approx(10 * fast_opt)
    assert (fast_opt
            == pytest.approx(cost.OPTIMIZER_BYTES_TOUCHED * counting.parameter_counts(model)["total"] / 30e9))


def test_local_calibration_measures_every_rate_and_is_cached(tmp_path, monkeypatch):
    """One real calibration (no gloo), then the cache and its rule for callers who want links. fp16 is
    taken for a dtype this CPU cannot train in: it gets no peak, so a model in it is refused."""
    from paralab import precision

    monkeypatch.setenv("PARALAB_CACHE", str(tmp_path))
    supported = precision.dtype_supported
    monkeypatch.setattr(precision, "dtype_supported", lambda dtype, device: dtype != "fp16"
                        and supported(dtype, device))
    # the fits are checked here, not this machine's load (the spinner test checks that it is seen)
    monkeypatch.setattr(calibration, "OTHERS_CPU_LIMIT", math.inf)
    hw = local(matmul_size=128, gloo=False)
    # every fitted rate is the fit of what was measured, recorded with it
    assert (hw.elementwise_bw, hw.elementwise_backward_bw) == calibration.fit_elementwise_bandwidths(
        dataclasses.replace(hw, shared_compute=False), hw.calibration["blocks"])
    assert hw.optimizer_bw == pytest.approx(
        calibration.optimizer_bandwidth(hw.calibration["adam_1m_s"], hw.host_overhead_s["tensor_update"]))
    assert hw.peak_flops["fp32"] == pytest.approx(calibration.matmul_law(rows=hw.calibration["matmul_s"])[0])
    # each 16-bit dtype at its own rate, timed on a linear's matmuls (it had been fp32's: 23x fast here)
    low = hw.calibration["low_precision_matmul_s"]
    assert set(low) == {d for d in ("bf16",) if supported(d, "cpu")} and "fp16" not in hw.peak_flops
    fp16 = ModelSpec(layers=2, hidden=64, heads=4, vocab=128, seq=32, dtype="fp16")
    assert "a fp16 model needs hardware with a fp16 peak; local lists" in " ".join(hw.problems_for(fp16))
    for dtype, rows in low.items():
        assert [tuple(r[:3]) for r in rows] == list(calibration.LOW_PRECISION_SHAPES)
        assert hw.peak_flops[dtype] == pytest.approx(calibration.rate_at_half(rows, hw.matmul_half_dim))
    assert len(hw.calibration["blocks"]) == len(calibration.BLOCK_SHAPES)
    # ... and each fit found a rate (a non-GEMM fit of 0 is a disturbed calibration, measured again)
    rates = {"matmul": hw.peak_flops["fp32"], "non-GEMM forward": hw.elementwise_bw,
             "non-GEMM backward": hw.elementwise_backward_bw, "Adam": hw.optimizer_bw,
             "copy": hw.memory_bandwidth}
    assert all(math.isfinite(r) and r > 0 for r in rates.values()), rates
    assert hw.allreduce_curve == [] and hw.intra_bw == 1e9  # the loopback guess
    assert (tmp_path / "local_hardware.json").exists()
    assert local(gloo=False) == hw  # the second call reads the cache
    # ... but a cache made without gloo does not serve a caller who wants measured links
    linked = dataclasses.replace(hw, allreduce_curve=[[4, 1e-4], [2**20, 1e-3]],
                                 calibration={**hw.calibration, "gloo": True})
    calls = []
    monkeypatch.setattr(hardware, "calibrate", lambda **kwargs: calls.append(kwargs) or linked)
    assert local() == linked and calls[-1]["gloo"] is True  # measured again, with links
    assert local(gloo=False) == linked and len(calls) == 1  # then served from the cache
    model = ModelSpec(layers=4, hidden=64, heads=4, vocab=128, seq=32, dtype="fp32")
    pred = cost.predict(model, ParallelSpec(pp=2, microbatches=4), hw)
    assert pred.step_time_s > 0 and pred.bubble_fraction > 0


def _quiet_calibration():
    """A stand-in for a quiet local calibration: a preset with measured non-GEMM rates."""
    return dataclasses.replace(hardware.get_hardware("a100"), elementwise_bw=5e9, elementwise_backward_bw=4e9)


# what a busy machine does to a calibration: other processes take the cores' time, small matmuls far
# slower than any law explains, or the GEMMs, timed apart and slower, outlast the blocks that contain
# them (no non-GEMM time left to fit)
DISTURBANCES = {"other processes": {"calibration": {"others_cpu_share": 2 * calibration.OTHERS_CPU_LIMIT}},
                "small matmuls": {"matmul_half_dim": calibration.DISTURBED_HALF_DIM},
                "non-GEMM forward": {"elementwise_bw": 0.0},
                "non-GEMM backward": {"elementwise_backward_bw": 0.0}}


def law_rows(rate: float, half: float, shapes) -> list[list]:
    """Matmul rows timed exactly on the law ``rate x prod d/(d + half)``."""
    return [[m, n, k, 2 * m * n * k / rate * (1 + half / m) * (1 + half / n) * (1 + half / k)]
            for m, n, k in shapes]


def test_a_16_bit_rate_is_fitted_on_fp32s_shape_law():
    """A 16-bit dtype, timed at a few shapes, gets the rate of fp32's law (its d_half) that those
    timings give: the generating rate back when they follow it."""
    fp32 = law_rows(1e11, 32, calibration.MODEL_SHAPES)
    rate, half, _ = calibration.matmul_law(rows=fp32)
    assert half == pytest.approx(32, rel=0.2)
    bf16 = law_rows(2e9, half, calibration.LOW_PRECISION_SHAPES)
    assert calibration.rate_at_half(bf16, half) == pytest.approx(2e9)
    assert rate == pytest.approx(1e11, rel=0.1)


def test_a_dtype_the_cpu_cannot_train_in_is_not_timed(monkeypatch):
    """Only the 16-bit dtypes this torch trains in on the CPU are timed: the others get no ``local``
    peak, so a model in one is refused, not priced at another dtype's rate."""
    from paralab import precision

    monkeypatch.setattr(precision, "dtype_supported", lambda dtype, device: dtype == "bf16")
    rows = calibration.low_precision_rows(shapes=((16, 24, 8),))
    assert list(rows) == ["bf16"] and [r[:3] for r in rows["bf16"]] == [(16, 24, 8)]
    assert rows["bf16"][0][3] > 0


def test_a_busy_machine_disturbs_the_matmul_law():
    """Small matmuls timed while other work held the cores fit the law only with an implausible d_half."""
    quiet = law_rows(1e11, 32, ((128, 192, 64), (512, 768, 256), (1024, 1024, 1024)))
    busy = [[m, n, k, max(t, 2.5e-3)] for m, n, k, t in quiet]  # every call waits ~2.5 ms for a core
    assert calibration.matmul_law(rows=quiet)[1] == pytest.approx(32, rel=0.2)
    assert calibration.matmul_law(rows=busy)[1] >= calibration.DISTURBED_HALF_DIM


def test_a_process_spinning_beside_a_calibration_is_seen_taking_the_cores(tmp_path):
    """Another process (not this one's child: its own session, as another user's job) that keeps a
    core busy while the calibration measures is seen using that core's share of the time; under a load
    of 5 on two cores a calibration had passed every check and been cached, 60 times off."""
    import psutil

    spin = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"
    quiet = "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"  # else the launcher's pipes stay open
    launcher = subprocess.run([sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen("
                               f"[sys.executable, '-c', {spin!r}], start_new_session=True, {quiet}).pid)"],
                              capture_output=True, text=True, timeout=30, check=True)
    spinner = psutil.Process(int(launcher.stdout))
    try:
        assert spinner.pid not in {c.pid for c in psutil.Process().children(recursive=True)}
        time.sleep(0.3)  # started: its interpreter's own start-up is not the window's
        before = calibration.others_cpu()
        time.sleep(1.0)
        share = calibration.others_cpu_share(before, calibration.others_cpu(), cores=1)
    finally:
        spinner.kill()
        spinner.wait(timeout=10)
    assert share > calibration.OTHERS_CPU_LIMIT  # about one core of one, less what others left it


@pytest.mark.parametrize("disturbance", DISTURBANCES)
def test_a_disturbed_calibration_is_said_used_and_not_cached(tmp_path, monkeypatch, disturbance):
    """A calibration disturbed twice is used, with a warning, for the rest of the process (a notebook
    cell had measured the machine eight times over, minutes), and measured again by the next."""
    monkeypatch.setenv("PARALAB_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "_DISTURBED", {})
    disturbed = dataclasses.replace(_quiet_calibration(), **DISTURBANCES[disturbance])
    calls = []
    monkeypatch.setattr(hardware, "calibrate", lambda **kwargs: calls.append(1) or disturbed)
    with pytest.warns(RuntimeWarning, match="disturbed twice") as said:
        assert local(threads=2) == disturbed
        assert local(threads=2) == disturbed
    assert not list(tmp_path.iterdir()) and len(calls) == 2 and len(said) == 1
    monkeypatch.setattr(hardware, "_DISTURBED", {})  # the next process
    with pytest.warns(RuntimeWarning, match="disturbed twice"):
        local(threads=2)
    assert len(calls) == 4


@pytest.mark.parametrize("disturbance", DISTURBANCES)
def test_a_calibration_disturbed_once_is_measured_again_and_cached(tmp_path, monkeypatch, disturbance):
    """A moment's load (another process starting) should not cost a machine its cache: the second
    measurement, when quiet, is the one kept."""
    monkeypatch.setenv("PARALAB_CACHE", str(tmp_path))
    quiet = _quiet_calibration()
    results = [dataclasses.replace(quiet, **DISTURBANCES[disturbance]), quiet]
    monkeypatch.setattr(hardware, "calibrate", lambda **kwargs: results.pop(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert local(threads=2) == quiet
    assert (tmp_path / "local_hardware_t2.json").exists() and not results


@pytest.mark.parametrize("cached", ["{oops", "[1, 2]", '{"name": "local"}', "damaged rate"])
def test_a_damaged_cache_is_measured_again_and_rewritten(tmp_path, monkeypatch, cached):
    """A cache cut short, not an object, missing fields or holding an impossible rate: said, measured
    again and overwritten (it had raised a traceback through every --hardware local)."""
    monkeypatch.setenv("PARALAB_CACHE", str(tmp_path))
    fresh = _quiet_calibration()
    if cached == "damaged rate":  # a current calibration's record, with a negative memory bandwidth
        cached = json.dumps({**fresh.to_dict(), "memory_bandwidth": -1.0,
                             "calibration": {"version": hardware.CALIBRATION_VERSION, "gloo": True}})
    (tmp_path / "local_hardware_t2.json").write_text(cached)
    monkeypatch.setattr(hardware, "calibrate", lambda **kwargs: fresh)
    with pytest.warns(RuntimeWarning, match="local_hardware_t2.json is not a readable calibration"):
        assert local(threads=2) == fresh
    assert json.loads((tmp_path / "local_hardware_t2.json").read_text()) == fresh.to_dict()


def test_the_spread_of_normal_samples_is_their_sigma_and_one_stall_barely_moves_it():
    from statistics import NormalDist

    samples = NormalDist(1.0, 0.1).samples(2000, seed=3)
    assert calibration.spread(samples) == pytest.approx(0.1, rel=0.05)
    stalled = samples[:-1] + [50.0]  # one call preempted for a long time
    assert calibration.spread(stalled) < 0.2


def test_the_jitter_fit_recovers_the_square_root_law_that_made_the_spreads():
    c = 0.004  # seconds^0.5
    rows = [[b, h, heads, s, f, 2 * f, c * math.sqrt(f), c * math.sqrt(2 * f)]
            for (b, h, heads, s), f in zip(calibration.BLOCK_SHAPES, (0.001, 0.015, 0.03))]
    assert calibration.fit_sync_jitter(rows) == pytest.approx(c)


def test_the_wait_fit_recovers_the_square_root_law_of_a_two_rank_synchronisation():
    c = 0.02  # seconds^0.5
    waits = [[t, c * math.sqrt(t) * cost.expected_max(2)] for t in calibration.SYNC_COMPUTE_S]
    assert calibration.fit_wait_jitter(waits) == pytest.approx(c)
    # the fitted machine waits, at a 2-rank synchronisation, what was measured after that compute
    fitted = dataclasses.replace(CPU, sync_jitter=calibration.fit_wait_jitter(waits))
    for t, waited in waits:
        assert cost.sync_wait(fitted, t, 2) == pytest.approx(waited)


def test_synchronisations_wait_for_the_slowest_rank_and_cpu_communication_does_not_hide():
    """Measured jitter: every collective (and a pipeline send) waits the expected maximum of the
    ranks' spread; on a CPU whose cores all compute, the gradient reduction runs after the backward."""
    model = lab_model(ModelConfig(layers=2, hidden=64, heads=4, vocab=128, seq_len=32))
    jittery = dataclasses.replace(CPU, sync_jitter=0.002)
    for spec in (ParallelSpec(tp=2, micro_batch=4, microbatches=1),
                 ParallelSpec(pp=2, micro_batch=1, microbatches=4),
                 ParallelSpec(dp=2, micro_batch=4, microbatches=1)):
        assert cost.predict(model, spec, jittery).step_time_s > cost.predict(model, spec, CPU).step_time_s
    assert cost.sync_wait(jittery, 0.01, 1) == 0 and cost.sync_wait(jittery, 0.01, 2) == pytest.approx(
        0.002 * 0.1 * cost.expected_max(2))
    # with several buckets a machine that overlaps hides all but the last; one whose cores all compute
    # runs the whole reduction after the backward (with one bucket the two had priced alike, so a cost
    # model that ignored overlaps_comm had passed)
    ddp = ParallelSpec(dp=2, micro_batch=4, microbatches=1, grad_buckets=4)
    hidden, serial = (cost.predict(model, ddp, dataclasses.replace(CPU, overlaps_comm=o))
                      for o in (True, False))
    reduce = cost.collective_time(CPU, "all_reduce", 4 * counting.parameter_counts(model)["total"], 2, 1,
                                  messages=4)
    assert serial.breakdown_s["dp_comm_exposed"] == pytest.approx(reduce)
    assert hidden.step_time_s < serial.step_time_s


@pytest.mark.timeout(60)
def test_calibration_ranks_that_cannot_meet_fail_naming_a_rank_within_the_timeout():
    """Two ranks of a world of three wait for the third: they give up within the timeout (not at
    torch's 30-minute default) and the error names a rank and what it said."""
    spec = {"threads": 1, "ranks": 3, "compute": False}
    # a rank gives up 10 s after importing torch, which a loaded 2-core machine can take seconds to do
    said = r"calibration rank [01] failed \(exit 1\): .*(?i:timeout|timed out)"
    with pytest.raises(RuntimeError, match=said):
        calibration._run_workers(spec, 2, timeout=20)


@pytest.mark.timeout(120)
def test_calibration_ranks_listen_on_loopback_only():
    """The calibration's ranks meet through a file store in their scratch directory and keep gloo on
    the loopback interface: nothing they run listens on the network, and no port is picked ahead
    (another process could take it before rank 0 binds it)."""
    import threading

    import psutil

    from tests.conftest import beyond_loopback, listening_addresses, wait_for

    done = threading.Event()
    measured = threading.Thread(target=lambda: (calibration.gloo_curves(), done.set()), daemon=True)
    measured.start()
    addresses: set[str] = set()

    def finished() -> bool:  # what the ranks listen on, looked at until they are done
        addresses.update(listening_addresses(psutil.Process().children(recursive=True)))
        return done.is_set()

    wait_for(finished, 100, poll_s=0.05)
    measured.join(timeout=5)
    assert done.is_set(), "the gloo curves were not measured"
    assert addresses, "the ranks' gloo sockets were not seen"
    assert not beyond_loopback(addresses), f"listening beyond loopback: {sorted(addresses)}"
