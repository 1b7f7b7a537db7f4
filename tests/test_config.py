"""RunConfig and ElasticConfig refuse, field by field, what paralab.run would have misread: a yes/no
that is not a bool, a path that is not one, a loss scale that changes nothing."""

import dataclasses
import pathlib
import typing

import pytest

import paralab
from paralab.config import (
    LEFT_TO_THE_STRATEGY,
    ConfigError,
    ModelConfig,
    PathOption,
    RunConfig,
    settings_differ,
)
from paralab.elastic.config import ElasticConfig
from paralab.runtime import launch as launch_module
from paralab.strategies.registry import OPTION_DEFAULTS


def fields_of_kind(cls, kind) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if hints[f.name] == kind]


def test_the_configs_have_yes_no_and_path_fields():
    """What the checks below read: the fields' annotations (a field declared later is checked too)."""
    assert {"trace", "oversubscribe", "hierarchical", "sequence_parallel", "zero_prefetch",
            "collect_state"} <= set(fields_of_kind(RunConfig, bool))
    assert fields_of_kind(RunConfig, PathOption) == ["profile_dir"]
    assert fields_of_kind(ElasticConfig, PathOption) == ["checkpoint_dir"]
    assert fields_of_kind(ModelConfig, bool) == ["shared_expert"]


@pytest.mark.parametrize("cls, name", [
    *[(RunConfig, name) for name in fields_of_kind(RunConfig, bool)],
    *[(ElasticConfig, name) for name in fields_of_kind(ElasticConfig, bool)],
])
def test_a_yes_no_field_that_is_not_a_bool_is_refused(cls, name):
    """sequence_parallel="no" had passed, and turned sequence parallelism on (a truthy string)."""
    cfg = cls(**{name: "no"})
    with pytest.raises(ConfigError, match=f"^{name} must be True or False, got 'no'( \\(|$)"):
        cfg.validate()


def test_a_model_yes_no_field_that_is_not_a_bool_is_refused():
    with pytest.raises(ConfigError, match="^shared_expert must be True or False, got 1$"):
        RunConfig(model=ModelConfig(shared_expert=1)).validate()


def test_a_trace_path_given_as_trace_is_pointed_to_trace_path(monkeypatch):
    """paralab.run(trace="run2.json") had run and written nothing: ``trace`` says whether spans are
    recorded; the file is trace_path. Refused before any process starts."""
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    with pytest.raises(ConfigError, match=r"^trace must be True or False, got 'run2.json' \(a file to write "
                                          r"it to is trace_path\)$"):
        paralab.run("ddp", 2, trace="run2.json")


@pytest.mark.parametrize("cls, name", [(RunConfig, "profile_dir"), (ElasticConfig, "checkpoint_dir")])
def test_a_path_field_takes_a_str_or_a_path_and_nothing_else(cls, name):
    """profile_dir=5 had been accepted; a pathlib.Path is kept as its str, as the config travels as JSON."""
    with pytest.raises(ConfigError, match=f"^{name} must be a path \\(str or os.PathLike\\) or None, got 5$"):
        cls(**{name: 5}).validate()
    assert getattr(cls(**{name: pathlib.Path("/tmp/x")}), name) == "/tmp/x"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_loss_scale_at_a_dtype_whose_loss_is_not_scaled_is_refused(monkeypatch, dtype):
    """paralab.run(loss_scale=2.0) in fp32 had run with unused_options [], where the CLI refused
    --loss-scale: one check, in the config, for both."""
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    with pytest.raises(ConfigError, match=f"^loss_scale has no effect at dtype {dtype}, whose loss is not "
                                          "scaled: it is where fp16's dynamic loss scale starts; give "
                                          "dtype=fp16 or leave it out$"):
        paralab.run("ddp", 1, dtype=dtype, loss_scale=2.0)


def test_fp16_starts_at_the_loss_scale_given_or_torchs_default():
    assert RunConfig(dtype="fp16", loss_scale=2.0).validate().initial_loss_scale == 2.0
    assert RunConfig(dtype="fp16").validate().initial_loss_scale == 2.0**16
    with pytest.raises(ConfigError, match="loss scale must be > 0"):
        RunConfig(dtype="fp16", loss_scale=-1.0).validate()


def test_a_fault_without_a_step_says_the_step_is_missing():
    """Had said "fault step must be a whole number, got None"."""
    with pytest.raises(ConfigError, match=r"^fault needs a rank and a step, like \{'rank': 1, 'step': 3\}: "
                                          "'step' is missing$"):
        RunConfig(world_size=2, fault={"rank": 1}).validate()


def test_a_difference_says_a_degree_not_asked_for_as_such():
    """A pipeline run's pp 2 beside one that left pp to the strategy had read "pp 2 against rank0.json's
    0", a degree no layout has; a setting whose 0 is a value of its own (ZeRO's stage) is said as is."""
    left, asked = RunConfig(strategy="hybrid").to_dict(), RunConfig(strategy="hybrid", pp=2, zero=1).to_dict()
    assert settings_differ(left, asked, "rank0.json's") == (
        "pp 2 against rank0.json's 0 (not asked for: left to the strategy), zero 1 against rank0.json's 0")


def test_the_settings_left_to_the_strategy_are_the_options_whose_default_is_a_placeholder():
    """LEFT_TO_THE_STRATEGY, beside the registry's "not asked for" values: each is RunConfig's default,
    0 or "", and no other option's is (but ZeRO's stage 0, a value of its own, and flags' False)."""
    defaults = RunConfig().to_dict()
    placeholders = {key for key, value in OPTION_DEFAULTS.items()
                    if value in (0, "") and not isinstance(value, bool) and key != "zero"}
    assert LEFT_TO_THE_STRATEGY == placeholders
    assert all(defaults[key] == OPTION_DEFAULTS[key] for key in LEFT_TO_THE_STRATEGY)


def test_a_presets_fields_from_python_are_named_by_the_preset_as_the_shell_names_them():
    """``paralab run --model tiny --attention math`` is model "tiny"; the same model handed over from
    Python, as a ModelConfig or a dict, had been named "custom". A shape of its own still is."""
    from paralab.config import MODEL_PRESETS

    tiny = MODEL_PRESETS["tiny"]
    for model in (tiny, dataclasses.asdict(tiny), dataclasses.replace(tiny, attention="math")):
        assert RunConfig.build(model).model_name == "tiny"
    assert RunConfig.build(dataclasses.replace(tiny, layers=tiny.layers + 1)).model_name == "custom"
    assert RunConfig.build(MODEL_PRESETS["tiny-moe"]).model_name == "tiny-moe"
