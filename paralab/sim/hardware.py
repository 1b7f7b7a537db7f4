"""Hardware presets: datasheet GPUs in their usual nodes, ``local`` (this machine, measured), and
custom parts described in a JSON file (:func:`load_hardware_file`).

GPU figures are dense (no 2:4 sparsity) datasheet peaks; link bandwidths are the per-GPU,
per-direction bus bandwidths NCCL reaches (about 3/4 of the NVLink datasheet figure), and the
inter-node bandwidth is one NIC per GPU as in DGX nodes. Sources: NVIDIA A100 datasheet (312 TFLOP/s
bf16, 2.0 TB/s HBM2e, NVLink 3 at 600 GB/s both ways, 400 W), DGX A100 user guide (8 x 200 Gb/s HDR
InfiniBand for compute), NVIDIA H100 / H200 datasheets (989 TFLOP/s bf16 and 1,979 fp8 dense, 3.35 /
4.8 TB/s, NVLink 4 at 900 GB/s both ways, 700 W), DGX H100 (8 x 400 Gb/s NDR). Memory is what the
driver reports as the part's total (nvidia-smi memory.total: 81920, 81559 and 143771 MiB), within
0.5% of the datasheet's 80, 80 and 141 GB read as GiB; ``tests/test_sim_hardware.py`` holds every
preset against the datasheet figures, so a unit slip (141e9 bytes is 131 GiB) fails there.

Every GPU preset's compute speed varies from part to part by ``straggler_cv`` = 1.7% (one standard
deviation): the per-GPU measurements Jain et al. published with PAL (SC24; the hal-uw/blox-pal
artifact, Zenodo 10.5281/zenodo.12575031), an SGEMM on each of 392 V100s of one cluster, each GPU's
median run against the median GPU, spread 1.7% (the median absolute deviation as a sigma; 2.0% with
the few outliers a production cluster screens out: one GPU took 20% longer). Their 1st to 99th
percentile span 9%, close to the "8% average variation" Sinha et al. 2022 ("Not All GPUs Are Created
Equal", SC22, the same group) report, which had been read as a range over thousands of GPUs (2 x 3.5
sigma, 1%). The same artifact's ResNet runs on 219 A100s spread 2.0%, read the same way. A step
waits for the slowest of its GPUs (:func:`paralab.sim.cost.straggler_factor`).

A collective in flight holds ``comm_sm_share`` of a GPU preset's SMs, which the compute it overlaps
loses: NCCL runs one thread block per channel, and NCCL's own logs of 8-GPU NVSwitch nodes show 24
ring channels on A100 (nccl-tests issue 100, nccl issue 578) and on H100 (NCCL 2.19: 12 channels
found by its topology search, doubled; nccl issue 1367), against 108 SMs on an A100 and 132 on an
H100 or H200 (NVIDIA's A100 and H100 whitepapers). DeepSeek-V3's report dedicates 20 of an H800's 132
SMs to its communication kernels, the same order.

``local`` is calibrated by microbenchmarks (:mod:`paralab.sim.calibration`) so the same cost model
predicts the CPU runs of this lab: matmul throughput at the lab models' shapes (bf16's and fp16's
apart), copy bandwidth, host time per module call, the rate of a block's non-GEMM kernels and of
Adam, gloo's all-reduce, all-gather, reduce-scatter and send/recv curves between two local processes,
and how long a synchronisation after compute waits (the ranks' jitter). The result is cached as JSON
in ``$PARALAB_CACHE`` (default ``~/.cache/paralab``); torch is imported only when calibrating.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from paralab.config import finite_number
from paralab.sim.specs import HardwareSpec, SpecError
from paralab.warn import warn

GiB = 1024**3
MiB = 1024**2

NCCL_CHANNELS = 24  # ring channels (one thread block each) of a large collective on an 8-GPU NVSwitch node
GPU_STRAGGLER_CV = 0.017  # every GPU preset's part-to-part spread of compute speed (the module docstring)

# FlashAttention-2 forward and backward, causal, head dimension 128, at sequence lengths 2k, 4k and 8k:
# TFLOP/s from its repository's benchmark figures (Dao-AILab/flash-attention, assets/flash2_a100_ and
# flash2_h100_fwd_bwd_benchmark.png, July 2023), as shares of the dense bf16 peak. On an H100 it runs
# Ampere's instructions (no warpgroup MMA, no TMA) and reaches about 30%: why FlashAttention-3 and
# cuDNN's kernels were written. The H200 has the H100's SMs and clocks, and the kernel is compute-bound.
FLASH2_TFLOPS = {"a100": (155, 173, 182), "h100": (265, 294, 308)}
A100_BF16, H100_BF16 = 312e12, 989e12  # dense peaks (the H200's is the H100's)
FLASH2_LENGTHS = (2048, 4096, 8192)


def _flash2_points(part: str, peak: float) -> list:
    return [[n, tflops * 1e12 / peak] for n, tflops in zip(FLASH2_LENGTHS, FLASH2_TFLOPS[part], strict=True)]


PRESETS: dict[str, HardwareSpec] = {
    "a100": HardwareSpec(
        name="a100",
        peak_flops={"bf16": A100_BF16, "fp16": A100_BF16, "fp32": 19.5e12},
        memory_bytes=81920 * MiB,
        memory_bandwidth=2.039e12,
        gpus_per_node=8,
        intra_bw=230e9,
        intra_latency=5e-6,
        inter_bw=23e9,
        inter_latency=10e-6,
        matmul_max_efficiency=0.8,
        tdp_w=400,
        straggler_cv=GPU_STRAGGLER_CV,
        comm_sm_share=NCCL_CHANNELS / 108,
        flash2_efficiency=_flash2_points("a100", A100_BF16),
        notes="A100 80GB SXM in DGX A100 nodes: NVLink 3 / NVSwitch inside, 8 x HDR 200 Gb/s between",
    ),
    "h100": HardwareSpec(
        name="h100",
        peak_flops={"bf16": H100_BF16, "fp16": H100_BF16, "fp8": 1979e12, "fp32": 67e12},
        memory_bytes=81559 * MiB,
        memory_bandwidth=3.35e12,
        gpus_per_node=8,
        intra_bw=360e9,
        intra_latency=5e-6,
        inter_bw=45e9,
        inter_latency=10e-6,
        matmul_max_efficiency=0.7,
        tdp_w=700,
        straggler_cv=GPU_STRAGGLER_CV,
        comm_sm_share=NCCL_CHANNELS / 132,
        flash2_efficiency=_flash2_points("h100", H100_BF16),
        notes="H100 SXM in DGX H100 nodes: NVLink 4 / NVSwitch inside, 8 x NDR 400 Gb/s between",
    ),
    "h200": HardwareSpec(
        name="h200",
        peak_flops={"bf16": H100_BF16, "fp16": H100_BF16, "fp8": 1979e12, "fp32": 67e12},
        memory_bytes=143771 * MiB,
        memory_bandwidth=4.8e12,
        gpus_per_node=8,
        intra_bw=360e9,
        intra_latency=5e-6,
        inter_bw=45e9,
        inter_latency=10e-6,
        matmul_max_efficiency=0.7,
        tdp_w=700,
        straggler_cv=GPU_STRAGGLER_CV,
        comm_sm_share=NCCL_CHANNELS / 132,
        flash2_efficiency=_flash2_points("h100", H100_BF16),
        notes="H200 SXM (H100 compute, 141 GB HBM3e) in 8-GPU HGX nodes, 8 x NDR 400 Gb/s between",
    ),
}
ALIASES = {"a100-80gb": "a100", "a100-sxm": "a100", "h100-sxm": "h100", "h200-sxm": "h200"}
NAMES = (*PRESETS, "local")


def get_hardware(name: str, recalibrate: bool = False,
                 on_measure: Callable[[Path], None] | None = None) -> HardwareSpec:
    """A preset by name (case-insensitive), ``local`` (the cached calibration, or measured now), or
    a hardware file (a path ending in ``.json``, see :func:`load_hardware_file`). ``on_measure`` is
    told the cache path when ``local`` is about to be measured (seconds), so a caller can say so.

    A preset comes as the caller's own copy: the spec is frozen but its peak and curve tables are
    dicts and lists, and a notebook that edits one must not change what every later plan reads."""
    if not isinstance(name, str | os.PathLike):  # None had been an AttributeError
        raise SpecError(f"hardware must be a preset's name or a .json file's path, got {name!r}")
    name = os.fspath(name)
    if name.lower().endswith(".json"):
        return load_hardware_file(name)
    key = ALIASES.get(name.lower(), name.lower())
    if key == "local":
        return local(recalibrate=recalibrate, on_measure=on_measure)
    if key not in PRESETS:
        raise SpecError(f"unknown hardware {name!r}; choose from {', '.join(NAMES)} or give a FILE.json")
    return copy.deepcopy(PRESETS[key])


# Hardware-file keys in the units datasheets use: key -> (HardwareSpec field, factor to SI units).
# Any HardwareSpec field may also be given by its own name, in SI units (bytes, FLOP/s, bytes/s, s).
FILE_UNITS = {
    "memory_gib": ("memory_bytes", GiB),
    "memory_reserved_gib": ("memory_reserved_bytes", GiB),
    "peak_tflops": ("peak_flops", 1e12),
    "memory_bandwidth_gb_s": ("memory_bandwidth", 1e9),
    "nvlink_gb_s": ("intra_bw", 1e9),
    "nvlink_latency_us": ("intra_latency", 1e-6),
    "nvls_gb_s": ("nvls_bw", 1e9),
    "nic_gb_s": ("inter_bw", 1e9),
    "nic_latency_us": ("inter_latency", 1e-6),
}
# a NIC's line rate as vendors state it (Gb/s) and how many a node has: inter_bw is its per-GPU share
NIC_KEYS = ("nic_gbit_s", "nics_per_node")


def _one_value_a_key(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are all different: json.loads keeps the last of a key given twice, and
    a file that says memory_gib 80 and then 40 had priced 40 without a word."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"key {key!r} given twice")
        seen[key] = value
    return seen


def load_hardware_file(path: str | Path) -> HardwareSpec:
    """A custom part from a JSON object (docs/simulator.md lists the fields).

    ``base`` names a preset to start from (default: every field must be given); the other keys are
    HardwareSpec fields in SI units or the unit-named keys of :data:`FILE_UNITS`, and ``nic_gbit_s``
    (with ``nics_per_node``, default one per GPU) sets the per-GPU inter-node bandwidth from a NIC's
    line rate. Unknown keys, bad values and missing fields raise SpecError naming them.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(), object_pairs_hook=_one_value_a_key)
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: arrays nested past the stack
        raise SpecError(f"cannot read hardware file {str(path)!r}: {err}") from None
    if not isinstance(data, dict):
        raise SpecError(f"hardware file {str(path)!r} must hold one JSON object")
    fields = {f.name for f in dataclasses.fields(HardwareSpec)}
    unknown = sorted(set(data) - fields - set(FILE_UNITS) - set(NIC_KEYS) - {"base"})
    if unknown:
        raise SpecError(f"hardware file {str(path)!r}: unknown key(s) {', '.join(unknown)}; use HardwareSpec "
                        f"fields (SI units), {', '.join(FILE_UNITS)}, {', '.join(NIC_KEYS)} or base")
    twice = _given_twice(data)
    if twice:
        raise SpecError(f"hardware file {str(path)!r}: " + "; ".join(twice))
    try:
        spec = _file_spec(data, fields, path)
        problems = spec.problems()
    except SpecError:
        raise
    except (TypeError, ValueError) as err:  # a string where a number belongs, and the like
        raise SpecError(f"hardware file {str(path)!r}: {err}") from None
    if problems:
        said = [_as_the_file_says(problem, data) for problem in problems]
        raise SpecError(f"hardware file {str(path)!r}: " + "; ".join(said))
    if data.get("base") is None:
        _say_modelling_defaults(path, [name for name in MODELLING_FIELDS if name not in data])
    return spec


# What no datasheet states but the GPU presets set from measurements (see the module docstring): a part
# described from its datasheet alone would take HardwareSpec's defaults for them, which price it faster
# than the presets price their parts (an H100 so described had stepped 12% faster than the h100 preset)
MODELLING_FIELDS = ("matmul_max_efficiency", "straggler_cv", "comm_sm_share", "flash2_efficiency")


def _say_modelling_defaults(path: Path, omitted: list[str]) -> None:
    """Warn which modelling constants a file without ``base`` left at HardwareSpec's defaults, beside
    the values the GPU presets hold for them."""
    if not omitted:
        return
    defaults = {f.name: f.default for f in dataclasses.fields(HardwareSpec)}

    def took(name: str) -> str:  # the default taken, beside the presets' values
        if name == "flash2_efficiency":  # a table, not a number
            return f"{name} none (presets: measured FlashAttention-2 speeds)"
        low, high = (f(getattr(preset, name) for preset in PRESETS.values()) for f in (min, max))
        return f"{name} {defaults[name]:g} (presets: {low:.2g}{f'-{high:.2g}' if high != low else ''})"

    said = ", ".join(map(took, omitted))
    warn(f"hardware file {str(path)!r} has no base, so it takes HardwareSpec's defaults for what a datasheet "
         f"does not state: {said}; give them, or a base preset to start from")


def _field_of(key: str) -> str:
    """The HardwareSpec field a file's key sets: a unit-named key's, a NIC's line rate's, or its own."""
    return FILE_UNITS[key][0] if key in FILE_UNITS else "inter_bw" if key == "nic_gbit_s" else key


def _as_the_file_says(problem: str, data: dict) -> str:
    """A spec's problem with the key the file gave its field under, where that was a unit-named one:
    ``nic_gb_s: 0`` had been refused as "hardware inter_bw must be > 0", a name the file never used."""
    for key in data:
        field_name = _field_of(key)
        if field_name == key or key in problem or not problem.startswith(f"hardware {field_name} "):
            continue
        if key in NIC_KEYS:  # a line rate shared among the node's GPUs, not a unit converted
            return f"{problem} (set from the file's {key})"
        return f"{problem} (the file's {key}{'' if 'SI units' in problem else ', in SI units here'})"
    return problem


def _given_twice(data: dict) -> list[str]:
    """A field the file sets under two keys (its SI name and a unit-named key, or a NIC's line rate
    beside a per-GPU bandwidth): one would silently win."""
    keys_of: dict[str, list[str]] = {}
    for key in data:
        keys_of.setdefault(_field_of(key), []).append(key)
    return [f"{name} is given twice ({' and '.join(keys)}): give one"
            for name, keys in keys_of.items() if len(keys) > 1]


def _file_spec(data: dict, fields: set, path: Path) -> HardwareSpec:
    values = {k: v for k, v in data.items() if k in fields}  # checked by HardwareSpec.problems
    for key, (name, factor) in FILE_UNITS.items():
        if key in data:
            value = data[key]
            # a null by dtype drops that entry of the base's table (below)
            numbers = [v for v in value.values() if v is not None] if isinstance(value, dict) else [value]
            by_dtype = HardwareSpec.__dataclass_fields__[name].type.startswith("dict")  # peak_flops
            if isinstance(value, dict) != by_dtype or not all(map(finite_number, numbers)):
                kind = 'an object of numbers by dtype, like {"bf16": 989}' if by_dtype else "a number"
                raise SpecError(f"hardware file {str(path)!r}: {key} must be {kind}, got {value!r}")
            scaled = ({k: v if v is None else v * factor for k, v in value.items()} if isinstance(value, dict)
                      else value * factor)
            values[name] = scaled
    values.setdefault("name", path.stem)
    base = data.get("base")
    preset = ALIASES.get(str(base).lower(), str(base).lower())  # a base may be named as --hardware names it
    if base is not None and preset not in PRESETS:
        raise SpecError(f"hardware file {str(path)!r}: base {base!r} is not a preset ({', '.join(PRESETS)})")
    start = dataclasses.asdict(PRESETS[preset]) if base else {}
    for key in NIC_KEYS:
        if key in data and not (finite_number(data[key]) and data[key] > 0):
            raise SpecError(f"hardware file {str(path)!r}: {key} must be a number > 0, got {data[key]!r}")
    if "nics_per_node" in data and data["nics_per_node"] != int(data["nics_per_node"]):
        raise SpecError(f"hardware file {str(path)!r}: nics_per_node counts NICs, a whole number, got "
                        f"{data['nics_per_node']!r}")
    if "nics_per_node" in data and "nic_gbit_s" not in data:
        raise SpecError(f"hardware file {str(path)!r}: nics_per_node shares nic_gbit_s among the GPUs; "
                        "give both")
    if "nic_gbit_s" in data:
        gpus = values.get("gpus_per_node", start.get("gpus_per_node"))
        gpus = gpus if finite_number(gpus) and gpus > 0 else 1  # a bad or missing count is named later
        values["inter_bw"] = data["nic_gbit_s"] * 1e9 / 8 * data.get("nics_per_node", gpus) / gpus
    # a table by dtype or part (peak_flops, host_overhead_s) changes the base's entries it names, and
    # drops those it names null
    tables = {k: {key: x for key, x in {**start[k], **v}.items() if x is not None} for k, v in values.items()
              if isinstance(start.get(k), dict) and isinstance(v, dict)}
    return _from_fields({**start, **values, **tables}, path)


def _from_fields(values: dict, path: Path) -> HardwareSpec:
    required = [f.name for f in dataclasses.fields(HardwareSpec)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in values]
    if missing:
        unit_key = {name: key for key, (name, _) in FILE_UNITS.items()}  # the keys the docs tell one to write
        said = [f"{unit_key[n]} (or {n} in SI units)" if n in unit_key else n for n in missing]
        raise SpecError(f"hardware file {str(path)!r}: missing {', '.join(said)}; or give base, a preset "
                        "to start from")
    return HardwareSpec(**values)


def cache_dir() -> Path:
    return Path(os.environ.get("PARALAB_CACHE") or Path.home() / ".cache" / "paralab")


LOCAL_RANKS = 64  # ranks the local machine is taken to hold: one 'node', however many cores it has
CALIBRATION_VERSION = 14  # bump when what calibrate() measures changes: older caches are measured again
# 10: usable cores count a cgroup's CPU quota, so a quota-limited machine measures its ranks one at a time
# 11: a non-GEMM rate of 0 is a disturbed calibration, not cached (an older cache may hold one)
# 12: gloo's curves start at the 8 bytes their first rung reduces (recorded as 4 before)
# 13: bf16 and fp16 linears timed on their own (priced at fp32's rate they had read 23x fast on a CPU)
# 14: the corpus walks a batch's samples together: a token loaded costs about a quarter of what it did


# what a caller tells its user before local() measures (on_measure), the cache's path in it
MEASURING = "paralab: measuring this machine once (10-30 s when quiet, minutes when busy); cached in {}"

# calibrations disturbed twice, by cache path, each with whether it measured gloo's links: used for the
# rest of the process, never cached. A notebook cell that prices a run three ways had measured the
# machine eight times over, minutes on a busy box
_DISTURBED: dict[Path, tuple[HardwareSpec, bool]] = {}


def local(recalibrate: bool = False, matmul_size: int = 1024, gloo: bool = True,
          threads: int | None = None, on_measure: Callable[[Path], None] | None = None) -> HardwareSpec:
    """This machine as seen by CPU ranks, from the cache when present, else measured (< 30 s) and cached.

    ``threads=None``: the whole machine, shared by the ranks (``shared_compute``). ``threads=k``: one
    rank running with k torch threads, as ``paralab.runtime.worker.threads_for`` gives it (each cached
    separately), which is what the bridge from real runs uses. ``on_measure(path)`` is called before
    measuring, not when the cache serves.
    """
    path = cache_dir() / ("local_hardware.json" if threads is None else f"local_hardware_t{threads}.json")
    kept, with_gloo = _DISTURBED.get(path, (None, False))
    if kept is not None and not recalibrate and (with_gloo or not gloo):
        return kept  # this process's disturbed calibration: each later call had measured again
    if path.exists() and not recalibrate:
        cached = _cached_spec(path)
        made = cached.calibration if cached else {}
        # a cache made without gloo (the quick test calibration) does not serve a caller who wants links
        if made.get("version") == CALIBRATION_VERSION and (made.get("gloo") or not gloo):
            return cached
    from paralab.config import ConfigError
    from paralab.outputs import check_dir

    try:  # before measuring for 20 s, not after
        check_dir(path.parent, "the calibration cache (PARALAB_CACHE)")
    except ConfigError as exc:
        raise SpecError(str(exc)) from None
    if on_measure is not None:
        on_measure(path)
    spec = calibrate(matmul_size=matmul_size, gloo=gloo, threads=threads)
    if _disturbed(spec):  # often a moment's load: measure once more
        spec = calibrate(matmul_size=matmul_size, gloo=gloo, threads=threads)
    if why := _disturbed(spec):
        warn(f"the calibration was disturbed twice ({why}: the machine was busy?); this process uses it, "
             "but it is not cached: the next process measures again")
        _DISTURBED[path] = (spec, gloo)
        return spec
    _DISTURBED.pop(path, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec.to_dict(), indent=1))
    return spec


def _disturbed(spec: HardwareSpec) -> str:
    """Why a calibration was taken while other work held the cores ("" when it was not): other
    processes used more than OTHERS_CPU_LIMIT of the cores' time while it measured, its small matmuls
    ran far slower than any matmul law explains, or the GEMMs timed apart ran so much slower than the
    blocks that contain them that the blocks' non-GEMM work fitted no time at all (a rate of 0; a real
    CPU moves those bytes at a finite rate)."""
    # not at import: its workers run it as __main__
    from paralab.sim.calibration import DISTURBED_HALF_DIM, OTHERS_CPU_LIMIT

    if (others := spec.calibration.get("others_cpu_share", 0.0)) > OTHERS_CPU_LIMIT:
        return f"other processes used {others:.0%} of the cores' time while it measured"
    if spec.matmul_half_dim >= DISTURBED_HALF_DIM:
        return "small matmuls ran far slower than any matmul law explains"
    if not (spec.elementwise_bw > 0 and spec.elementwise_backward_bw > 0):
        return "a block's GEMMs alone outlasted the block"
    return ""


def _cached_spec(path: Path) -> HardwareSpec | None:
    """The calibration cached at ``path``, or None (with a warning) when the file cannot be read as
    one: a damaged cache is measured again and rewritten, not a crash."""
    try:
        spec = HardwareSpec.from_dict(json.loads(path.read_text()))
        if problems := spec.problems():  # a calibration record that is no object among them
            raise ValueError("; ".join(problems))
        return spec
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        warn(f"{path} is not a readable calibration ({type(exc).__name__}: {exc}); measuring again")
        return None


def calibrate(matmul_size: int = 1024, gloo: bool = True, threads: int | None = None,
              ranks: int = 2) -> HardwareSpec:
    """Measure this machine (see :mod:`paralab.sim.calibration`): matmul rate and shape law at the lab
    models' shapes plus one ``matmul_size`` square, each 16-bit dtype's rate on that law (timed on a
    linear's three matmuls), copy bandwidth, host time per module call and per optimizer tensor, the
    non-GEMM rate of real blocks, Adam's rate, and (optionally) gloo curves.

    With ``threads`` the figures are one rank's, measured with that many torch threads; without, the
    whole machine's (every thread), shared by the ranks. With ``threads`` and ``gloo``, ``ranks``
    processes run the compute benchmarks at the same time, as the ranks of a run do, when their threads
    fit on the cores (else one runs them: such a rank is its run's only one). Without ``gloo`` the
    link figures are a loopback guess (20 us, 1 GB/s, no curves) so tests can calibrate in seconds.
    """
    import torch

    from paralab.runtime.worker import usable_cores
    from paralab.sim import calibration as bench

    others_before = bench.others_cpu()
    n = matmul_size
    shapes = (*bench.MODEL_SHAPES, (n, n, n))
    curves = {"allreduce": [], "allgather": [], "reducescatter": [], "p2p": []}

    # ranks measure side by side, as they will run, when they fit on the cores: a k-thread rank that
    # has no room beside another is a run's only rank (one rank takes every core), and timing two of
    # them at once would measure threads waiting for each other, not the rank
    if gloo and threads is not None and ranks * threads <= usable_cores():
        figures, curves = bench.concurrent_figures(threads, ranks, shapes)
    else:
        before = torch.get_num_threads()
        torch.set_num_threads(threads or before)
        try:
            figures = bench.compute_figures(shapes)
        finally:
            torch.set_num_threads(before)
        if gloo:
            curves = bench.gloo_curves()
    others = bench.others_cpu_share(others_before, bench.others_cpu(), usable_cores())
    links = bench.link_summary(curves) if curves["allreduce"] else {"latency": 20e-6, "bw": 1e9}
    rate, half, rows = bench.matmul_law(rows=figures["matmul_rows"])
    host = figures["host"]
    cores = os.cpu_count() or 1
    who = f"one rank with {threads} thread(s)" if threads else f"all {cores} cores, shared by the ranks"
    spec = HardwareSpec(
        name="local",
        # a dtype this CPU does not train in has no peak: a model in it is refused (HardwareSpec.problems_for)
        peak_flops={"fp32": rate, **{dtype: bench.rate_at_half(low, half)
                                     for dtype, low in figures["low_precision_rows"].items()}},
        memory_bytes=_total_memory(),
        memory_bandwidth=figures["copy_bw"],
        gpus_per_node=LOCAL_RANKS,  # every rank of a local run is a process on this machine
        intra_bw=links["bw"],
        intra_latency=links["latency"],
        inter_bw=links["bw"],
        inter_latency=links["latency"],
        matmul_max_efficiency=1.0,  # ``rate`` is already the fitted asymptote of these shapes
        matmul_half_dim=half,
        kernel_overhead_s=0.0,  # the host time per call is measured per module in host_overhead_s
        shared_compute=threads is None,
        host_overhead_s=host,
        optimizer_bw=bench.optimizer_bandwidth(figures["adam_1m"], host["tensor_update"]),
        allreduce_curve=curves["allreduce"],
        allgather_curve=curves["allgather"],
        reducescatter_curve=curves["reducescatter"],
        p2p_curve=curves["p2p"],
        notes=f"this machine ({who}), torch {torch.__version__}, "
              f"calibrated {time.strftime('%Y-%m-%d %H:%M')}",
        calibration={"version": CALIBRATION_VERSION, "threads": threads, "matmul_s": [list(r) for r in rows],
                     "low_precision_matmul_s": {dtype: [list(r) for r in low]
                                                for dtype, low in figures["low_precision_rows"].items()},
                     "blocks": figures["blocks"], "adam_1m_s": figures["adam_1m"], "gloo": gloo,
                     "others_cpu_share": others},
    )
    # the blocks ran as one rank's (with every core when ``threads`` is None): fit them as such
    one_rank = dataclasses.replace(spec, shared_compute=False)
    forward_bw, backward_bw = bench.fit_elementwise_bandwidths(one_rank, figures["blocks"])
    # a synchronisation's wait as measured between two ranks, else one rank's own spread
    jitter = bench.fit_wait_jitter(curves["sync"]) if curves.get("sync") else bench.fit_sync_jitter(
        figures["blocks"])
    return dataclasses.replace(spec, elementwise_bw=forward_bw, elementwise_backward_bw=backward_bw,
                               sync_jitter=jitter, overlaps_comm=False)


def _total_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16.0 * GiB
