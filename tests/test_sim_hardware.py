"""Hardware: presets against their vendor datasheets (units included), hardware files, power caps,
memory a plan may fill, and the scale effects of the network: collective algorithms, pods, stragglers."""

import dataclasses
import json
import math
import re
import warnings
from statistics import NormalDist

import pytest

from paralab.sim import cost
from paralab.sim.hardware import PRESETS, get_hardware, load_hardware_file
from paralab.sim.specs import SpecError
from paralab.warn import ParalabWarning

GiB = 2**30

# Vendor datasheets (dense peaks; the bf16 and fp8 rows halve the "with sparsity" figures):
# NVIDIA A100 80GB SXM: 312 TFLOP/s bf16, 19.5 fp32, 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s (both
# directions), 400 W; DGX A100: one 200 Gb/s HDR NIC per GPU. NVIDIA H100 SXM: 1,979 TFLOP/s bf16 with
# sparsity (989.5 dense), 3,958 fp8 with sparsity, 67 fp32, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s,
# up to 700 W; DGX H100: one 400 Gb/s NDR NIC per GPU. NVIDIA H200 SXM: H100's compute, 141 GB HBM3e at
# 4.8 TB/s, up to 700 W.
DATASHEETS = {
    "a100": dict(
        bf16=312e12,
        fp32=19.5e12,
        fp8=None,
        memory_gb=80,
        bandwidth=2.039e12,
        nvlink=600e9,
        nic_gbit=200,
        watts=400,
    ),
    "h100": dict(
        bf16=989.5e12,
        fp32=67e12,
        fp8=1979e12,
        memory_gb=80,
        bandwidth=3.35e12,
        nvlink=900e9,
        nic_gbit=400,
        watts=700,
    ),
    "h200": dict(
        bf16=989.5e12,
        fp32=67e12,
        fp8=1979e12,
        memory_gb=141,
        bandwidth=4.8e12,
        nvlink=900e9,
        nic_gbit=400,
        watts=700,
    ),
}


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_presets_match_their_datasheets_in_si_units(name):
    hw, sheet = PRESETS[name], DATASHEETS[name]
    assert hw.peak_flops["bf16"] == pytest.approx(sheet["bf16"], rel=1e-3)
    assert hw.peak_flops["fp32"] == pytest.approx(sheet["fp32"], rel=1e-3)
    assert hw.peak_flops.get("fp8") == (pytest.approx(sheet["fp8"], rel=1e-3) if sheet["fp8"] else None)
    # HBM capacity: the datasheet's "GB" is what the driver reports in GiB, within half a percent
    assert hw.memory_bytes / GiB == pytest.approx(sheet["memory_gb"], rel=5e-3)
    assert hw.memory_bytes % 2**20 == 0  # a whole number of MiB, as nvidia-smi reports it
    assert hw.memory_bandwidth == pytest.approx(sheet["bandwidth"], rel=1e-2)
    # links: per GPU and direction, the bus bandwidth NCCL reaches, below the wire rate and not far off it
    assert 0.7 * sheet["nvlink"] / 2 <= hw.intra_bw <= sheet["nvlink"] / 2
    assert 0.85 * sheet["nic_gbit"] * 1e9 / 8 <= hw.inter_bw <= sheet["nic_gbit"] * 1e9 / 8
    assert hw.tdp_w == sheet["watts"] and hw.gpus_per_node == 8


def test_the_h200_is_not_given_in_decimal_gigabytes():
    """141e9 bytes is 131 GiB: the unit slip this preset used to make, 7% short of the part."""
    assert PRESETS["h200"].memory_bytes / GiB > 140


def write(tmp_path, data, name="part.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_a_preset_handed_out_is_the_callers_own_copy():
    mine = get_hardware("h100")
    mine.peak_flops["bf16"] = 1.0
    mine.flash2_efficiency.clear()
    fresh = get_hardware("H100")
    assert fresh.peak_flops["bf16"] == PRESETS["h100"].peak_flops["bf16"] > 9e14
    assert fresh.flash2_efficiency == PRESETS["h100"].flash2_efficiency != []


def test_a_hardware_file_describes_a_custom_part_in_datasheet_units(tmp_path):
    path = write(tmp_path, {
        "name": "capped-h100", "base": "h100", "memory_gib": 94, "nvlink_gb_s": 300, "nic_gbit_s": 200,
        "nics_per_node": 4, "power_limit_w": 350, "pod_gpus": 2048, "oversubscription": 2,
        "memory_reserved_gib": 2.5, "allocator_overhead": 0.05,
    })  # fmt: skip
    hw = load_hardware_file(path)
    assert hw.name == "capped-h100" and hw.memory_bytes == 94 * GiB and hw.intra_bw == 300e9
    assert hw.inter_bw == pytest.approx(200e9 / 8 * 4 / 8)  # four 200 Gb/s NICs shared by eight GPUs
    assert (hw.pod_gpus, hw.oversubscription, hw.tdp_w) == (2048, 2, 700)  # the rest from the base
    assert cost.usable_memory(hw) == pytest.approx((94 - 2.5) * GiB * 0.95)
    assert get_hardware(str(path)) == hw


def test_a_base_may_be_named_as_hardware_names_it_and_a_path_names_a_file_everywhere(tmp_path):
    """``--hardware h100-sxm`` works, and a file's ``"base": "h100-sxm"`` had been "not a preset"; a
    run's prediction given the file's Path had raised AttributeError."""
    from paralab.config import RunConfig
    from paralab.sim.bridge import hardware_for_run

    path = write(tmp_path, {"base": "H100-SXM", "memory_gib": 96})
    hw = load_hardware_file(path)
    assert hw == dataclasses.replace(PRESETS["h100"], name="part", memory_bytes=96 * GiB)
    assert hardware_for_run(RunConfig(), path) == hw


def test_a_negative_memory_is_refused_once_not_also_against_its_reserve(tmp_path):
    with pytest.raises(SpecError) as refused:
        load_hardware_file(write(tmp_path, {"base": "h100", "memory_gib": -80}))
    assert "memory_bytes must be > 0" in str(refused.value)
    assert "memory_reserved" not in str(refused.value)  # "must be below memory_bytes (-80 GiB)" had followed


def test_a_hardware_file_changes_the_entries_it_names_of_its_bases_tables(tmp_path):
    """A peak by dtype beside a base changes that dtype's (it had replaced the whole table, and a file
    naming only fp8 was refused for want of fp32)."""
    hw = load_hardware_file(write(tmp_path, {"base": "h100", "peak_tflops": {"fp8": 1500},
                                             "host_overhead_s": {"layer_forward": 1e-5}}))
    assert hw.peak_flops == {**PRESETS["h100"].peak_flops, "fp8": 1500e12}
    assert hw.host_overhead_s == {"layer_forward": 1e-5}
    # a part without FP8: null drops the base's entry, and an FP8 model is refused on it
    no_fp8 = load_hardware_file(write(tmp_path, {"base": "h100", "peak_tflops": {"fp8": None}}))
    assert no_fp8.peak_flops == {k: v for k, v in PRESETS["h100"].peak_flops.items() if k != "fp8"}
    from paralab.sim.presets import get_model

    assert no_fp8.problems_for(get_model("llama3-8b").replace(fp8=True))
    # a part without a bf16 peak refuses a bf16 model, as one without FP8 refuses FP8 GEMMs: it had been
    # priced at the fp32 peak (15.7 TFLOP/s where the part computes 125 in fp16), silently
    no_bf16 = load_hardware_file(write(tmp_path, {"base": "a100",
                                                  "peak_tflops": {"bf16": None, "fp16": 125, "fp32": 15.7}}))
    assert no_bf16.problems_for(get_model("llama3-8b")) == [
        "a bf16 model needs hardware with a bf16 peak; part lists fp16, fp32"]
    assert not no_bf16.problems_for(get_model("llama3-8b").replace(dtype="fp16"))
    whole = {k: v for k, v in dataclasses.asdict(PRESETS["a100"]).items() if k != "peak_flops"}
    with pytest.raises(SpecError, match="peak_flops must be an object of finite numbers"):
        load_hardware_file(write(tmp_path, {**whole, "peak_tflops": {"fp32": None}}))  # no base to drop from


def test_a_part_from_its_datasheet_alone_is_told_which_modelling_constants_it_took(tmp_path):
    """Without a base, a file giving an H100's datasheet figures had priced a 70B step 12% faster than
    the h100 preset, silently: it took HardwareSpec's defaults for what no datasheet states."""
    sheet = {"memory_gib": 79.6, "peak_tflops": {"bf16": 989, "fp32": 67}, "memory_bandwidth_gb_s": 3350,
             "gpus_per_node": 8, "nvlink_gb_s": 360, "nvlink_latency_us": 5, "nic_gb_s": 45,
             "nic_latency_us": 10}
    took = r"no base.*straggler_cv 0 \(presets: 0.017\), comm_sm_share 0"
    with pytest.warns(ParalabWarning, match=took) as said:
        load_hardware_file(write(tmp_path, sheet))
    assert "matmul_max_efficiency" in str(said[0].message)
    assert said[0].filename == __file__  # the caller's line, not one of paralab's
    given = {"matmul_max_efficiency": 0.7, "straggler_cv": 0.01, "comm_sm_share": 0.18,
             "flash2_efficiency": PRESETS["h100"].flash2_efficiency}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_hardware_file(write(tmp_path, {**sheet, **given}))
        load_hardware_file(write(tmp_path, {"base": "h100", "memory_gib": 96}))


def test_a_hardware_file_may_give_every_field_in_si_units(tmp_path):
    fields = dataclasses.asdict(PRESETS["a100"])
    path = write(tmp_path, dict(fields, name="a100-again"))
    assert load_hardware_file(path) == dataclasses.replace(PRESETS["a100"], name="a100-again")


@pytest.mark.parametrize(
    "data, words",
    [
        ({"base": "h100", "memory_gigs": 80}, "unknown key(s) memory_gigs"),
        ({"base": "tpu"}, "base 'tpu' is not a preset"),
        ({"memory_gib": 80}, "missing"),
        # named by the keys the docs tell one to write (it had said intra_latency, inter_latency)
        ({"name": "x", "peak_tflops": {"bf16": 989}, "memory_gib": 80, "memory_bandwidth_gb_s": 3350,
          "gpus_per_node": 8, "nvlink_gb_s": 450, "nic_gb_s": 50},
         "missing nvlink_latency_us (or intra_latency in SI units), nic_latency_us (or inter_latency in SI "
         "units); or give base"),
        # 5e9 µs had priced a 70,000 s step
        ({"base": "h100", "nvlink_latency_us": 5e9}, "hardware intra_latency 5000 (SI units) is outside any "
         "part's (0 to 10 s): a unit slip?"),
        # the key the file gave, beside the field it sets: "inter_bw" had been a name the file never used
        ({"base": "h100", "memory_gib": -1},
         "memory_bytes must be > 0, got -1073741824 (the file's memory_gib, in SI units here)"),
        ({"base": "h100", "nic_gb_s": 0},
         "inter_bw must be > 0, got 0.0 (the file's nic_gb_s, in SI units here)"),
        # a NIC's line rate is shared among the node's GPUs, not a unit converted
        ({"base": "h100", "nic_gbit_s": 1e-6}, "(set from the file's nic_gbit_s)"),
        ({"base": "h100", "oversubscription": 0.5}, "oversubscription must be >= 1"),
        ({**dataclasses.asdict(PRESETS["a100"]), "peak_tflops": {"fp32": 10}},
         "peak_flops is given twice (peak_flops and peak_tflops)"),
        # a dtype no model trains in was ignored, silently (its GEMMs priced at the base's peak)
        ({"base": "h100", "peak_tflops": {"bfloat16": 500}},
         "peak_flops (a file's peak_tflops): unknown dtype(s) bfloat16; dtypes: bf16, fp16, fp32, fp8"),
        ({"base": "h100", "peak_tflops": {"int8": 3958}}, "unknown dtype(s) int8"),
        # 500% had been taken: the slowest of 1,000 GPUs at 17 times the mean's time
        ({"base": "h100", "straggler_cv": 5}, "straggler_cv is the spread of one GPU's compute speed "
         "(standard deviation over the mean) in [0, 0.1]"),
        ({"base": "h100", "straggler_cv": -0.01}, "in [0, 0.1]"),
        # one field under two keys, one of which would silently win; a share of no line rate; a number
        ({"base": "h100", "memory_gib": 80, "memory_bytes": 90e9},
         "memory_bytes is given twice (memory_gib and memory_bytes)"),
        ({"base": "h100", "nic_gbit_s": 400, "nic_gb_s": 25},
         "inter_bw is given twice (nic_gbit_s and nic_gb_s)"),
        ({"base": "h100", "nics_per_node": 4}, "nics_per_node shares nic_gbit_s among the GPUs"),
        ({"base": "h100", "name": 5}, "hardware name must be text, got 5"),
        ({"base": "h100", "memory_gib": "eighty"}, "memory_gib must be a number"),
        ({"base": "h100", "intra_latency": "5us"}, "intra_latency must be a finite number"),
        ({"base": "h100", "comm_sm_share": 1.0}, "comm_sm_share is a share of the SMs in [0, 1)"),
        # 1e400 reads as infinity; a number where an object by dtype belongs; a negative latency
        ({"base": "a100", "peak_flops": {"fp32": 1e400}}, "peak_flops must be an object of finite numbers"),
        ({"base": "a100", "peak_flops": 0}, "an object of finite numbers (FLOP/s by dtype)"),
        ({"base": "a100", "inter_latency": -1}, "hardware inter_latency must be >= 0, got -1"),
        ({"base": "a100", "matmul_max_efficiency": 1.5}, "matmul_max_efficiency is a share of the peak"),
        ({"memory_gib": 80, "base": "a100", "gpus_per_node": None}, "gpus_per_node must be a finite number"),
        # a unit-named key of the wrong shape, named as the file gave it (a bare peak_tflops had been told
        # "a number (or numbers by dtype)", then refused as an SI peak_flops); a record that is no object
        ({"base": "a100", "peak_tflops": 1000},
         'peak_tflops must be an object of numbers by dtype, like {"bf16": 989}, got 1000'),
        ({"base": "a100", "memory_gib": {"bf16": 80}}, "memory_gib must be a number, got {'bf16': 80}"),
        ({"base": "a100", "calibration": 5}, "hardware calibration must be an object (a JSON {...}), got 5"),
        # checked after the units: a conversion past a float's range
        ({"base": "a100", "memory_gib": 1e300}, "memory_bytes must be a finite number, got inf"),
        ({"base": "a100", "host_overhead_s": {"bogus": 1}}, "host_overhead_s: unknown part(s) bogus"),
        ({"base": "h100", "flash2_efficiency": [[4096, 0.3], [2048, 0.27]]}, "lengths rising"),
        ({"base": "h100", "flash2_efficiency": [[2048, 30]]}, "share of the peak in (0, 1]"),
        ({"base": "h100", "flash2_efficiency": [2048, 0.3]}, "flash2_efficiency must be [sequence length"),
        ({"base": "h100", "flash2_efficiency": [["2048", "0.3"]]}, "flash2_efficiency must be [sequence"),
        # measured curves: pairs, bytes rising, seconds positive (interpolated in logs) and never falling
        *(({"base": "h100", "allreduce_curve": curve}, "allreduce_curve must be [bytes, seconds] points")
          for curve in ([[1, 2], [3]], "x", [[4, -1e-4], [8, -1e-5]], [[4, 0], [8, 1e-4]],
                        [[8, 1e-4], [4, 2e-4]], [[4, 2e-4], [8, 1e-4]], [["4", 1e-4]], [[0, 1e-4]],
                        [[4, float("nan")]])),
        ({"base": "h100", "p2p_curve": {"4": 1e-4}}, "p2p_curve must be [bytes, seconds] points"),
        # a reserve that leaves nothing; counts that are not whole; strings where booleans belong
        ({"base": "h100", "memory_reserved_gib": 100}, "memory_reserved_bytes (100 GiB) must be below"),
        ({"base": "h100", "gpus_per_node": 3.5}, "gpus_per_node must be a whole number, got 3.5"),
        ({"base": "h100", "pod_gpus": 2048.0}, "pod_gpus must be a whole number, got 2048.0"),
        ({"base": "h100", "shared_compute": "yes"}, "shared_compute must be true or false (a JSON boolean)"),
        ({"base": "h100", "overlaps_comm": "no"}, "overlaps_comm must be true or false (a JSON boolean)"),
        ({"base": "h100", "nic_gbit_s": "400"}, "nic_gbit_s must be a number > 0, got '400'"),
        ({"base": "h100", "nic_gbit_s": 400, "nics_per_node": "4"}, "nics_per_node must be a number"),
        # half a NIC had been taken: 3.5 NICs shared by eight GPUs
        ({"base": "h100", "nic_gbit_s": 400, "nics_per_node": 3.5},
         "nics_per_node counts NICs, a whole number, got 3.5"),
        # had named inter_bw, a key the file did not write
        ({"base": "h100", "nic_gbit_s": 400, "nics_per_node": 0},
         "nics_per_node must be a number > 0, got 0"),
        # a cap without the TDP it divides had been dropped silently; a pod is whole nodes
        ({"base": "h100", "tdp_w": 0, "power_limit_w": 500},
         "power_limit_w (500 W) caps compute by its share"),
        ({"base": "h100", "pod_gpus": 4}, "pod_gpus (4) must be whole nodes of 8 GPUs"),
        ({"base": "h100", "nic_gbit_s": 400, "gpus_per_node": "8"}, "gpus_per_node must be a finite number"),
        # unit slips and figures no part has (they had priced silently, or ended in ZeroDivisionError)
        ({"base": "h100", "memory_gib": 85899345920}, "memory_bytes 9.223e+19 (SI units) is outside any "
         "part's (1 MiB to 1 PiB): a unit slip?"),
        ({"base": "h100", "memory_gib": 1e-9}, "memory_bytes 1.074 (SI units) is outside"),
        ({"base": "h100", "peak_tflops": {"bf16": 989e12}},
         "peak_flops['bf16'] 9.89e+26 (SI units) is outside"),
        ({"base": "h100", "memory_bandwidth_gb_s": 1e-300}, "memory_bandwidth 1e-291 (SI units) is outside"),
        # each figure plausible alone, TB/s written under the GB/s key: 295,000 FLOPs per byte read
        ({"base": "h100", "memory_bandwidth_gb_s": 3.35},
         "peak_flops['bf16'] is 2.95e+05 FLOPs per byte of memory_bandwidth, above any part's (20,000"),
        ({"base": "h100", "power_limit_w": 900}, "power_limit_w (900 W) is above tdp_w (700 W)"),
    ],
)
def test_a_bad_hardware_file_is_refused_naming_what_is_wrong(tmp_path, data, words):
    with pytest.raises(SpecError, match=re.escape(words)):
        load_hardware_file(write(tmp_path, data))


@pytest.mark.parametrize("text, words", [
    ('{"base": "h100", "memory_gib": 80, "memory_gib": 40}', "key 'memory_gib' given twice"),
    ('{"base": "h100", "tdp_w": {"a": 1, "a": 2}}', "key 'a' given twice"),
    ("[" * 100_000 + "]" * 100_000, "maximum recursion depth exceeded"),
], ids=["a key twice", "a nested key twice", "nested past the stack"])
def test_a_hardware_file_json_cannot_say_is_refused_in_one_line(tmp_path, text, words):
    """json.loads keeps the last value of a key given twice (a file saying 80 GiB, then 40, had priced
    40 without a word), and arrays nested past the interpreter's stack had ended in a traceback: each
    is a SpecError, which the CLI says in one line with exit 2."""
    path = tmp_path / "part.json"
    path.write_text(text)
    with pytest.raises(SpecError, match=re.escape(words)):
        load_hardware_file(path)


@pytest.mark.parametrize("change, words", [
    (dict(memory_bandwidth=0.0), "memory_bandwidth must be > 0"),
    (dict(inter_bw=-1.0), "inter_bw must be > 0"),
    (dict(peak_flops={}), "peak_flops must be positive"),
    (dict(optimizer_bw=-1e12), "optimizer_bw must be >= 0"),
    (dict(elementwise_bw=-1e12), "elementwise_bw must be >= 0"),
    (dict(host_overhead_s={"step": -1.0}), "host_overhead_s['step'] must be >= 0 s"),
])
def test_a_machine_built_in_python_is_checked_before_it_is_priced(change, words):
    """Files and the CLI were checked, a HardwareSpec made in Python was not: a zero bandwidth had
    ended in ZeroDivisionError inside the cost model, and negative seconds or rates had been taken
    (a step shorter than its own pipeline)."""
    from paralab.sim import ParallelSpec, get_model

    bad = dataclasses.replace(PRESETS["h100"], **change)
    spec = ParallelSpec(dp=8, global_batch=64)
    with pytest.raises(SpecError, match=re.escape(words)):
        cost.predict(get_model("llama3-8b"), spec, bad)
    with pytest.raises(SpecError, match=re.escape(words)):
        cost.predict(get_model("llama3-8b").replace(seq=32768), spec.replace(dp=4, cp=2), bad)


def test_a_hardware_file_may_give_measured_curves_flat_in_places(tmp_path):
    """As the calibration makes them (non-decreasing: a burst of load is spread over its neighbours)."""
    curve = [[4, 1e-4], [4096, 1e-4], [2**20, 1e-3]]
    hw = load_hardware_file(write(tmp_path, {"base": "h100", "allreduce_curve": curve, "p2p_curve": curve}))
    assert hw.allreduce_curve == hw.p2p_curve == curve
    assert cost.interpolate(curve, 2**10) == pytest.approx(1e-4)


@pytest.mark.parametrize("name, tflops", [("a100", (155, 173, 182)), ("h100", (265, 294, 308)),
                                          ("h200", (265, 294, 308))])
def test_flash_attention_2_shares_are_its_benchmark_over_the_dense_peak(name, tflops):
    """FlashAttention-2's repository (assets/flash2_{a100,h100}_fwd_bwd_benchmark.png: causal, head
    dimension 128, forward and backward) at 2k, 4k and 8k tokens; the H200 has the H100's SMs."""
    points = PRESETS[name].flash2_efficiency
    assert [n for n, _ in points] == [2048, 4096, 8192]
    peak = PRESETS[name].datasheet_peak("bf16")
    assert [share * peak / 1e12 for _, share in points] == pytest.approx(tflops)


def test_a_power_cap_slows_compute_by_the_cube_root_of_the_power_share(tmp_path):
    capped = load_hardware_file(write(tmp_path, {"base": "h100", "power_limit_w": 350}))
    assert capped.peak("bf16") == pytest.approx(989e12 * 0.5 ** (1 / 3))
    assert (
        capped.datasheet_peak("bf16") == 989e12
        and capped.memory_bandwidth == PRESETS["h100"].memory_bandwidth
    )
    from paralab.sim.presets import get_model
    from paralab.sim.specs import ParallelSpec

    spec = ParallelSpec(tp=8, global_batch=8, micro_batch=1, sequence_parallel=True)
    full, slow = (cost.predict(get_model("gpt3-13b"), spec, hw) for hw in (PRESETS["h100"], capped))
    assert (
        full.step_time_s < slow.step_time_s < full.step_time_s / 0.5 ** (1 / 3)
    )  # memory-bound work keeps its pace
    assert slow.mfu < full.mfu  # MFU stays against the rated peak


# --------------------------------------------------------------------------- scale effects of the network


def test_a_small_all_reduce_on_many_nodes_takes_the_tree():
    """NCCL's tuning model: a ring pays 2(n-1) steps of latency, a tree 2 log2(nodes) hops."""
    hw, n, payload = PRESETS["a100"], 1024, 1 << 20  # one member per node (stride 8): 1024 nodes
    ring = (
        2 * (n - 1) * hw.inter_latency + cost.counting.ring_wire_bytes("all_reduce", payload, n) / hw.inter_bw
    )
    tree = 2 * math.ceil(math.log2(n)) * hw.inter_latency + payload / (
        cost.TREE_BANDWIDTH_SHARE * hw.inter_bw
    )
    assert tree < ring / 10
    assert cost.collective_time(hw, "all_reduce", payload, n, 8) == pytest.approx(tree)
    big = 8 << 30  # bandwidth-bound: the ring wins
    assert cost.collective_time(hw, "all_reduce", big, n, 8) < big / (cost.TREE_BANDWIDTH_SHARE * hw.inter_bw)
    # reduce-scatter has no tree: its latency grows with the group
    assert cost.collective_time(hw, "reduce_scatter", payload, n, 8) > (n - 1) * hw.inter_latency


def test_inside_a_node_nvlink_sharp_reduces_in_one_hop():
    hw, payload = PRESETS["h100"], 64 << 20
    nvls = dataclasses.replace(hw, nvls_bw=480e9)
    wire = cost.counting.ring_wire_bytes("all_reduce", payload, 8)
    assert cost.collective_time(nvls, "all_reduce", payload, 8, 1) == pytest.approx(
        hw.intra_latency + wire / 480e9
    )
    assert cost.collective_time(nvls, "all_gather", payload, 8, 1) == cost.collective_time(
        hw, "all_gather", payload, 8, 1
    )


@pytest.mark.parametrize("stride, share", [(128, 1.0), (512, 6 / 7), (4096, 1 / 7)])
def test_rings_that_leave_their_pod_share_its_oversubscribed_uplinks(stride, share):
    """Llama 3's fabric: pods of 3,072 GPUs, 7:1 above them. A 64-member ring of stride 128 has 24
    members per pod (enough to fill a pod's uplink share), of stride 512 six, of stride 4096 one."""
    hw = dataclasses.replace(PRESETS["h100"], pod_gpus=3072, oversubscription=7)
    assert cost.pod_share(hw, 64, stride) == pytest.approx(share)
    assert cost.pod_share(hw, 16, 128) == 1.0  # inside one pod


def expected_max_of_normals(n: int) -> float:
    """E[max of n standard normals] by quadrature: the integral of x d(Phi^n)."""
    unit, steps = NormalDist(), 4000
    xs = [-8 + 16 * i / steps for i in range(steps + 1)]
    return sum(x * n * unit.cdf(x) ** (n - 1) * unit.pdf(x) * 16 / steps for x in xs)


@pytest.mark.parametrize("n", [2, 8, 64, 1024, 16384])
def test_a_step_waits_for_the_expected_slowest_of_its_gpus(n):
    hw = PRESETS["h100"]
    assert cost.straggler_factor(hw, 1) == 1.0
    assert cost.straggler_factor(hw, n) - 1 == pytest.approx(
        hw.straggler_cv * expected_max_of_normals(n), rel=0.06
    )


@pytest.mark.parametrize("name, sms", [("a100", 108), ("h100", 132), ("h200", 132)])
def test_a_collective_in_flight_holds_nccls_channels_worth_of_sms(name, sms):
    """24 ring channels of one thread block each (NCCL's logs of 8-GPU NVSwitch nodes) over the
    part's SM count; the local CPU model does not overlap communication at all."""
    assert PRESETS[name].comm_sm_share == pytest.approx(24 / sms)
