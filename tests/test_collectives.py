"""The alpha-beta model of the collectives lesson (paralab.collectives) and its explorer."""

from __future__ import annotations

import math

import pytest

from paralab import collectives
from paralab.sim import cost
from paralab.sim.hardware import get_hardware
from paralab.trace import Span, Trace


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("group", [2, 4, 8])
def test_the_ring_is_the_cost_models_ring(op, group):
    """One ring: the lesson's formula is the cost model's, inside an H100 node."""
    h100 = get_hardware("h100")
    for payload in (4.0, 2.0**20, 2.0**30):
        assert collectives.ring_time(op, payload, group, h100.intra_latency, h100.intra_bw) == pytest.approx(
            cost.collective_time(h100, op, payload, group, 1), rel=1e-12)
    # by hand: 2 (n - 1) steps of the latency and 2 (n - 1) / n of the payload at the bus bandwidth
    steps = (2 if op == "all_reduce" else 1) * (group - 1)
    expected = steps * h100.intra_latency + steps / group * 2.0**30 / h100.intra_bw
    by_hand = collectives.ring_time(op, 2.0**30, group, h100.intra_latency, h100.intra_bw)
    assert by_hand == pytest.approx(expected)


def test_tree_against_ring_crosses_where_the_algebra_says():
    """2(n-1) a + 2(n-1)/n S/B = 2 log2(n) a + 2S/B at S* = a B (n - 1 - log2 n) n."""
    alpha, bandwidth, n = 10e-6, 45e9, 8
    crossing = alpha * bandwidth * (n - 1 - math.log2(n)) * n
    for payload, ring_faster in ((crossing / 2, False), (crossing * 2, True)):
        ring = collectives.ring_time("all_reduce", payload, n, alpha, bandwidth)
        assert (ring < collectives.tree_time(payload, n, alpha, bandwidth)) == ring_faster
    assert collectives.ring_time("all_reduce", crossing, n, alpha, bandwidth) == pytest.approx(
        collectives.tree_time(crossing, n, alpha, bandwidth))
    assert (collectives.tree_time(1.0, 1, alpha, bandwidth)
            == collectives.ring_time("all_reduce", 1.0, 1, alpha, bandwidth) == 0)


def test_bandwidths_as_nccl_tests_report_them():
    assert collectives.algorithm_bandwidth(2**20, 1e-3) == 2**20 / 1e-3
    assert collectives.bus_bandwidth("all_reduce", 2**20, 4, 1e-3) == 1.5 * 2**20 / 1e-3
    assert collectives.bus_bandwidth("all_gather", 2**20, 4, 1e-3) == 0.75 * 2**20 / 1e-3  # (n-1)/n
    # a ring at link speed: busbw tends to the link's bandwidth, whatever the group
    for n in (2, 8, 64):
        t = collectives.ring_time("all_reduce", 2.0**34, n, 1e-6, 1e9)
        assert collectives.bus_bandwidth("all_reduce", 2.0**34, n, t) == pytest.approx(1e9, rel=1e-3)


def test_the_fit_recovers_alpha_and_beta():
    points = [(s, collectives.ring_time("all_reduce", s, 4, 2e-4, 3e9))
              for s in (4.0, 2.0**12, 2.0**20, 2.0**25)]
    alpha, bandwidth = collectives.fit_alpha_beta(points, "all_reduce", 4)
    assert alpha == pytest.approx(2e-4, rel=1e-9) and bandwidth == pytest.approx(3e9, rel=1e-9)
    with pytest.raises(ValueError, match="two different sizes"):
        collectives.fit_alpha_beta([(4.0, 1e-3), (4.0, 2e-3)], "all_reduce", 4)


def test_the_fit_weighs_every_size_by_its_relative_error():
    """Measured times scatter by a few percent at every size; in absolute seconds a 32 MiB point's 3%
    is a hundred times a small message's latency, and a plain fit had put alpha at twice the time a
    4-byte all-reduce takes."""
    sizes = (4.0, 2.0**12, 2.0**16, 2.0**20, 2.0**23, 2.0**25)
    scatter = {2.0**23: 0.97, 2.0**25: 1.03}  # a plain fit reads alpha 22% low from these alone
    noisy = [(s, collectives.ring_time("all_reduce", s, 2, 2e-4, 1e9) * scatter.get(s, 1.0)) for s in sizes]
    alpha, bandwidth = collectives.fit_alpha_beta(noisy, "all_reduce", 2)
    assert alpha == pytest.approx(2e-4, rel=0.02) and bandwidth == pytest.approx(1e9, rel=0.05)
    # weighed against the model's time, not its own: one 4-byte sample ten times fast had pulled alpha
    # from 200 us to 11 us
    lucky = [(s, t / 10 if s == 4.0 else t / scatter.get(s, 1.0)) for s, t in noisy]
    assert collectives.fit_alpha_beta(lucky, "all_reduce", 2)[0] > 0.5 * 2e-4
    for bad, group in (([(4.0, 0.0), (2.0**20, 1e-3)], 2), (noisy, 1)):
        with pytest.raises(ValueError, match="positive times"):
            collectives.fit_alpha_beta(bad, "all_reduce", group)


def test_traced_points_leave_out_the_warm_up_step():
    spans = [Span(0, "comm", "all_reduce", t, t + d, step=step, payload_bytes=p, group_size=2)
             for step, (t, d, p) in enumerate([(0.0, 9.0, 100), (10.0, 1.0, 100), (20.0, 3.0, 100),
                                               (30.0, 2.0, 400)])]
    points = collectives.traced_points(Trace(spans=spans), "all_reduce")
    assert points == {2: [(100, 1.0), (100, 3.0), (400, 2.0)]}


def test_the_collectives_explorer_says_where_the_tree_wins():
    pytest.importorskip("ipywidgets")
    from paralab import widgets

    app = widgets.collectives_explorer(size_mb=1 / 64, link="h100 InfiniBand")
    assert "from 4 ranks" in app.message.value
    slider = app.controls["max_group"]  # it says what it counts (it had read "up to" and "256")
    assert (slider.description, slider.label) == ("up to (ranks)", "256")
    ring = app.figure.layout.meta["h100 InfiniBand, ring"]
    app.controls["size_mb"].value = 512
    assert app.figure.layout.meta["h100 InfiniBand, ring"][0] > ring[0]  # a bigger message takes longer
    assert "from 4 ranks" not in app.message.value


def test_the_explorer_keeps_nvlink_inside_a_node_and_no_tree_on_gloo():
    """NVLink joins the GPUs of one node: its curves had run to 1,024 ranks. A measured gloo link has no
    tree algorithm: the explorer had said where its tree wins without a word. Sizes read in binary
    units (the title had said 1024 MiB)."""
    pytest.importorskip("ipywidgets")
    from paralab import widgets

    app = widgets.collectives_explorer(measured={"gloo here": (2e-4, 1e9)}, size_mb=1024, link="h100 NVLink")
    assert len(app.figure.layout.meta["h100 NVLink, ring"]) == 3  # 2, 4 and 8 ranks of the default 256
    assert "joins the 8 GPUs of a node" in app.message.value and "1 GiB" in app.figure.layout.title.text
    app.controls["link"].value = "gloo here"
    assert len(app.figure.layout.meta["gloo here, ring"]) == 8  # 2 to 256 ranks
    assert "gloo, measured here, runs no tree" in app.message.value and "joins" not in app.message.value
    from paralab.widgets.collectives import Link

    nccl = widgets.collectives_explorer(measured={"nccl here": Link(5e-6, 1e11, reach=8)}, link="nccl here")
    assert "runs no tree" not in nccl.message.value and len(nccl.figure.layout.meta["nccl here, ring"]) == 3


def test_the_alpha_beta_figure_marks_the_knee_and_reads_its_sizes_flat():
    """Notebook 13's figure: the knee S = n alpha B the text computes had not been drawn; 15 size ticks
    had turned on their side (45 degrees at 1,100 pixels, upright at 820); three long legend names had
    wrapped onto the "time" subplot title. Now a dotted line at the knee, labelled; at most 6 ticks,
    flat; one legend entry a row, the top margin grown to hold them."""
    from paralab.viz.collectives import MOST_SIZE_TICKS, alpha_beta, knee, size_label, size_ticks

    curve = [(8, 5e-4), *((2.0**k, 5e-4 + 2.0**k / 1e9) for k in range(12, 26))]
    alpha, bandwidth = 2.5e-4, 1.3e9
    fits = {"fitted": (2, alpha, bandwidth)}
    fig = alpha_beta({"calibration": (2, curve), "in training": (2, [(2**20, 5e-3)])}, fits, knees=True)
    at = knee(2, alpha, bandwidth)
    assert at == pytest.approx(2 * alpha * bandwidth) == fig.layout.meta["fits"]["fitted"]["knee_bytes"]
    (line,) = fig.layout.shapes
    assert line.x0 == line.x1 == pytest.approx(at) and line.line.dash == "dot"
    assert any(size_label(at) in a.text for a in fig.layout.annotations)
    axis = fig.layout.xaxis
    assert axis.tickangle == 0 and 3 <= len(axis.tickvals) <= MOST_SIZE_TICKS
    assert list(axis.ticktext) == [size_label(t) for t in axis.tickvals]
    assert fig.layout.legend.orientation == "v"
    plain = alpha_beta({"calibration": (2, curve)}, fits)
    assert not plain.layout.shapes and plain.layout.legend.orientation == "h"  # two entries fit one row
    assert fig.layout.margin.t > plain.layout.margin.t
    # ticks every 1, 2, 5 or 10 binary orders, the closest that keeps to the most
    assert size_ticks(1024, 2**20) == [2.0**k for k in range(10, 21, 2)]
    assert size_ticks(2**10, 2**12) == [2.0**k for k in range(9, 14)]
    assert size_ticks(4, 2**30) == [2.0**k for k in (5, 10, 15, 20, 25, 30)]


def test_log_axes_label_every_power_of_ten_one_way():
    """Plotly's power format had labelled one axis "1", "10", "10²": each axis now reads plain numbers
    where all are short, else powers throughout."""
    from paralab.viz.collectives import alpha_beta, power_ticks

    assert power_ticks([0.3, 42.0]) == ([0.1, 1.0, 10.0, 100.0], ["0.1", "1", "10", "100"])
    assert power_ticks([2e-4, 3e3])[1] == ["10⁻⁴", "10⁻³", "10⁻²", "10⁻¹", "10⁰", "10¹", "10²", "10³", "10⁴"]
    fig = alpha_beta({}, {"fitted": (2, 2.5e-4, 1.3e9)})
    for axis in (fig.layout.yaxis, fig.layout.yaxis2):
        texts = list(axis.ticktext)
        assert len(texts) == len(axis.tickvals) >= 2
        as_powers = [any(c in t for c in "⁻⁰¹²³⁴⁵⁶⁷⁸⁹") for t in texts]
        assert all(as_powers) or not any(as_powers), texts  # never plotly's "1", "10", "10²"


def test_the_bus_bandwidth_axis_reads_rates_in_a_tables_units():
    """Its ticks had run 10⁻⁶ to 10¹ "GB/s" beside a table of 5.68 kB/s and 93 MB/s: now 1 kB/s to
    10 GB/s, and the hover says a point's rate the same way."""
    from paralab.viz.collectives import alpha_beta, rate_label

    assert [rate_label(r) for r in (5680.0, 9.3e7, 1.3e9, 4.5e12, 12.0, 999.6e6, 999.5, 5e15)] == [
        "5.68 kB/s", "93 MB/s", "1.3 GB/s", "4.5 TB/s", "12 B/s", "1 GB/s", "1 kB/s", "5 PB/s"]
    curve = [(8, 5e-4), *((2.0**k, 5e-4 + 2.0**k / 1e9) for k in range(12, 26))]
    fig = alpha_beta({"calibration": (2, curve)}, {"fitted": (2, 2.5e-4, 1.3e9)})
    axis = fig.layout.yaxis2
    assert axis.title.text == "bytes a second"
    assert list(axis.ticktext) == [rate_label(t) for t in axis.tickvals] and "10 kB/s" in axis.ticktext
    measured = next(t for t in fig.data if t.yaxis == "y2" and t.mode == "markers")
    assert measured.customdata[0][1] == rate_label(measured.y[0])
