"""The resolved Layout: one pure function from a RunConfig to degrees, schedule and batch split; the
strategy registry it reads; and the shape of the code around it (no import cycles)."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

import paralab
from paralab import cli
from paralab.config import ConfigError, RunConfig
from paralab.layout import AXES, Layout, mesh_layout, resolve_layout
from paralab.runtime import launch as launch_module
from paralab.strategies.registry import strategies, strategy_table

ROOT = Path(__file__).resolve().parents[1]


def _import_graph() -> dict[str, set[str]]:
    """paralab module -> the paralab modules it imports anywhere in its source (function bodies too)."""
    modules = {}
    for path in (ROOT / "paralab").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        modules[name] = deps
    return {m: {d for d in deps if d in modules and d != m and not m.startswith(d + ".")}
            for m, deps in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of imports in ``graph`` (depth-first search), or None."""
    state: dict[str, str] = {}

    def visit(module, stack):
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep, stack + [dep])):
                return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def test_the_import_graph_has_no_cycle():
    graph = _import_graph()
    assert len(graph) > 40, "the graph should hold every paralab module"
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# ------------------------------------------------------------------------------------- the docs table
def test_the_readme_table_is_the_registry():
    """README's strategy table is generated from the registry (`paralab strategies` prints it)."""
    assert strategy_table() in (ROOT / "README.md").read_text()


def test_a_paralab_strategy_is_found_without_importing_torchs_references():
    """A fresh process (a torchrun worker) that runs ddp never imports the reference modules, which
    bring torch's pipelining and compiler stack (about 80 MB a process); asking for a torch_* name does."""
    import subprocess
    import sys

    probe = ("import sys; from paralab.strategies.registry import get_strategy; get_strategy({!r}); "
             "print(sorted(m.rsplit('.', 1)[-1] "
             "for m in sys.modules if m.startswith('paralab.strategies.reference')))")
    for name, expected in (("ddp", "[]"), ("hybrid", "[]"),
                           ("torch_fsdp", "['reference_ddp', 'reference_fsdp', "
                                          "'reference_pipeline', 'reference_tensor']")):
        out = subprocess.run([sys.executable, "-c", probe.format(name)], capture_output=True,
                             text=True, check=True)
        assert out.stdout.strip() == expected, (name, out.stdout, out.stderr)


def _world_for(strategy) -> int:
    return {0: 1, 1: 4, 2: 4, 3: 8, 4: 8}[len(strategy.axes)]


@pytest.mark.parametrize("name", list(strategies()))
def test_every_strategy_resolves_to_the_degrees_its_table_row_says(name):
    """The table's mesh axes: a single-axis strategy takes the whole world on its axis; a multi-axis
    one splits it (dp fills what the others leave); every other axis is 1."""
    strategy = strategies()[name]
    world = _world_for(strategy)
    extra = {"tp": 2} if len(strategy.axes) > 1 else {}
    extra.update({"pp": 2} if len(strategy.axes) >= 3 else {})
    extra.update({"microbatches": 4} if "pp" in strategy.axes and name != "mp" else {})
    # ep needs experts
    model = dict(layers=4, hidden=64, heads=4, vocab=128, experts=4 if name == "ep" else 0)
    layout = resolve_layout(RunConfig.build(model, strategy=name, world_size=world, global_batch=8, **extra))
    degrees = {axis: layout.degree(axis) for axis in AXES}
    assert math.prod(degrees.values()) == world
    for axis in AXES:
        if axis not in strategy.axes:
            assert degrees[axis] == 1, f"{name} does not split over {axis}"
    if len(strategy.axes) == 1:
        assert degrees[strategy.axes[0]] == world
    assert layout.zero == strategy.zero or name == "hybrid"
    assert layout.pipelined == ("pp" in strategy.axes and degrees["pp"] > 1)


@pytest.mark.parametrize("name, world, options, expected", [
    ("pp", 4, dict(microbatches=8), dict(pp=4, schedule="1f1b", microbatches=8, micro_batch=1)),
    ("pp", 2, dict(schedule="zbv", microbatches=4), dict(pp=2, schedule="zbv", virtual_stages=2)),
    ("mp", 4, {}, dict(pp=4, schedule="naive", microbatches=1)),
    ("hybrid", 8, dict(tp=2, pp=2), dict(dp=2, tp=2, pp=2, schedule="1f1b", batch_per_replica=4)),
    ("hybrid", 4, dict(tp=2, microbatches=2), dict(dp=2, tp=2, pp=1, schedule="", microbatches=2)),
    ("zero2", 2, {}, dict(dp=2, zero=2)),
    ("torch_hybrid", 4, dict(tp=2), dict(dp=2, tp=2)),
    ("ep", 4, dict(model="tiny-moe"), dict(dp=4, ep=4, tp=1, pp=1)),
    ("ep", 4, dict(model="tiny-moe", ep=2), dict(dp=4, ep=2)),
    ("hybrid", 8, dict(model="tiny-moe", pp=2, ep=2), dict(dp=4, pp=2, ep=2, schedule="1f1b")),
])
def test_the_resolved_shapes_of_the_lab_strategies(name, world, options, expected):
    options = {"model": "tiny", **options}
    layout = resolve_layout(RunConfig.build(options.pop("model"), strategy=name, world_size=world, **options))
    assert {k: getattr(layout, k) for k in expected} == expected


# ------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("options, message", [
    (dict(strategy="ddp", tp=3), r"ddp splits over dp only; it does not take tp=3"),
    (dict(strategy="ddp", schedule="bogus"), r"ddp has no pipeline: schedule=bogus"),
    (dict(strategy="ddp", virtual_stages=3), r"ddp has no pipeline: virtual_stages=3"),
    (dict(strategy="pp", dp=2), r"pp splits over pp only; it does not take dp=2"),
    (dict(strategy="pp", reduce_dtype="bf16"), r"reduce_dtype=bf16 .* pp has no reduction it applies to"),
    (dict(strategy="torch_tp", reduce_dtype="bf16"), r"torch_tp has no reduction it applies to"),
    (dict(strategy="torch_hybrid", tp=2, dp=1, reduce_dtype="bf16"),
     r"would change nothing: torch_hybrid's DDP reduces over dp, and this run has dp = 1"),
    (dict(strategy="hybrid", tp=2, dp=1, reduce_dtype="bf16"),
     r"would change nothing: hybrid reduces gradients over dp x cp"),
    (dict(strategy="tp", reduce_dtype="bf16"), r"reduce_dtype=bf16 would change nothing: tp reduces .* only "
                                               r"under sequence parallelism"),
    (dict(strategy="pp", microbatches=0), r"microbatches must be >= 1"),
    (dict(strategy="tp", zero=1), r"zero=1 is a hybrid option"),
    (dict(strategy="dp", sequence_parallel=True), r"sequence_parallel .* dp has no tp axis"),
    (dict(strategy="pp", pp=3), r"pp=3 but world size 2"),
    (dict(strategy="hybrid", tp=3), r"hybrid needs dp x tp x pp = world size"),
    (dict(strategy="ddp", steps="3"), r"steps must be a whole number, got '3'"),
    (dict(strategy="ddp", lr=float("nan")), r"learning rate must be a finite number"),
    (dict(strategy="ddp", timeout_s=float("inf")), r"timeout must be a finite number"),
    (dict(strategy="ddp", timeout_s=1e-6), r"timeout must be >= 1 s"),
    (dict(strategy="ddp", seed=2**64), r"seed must be <= 9,223,372,036,854,775,807"),
    (dict(strategy="ddp", threads_per_rank=-4), r"\(--threads; threads_per_rank from Python\) must be >= 0"),
    (dict(strategy="ddp", fault={"rank": "a", "step": 1}), r"fault rank must be a whole number"),
    (dict(strategy="ddp", fault={"rank": 1, "step": "x"}), r"fault step must be a whole number"),
    (dict(strategy="ddp", fault={"rank": 1, "step": 1, "kind": "explode"}), r"fault kind must be one of"),
    (dict(strategy="ddp", ep=2, model="tiny-moe"),
     r"ddp has no expert parallel: use strategy 'ep' or 'hybrid'"),
    (dict(strategy="ep"),
     r"strategy ep \(ep = its 2 data-parallel ranks\) shards experts, but model 'tiny' is dense"),
    (dict(strategy="hybrid", ep=2), r"ep=2 shards experts, but model 'tiny' is dense"),
    (dict(strategy="hybrid", tp=2, model="tiny-moe"),
     r"not supported: a mixture-of-experts model .* with tp=2"),
    (dict(strategy="hybrid", ep=2, zero=1, model="tiny-moe"), r"not supported: zero=1 with ep=2"),
    # had been AttributeErrors from inside validate()
    (dict(strategy="ddp", model=None),
     r"model must be a preset's name, a ModelConfig or a dict of its fields, got None"),
    (dict(strategy="ddp", model=5), r"model must be a preset's name, .* got 5"),
    # a flag's name for its field's, a model's field as a run's: named, with what was meant
    (dict(strategy="ddp", fail={"rank": 1, "step": 1}),
     r"unknown run option\(s\): \['fail'\] \(fail: did you mean fault\?\)"),
    (dict(strategy="ddp", hidden=64),
     r"\(hidden is a model field: model=\{'hidden': ...\} or a ModelConfig\)"),
])
def test_shapes_that_cannot_run_are_refused_before_any_process(monkeypatch, options, message):
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    with pytest.raises(ConfigError, match=message):
        paralab.run(world_size=2, **options)


@pytest.mark.parametrize("given", [None, {"strategy": "ddp"}, "ddp"])
def test_resolve_layout_of_what_is_no_run_config_names_what_it_takes(given):
    """None had been "'NoneType' object has no attribute 'validate'"."""
    with pytest.raises(ConfigError, match=r"resolve_layout takes a RunConfig \(RunConfig.build"):
        resolve_layout(given)


@pytest.mark.parametrize("name, world, options", [
    ("dp", 2, {}), ("ddp", 2, {}), ("zero1", 2, {}), ("zero2", 2, {}), ("zero3", 2, {}), ("cp", 2, {}),
    ("ep", 2, dict(model="tiny-moe")), ("torch_ddp", 2, {}), ("torch_fsdp", 2, {}),
    ("tp", 2, dict(sequence_parallel=True)), ("hybrid", 4, dict(tp=2)),
    ("hybrid", 2, dict(tp=2, sequence_parallel=True)), ("torch_hybrid", 4, dict(tp=2)),
])
def test_reduce_dtype_is_taken_wherever_gradients_are_reduced(name, world, options):
    options = {"model": "tiny", **options}
    model = options.pop("model")
    cfg = RunConfig.build(model, strategy=name, world_size=world, reduce_dtype="bf16", **options)
    assert resolve_layout(cfg).unused_options == ()


@pytest.mark.parametrize("name, options", [
    ("dp", {}), ("ddp", {}), ("zero1", {}), ("zero2", {}), ("zero3", {}), ("cp", {}),
    ("ep", dict(model="tiny-moe")), ("torch_ddp", {}), ("torch_fsdp", {}),
])
def test_reduce_dtype_is_refused_where_one_replica_reduces_nothing(monkeypatch, name, options):
    """On one rank a replica strategy averages nothing: its reduce_dtype had been accepted and the summary
    had said "gradients reduced in bf16", where ddp changed nothing and the others only rounded an fp32
    model's gradients to bf16 and back."""
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    with pytest.raises(ConfigError, match=rf"reduce_dtype=bf16 has no reduction to apply to: {name} averages "
                                          r"each gradient over its dp x cp ranks, .* \(dp 1 x cp 1\)"):
        paralab.run(name, 1, reduce_dtype="bf16", **{"model": "tiny", **options})


def test_a_run_config_of_a_model_name_says_build_takes_names():
    with pytest.raises(ConfigError, match=r"model must be a ModelConfig, got 'tiny': RunConfig.build"):
        resolve_layout(RunConfig(model="tiny"))


@pytest.mark.parametrize("trace_path, message", [
    ("{tmp}", r"trace_path .* is a directory; give a file name"),
    (5, r"trace_path must be a file's path, got 5"),
])
def test_a_trace_path_that_cannot_be_written_is_refused_before_any_process(monkeypatch, tmp_path, trace_path,
                                                                          message):
    """Each had been refused only once the run had trained, losing its result."""
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    trace_path = str(tmp_path) if trace_path == "{tmp}" else trace_path
    with pytest.raises(ConfigError, match=message):
        paralab.run("single", 1, 1, trace_path=trace_path)


def test_the_unused_tuning_knob_is_reported_not_echoed(monkeypatch):
    layout = resolve_layout(RunConfig.build("tiny", strategy="zero1", world_size=2, bucket_mb=1.0))
    assert layout.unused_options == ("bucket_mb",)
    assert resolve_layout(RunConfig.build("tiny", strategy="ddp", world_size=2,
                                          bucket_mb=1.0)).unused_options == ()


@pytest.mark.parametrize("name, world, options", [
    ("ddp", 1, {}), ("hybrid", 2, dict(tp=2)), ("hybrid", 2, dict(dp=2, zero=1)),
])
def test_a_bucket_cap_its_layout_keeps_no_buckets_for_is_reported_unused(name, world, options):
    """One replica keeps no buckets, hybrid's ZeRO-1 one unit: paralab.run had dropped the cap in silence
    (the summary's bucket_mb null, nothing unused), where the CLI refuses it."""
    cfg = RunConfig.build("tiny", strategy=name, world_size=world, bucket_mb=0.1, **options)
    layout = resolve_layout(cfg)
    assert layout.unused_options == ("bucket_mb",)
    default = resolve_layout(RunConfig.build("tiny", strategy=name, world_size=world, **options))
    assert default.unused_options == ()  # not given: nothing to report


@pytest.mark.parametrize("options, mode", [(dict(tp=2), (None, None)), (dict(dp=2), (None, None)),
                                           (dict(cp=2), ("ring", "zigzag"))])
def test_the_summary_claims_a_cp_mode_only_where_there_is_cp(options, mode):
    """A hybrid tp x dp run had reported cp_mode "ring" and cp_split "zigzag" at cp 1."""
    from paralab.runtime.result import RunResult
    from paralab.trace import STEP, Span, Trace

    cfg = RunConfig.build("tiny", strategy="hybrid", world_size=2, steps=1, **options)
    trace = Trace(spans=[Span(r, STEP, STEP, 0.0, 1.0, step=0) for r in range(2)])
    summary = RunResult(cfg, resolve_layout(cfg), [1.0], trace, []).summary
    assert (summary["cp_mode"], summary["cp_split"]) == mode


def test_resolving_writes_nothing_back_into_the_config():
    cfg = RunConfig.build("tiny", strategy="hybrid", world_size=8, tp=2, pp=2)
    before = cfg.to_dict()
    resolve_layout(cfg)
    assert cfg.to_dict() == before


# ------------------------------------------------------------------------------------- the mesh
def test_mesh_coordinates_groups_and_json_round_trip():
    layout = mesh_layout(dp=2, tp=2, pp=2)
    assert layout.rank_of(pp=1, dp=0, tp=1) == 5 and layout.coord(5) == {"pp": 1, "dp": 0, "cp": 0, "tp": 1}
    assert layout.group_of("dp", 5) == [5, 7]
    data = json.loads(json.dumps(layout.to_dict()))
    assert Layout.from_dict(data) == layout
    assert data["mesh"]["dims"] == list(AXES) and data["mesh"]["coords"]["5"] == [1, 0, 0, 1]


def test_paralab_strategies_lists_every_strategy(capsys):
    assert cli.main(["strategies", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed.keys() == strategies().keys()
    assert listed["hybrid"]["axes"] == ["dp", "cp", "tp", "pp"]
    assert listed["torch_tp"]["reference_for"] == "tp"


def test_a_world_the_machine_cannot_hold_is_refused_unless_forced(monkeypatch):
    from paralab.runtime import worker

    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    monkeypatch.setattr(worker, "usable_cores", lambda: 2)
    with pytest.raises(ConfigError, match=r"64 ranks do not fit this machine: 2 cores.*world size <= 16"):
        paralab.run("ddp", 64, global_batch=64)
    worker.check_capacity(64, oversubscribe=True)  # forced: no refusal


def test_a_diverging_loss_stops_the_run_naming_the_step(no_leftover_ranks):
    with pytest.raises(paralab.RunError, match=r"loss became (nan|inf) at step \d"):
        paralab.run("ddp", 2, steps=6, global_batch=4, lr=1e6, optimizer="sgd")


def test_the_run_json_is_valid_even_for_non_finite_numbers():
    from paralab.cli_args import json_text

    assert json.loads(json_text({"losses": [float("nan"), 1.0], "x": {"y": float("inf")}})) == \
        {"losses": [None, 1.0], "x": {"y": None}}



def test_expert_groups_are_carved_from_each_dp_group():
    """ep consecutive dp ranks hold every expert once; the ranks at the same place of each expert group
    (every ep-th dp rank) hold the same experts and reduce them; pipelines and tp do not mix in."""
    layout = mesh_layout(dp=4, tp=2, pp=2, ep=2)
    assert layout.group_of("dp", 0) == [0, 2, 4, 6]
    assert [g for g in layout.expert_groups() if 0 in g] == [[0, 2]]
    assert [g for g in layout.expert_data_groups() if 0 in g] == [[0, 4]]
    for groups in (layout.expert_groups(), layout.expert_data_groups()):
        assert sorted(r for g in groups for r in g) == list(range(16))  # every rank in exactly one group
        assert all(len({layout.coord(r)["pp"] for r in g}) == 1 for g in groups)
        assert all(len({layout.coord(r)["tp"] for r in g}) == 1 for g in groups)
    assert Layout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    assert "expert groups (ep=2" in layout.text()
    with pytest.raises(ValueError, match="ep must divide dp"):
        mesh_layout(dp=3, ep=2)


@pytest.mark.parametrize("files, cores", [
    ({"cpu.max": "100000 100000"}, 1),  # a Binder pod: 1 CPU of a 16-core node
    ({"cpu.max": "150000 100000"}, 2),  # one and a half: the ranks may use two cores part of the time
    ({"cpu.max": "max 100000"}, 16),
    ({"cfs_quota_us": "200000", "cfs_period_us": "100000"}, 2),  # v1
    ({"cfs_quota_us": "-1", "cfs_period_us": "100000"}, 16),
    ({}, 16),  # none readable
])
def test_usable_cores_are_a_cgroups_cpu_quota_where_it_limits_the_process(monkeypatch, tmp_path, files,
                                                                           cores):
    """A pod's CPU limit is a quota, not an affinity: it had counted the node's 16 cores, so 16 ranks,
    each with threads of its own, time-shared one core."""
    from paralab.runtime import worker

    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n")
    monkeypatch.setattr(worker, "CGROUP_CPU", (str(tmp_path / "cpu.max"), (str(tmp_path / "cfs_quota_us"),
                                                                         str(tmp_path / "cfs_period_us"))))
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert worker.usable_cores() == cores


@pytest.mark.parametrize("files, headroom", [
    ({"memory.max": "2147483648", "memory.current": "536870912"}, 1.5 * 2**30),  # cgroup v2: 2 GB pod
    ({"memory.max": "max", "memory.current": "536870912"}, None),  # no limit: the node's MemAvailable
    ({"limit_in_bytes": "9223372036854771712", "usage_in_bytes": "1000"}, None),  # v1, unlimited
    ({"limit_in_bytes": "1073741824", "usage_in_bytes": "2147483648"}, 1),  # v1, over its limit
])
def test_free_memory_is_a_cgroups_headroom_where_it_limits_the_process(monkeypatch, tmp_path, files,
                                                                       headroom):
    """A Binder pod's /proc/meminfo shows the node's memory; its 2 GB limit is what the kernel kills at."""
    from paralab.runtime import worker

    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n")
    pairs = (("memory.max", "memory.current"), ("limit_in_bytes", "usage_in_bytes"))
    paths = tuple(tuple(str(tmp_path / name) for name in pair) for pair in pairs)
    monkeypatch.setattr(worker, "CGROUP_MEMORY", paths)
    monkeypatch.setattr(worker, "_meminfo_available", lambda: 64 * 2**30)
    assert worker.available_memory_bytes() == (headroom or 64 * 2**30)
