"""The shell face: `paralab run --json` keys, exit codes, and torchrun with per-rank traces."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from paralab import cli
from paralab.cli_args import said_as_flags
from paralab.config import RunConfig
from paralab.runtime import launch as launch_module

CONTRACT_KEYS = {
    "strategy", "world_size", "dp", "tp", "pp", "schedule", "microbatches", "steps", "losses", "step_time_s",
    "tokens_per_s", "comm_bytes", "comm_payload_bytes", "bubble_fraction", "peak_memory_bytes", "trace",
}


def test_run_json_has_the_contract_keys(tmp_path, capsys, no_leftover_ranks):
    trace_path = tmp_path / "t.json"
    code = cli.main(["run", "--strategy", "ddp", "--world-size", "2", "--steps", "3", "--json",
                     "--trace", str(trace_path), "--bucket-mb", "0.1"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert CONTRACT_KEYS <= set(summary)
    assert len(summary["losses"]) == 3 and summary["world_size"] == 2 and summary["dp"] == 2
    assert len(summary["peak_memory_bytes"]) == 2 and summary["comm_bytes"]["all_reduce"] > 0
    assert summary["trace"] == str(trace_path) and summary["report"] is None
    assert summary["bucket_mb"] == 0.1 and summary["zero_prefetch"] is False
    chrome = json.loads(trace_path.read_text())
    assert any(e.get("cat") == "all_reduce" for e in chrome["traceEvents"])


def test_the_text_summary_says_what_ran_and_where_its_files_went(tmp_path, capsys, no_leftover_ranks):
    """The levers that change the figures (dtype, prefetch, recompute) and the report's path, as the
    JSON's keys say them."""
    report = tmp_path / "run.html"
    assert cli.main(["run", "--strategy", "zero3", "--world-size", "2", "--steps", "2", "--dtype", "bf16",
                     "--zero-prefetch", "--recompute", "full", "--report", str(report)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "zero3 on 2 ranks (cpu), model tiny in bf16, 2 steps"
    assert lines[1].endswith(", ZeRO-3, prefetching the next part, recompute full"), lines[1]
    assert lines[-1] == f"report: {report} (open in a browser)" and report.is_file()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--world-size", "0"], "world size"),
        (["--world-size", "3", "--global-batch", "8"], "not divisible"),
        (["--strategy", "nope"], "unknown strategy"),
        (["--model", "huge"], "unknown model preset"),
        # past any run: had started the ranks, to fail inside them or to run on for ever
        (["--threads", str(10**20)], "(--threads; threads_per_rank from Python) must be <= 4,096"),
        (["--steps", str(10**23)], "steps must be <= 1,000,000,000"),
        (["--timeout", "1e300"], "timeout must be <= 1e+07 s"),
        # each step draws its samples from the corpus once: the ranks had started, then refused
        (["--global-batch", "65538"], "global batch 65,538 is larger than the corpus (65,536 samples)"),
    ],
)
def test_invalid_arguments_exit_2_before_any_process(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    assert cli.main(["run", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, make, message",
    [
        ("--trace", lambda tmp: tmp, "--trace {} is a directory"),
        ("--report", lambda tmp: tmp, "--report {} is a directory"),
        ("--trace-dir", lambda tmp: tmp / "file.txt", "--trace-dir {} exists and is not a directory"),
        ("--trace", lambda tmp: tmp / "file.txt" / "t.json", "is not a directory"),
        ("--profile", lambda tmp: tmp / "file.txt", "--profile {} exists and is not a directory"),
        # root passes the permission bits there, and the run had trained before failing to write
        ("--report", lambda tmp: "/proc/report.html",
         "--report /proc/report.html: cannot write in /proc (it takes no new files)"),
        ("--trace-dir", lambda tmp: "/proc/traces", "--trace-dir /proc/traces: cannot write in /proc"),
    ],
)
def test_unwritable_output_paths_exit_2_before_any_process(monkeypatch, capsys, tmp_path, option, make,
                                                           message):
    (tmp_path / "file.txt").write_text("in the way")
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    path = make(tmp_path)
    assert cli.main(["run", option, str(path)]) == 2
    assert message.format(path) in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["elastic", "--nnodes", "1:2", "--trace", "{tmp}"], "--trace {tmp} is a directory"),
        (["nodes", "--trace-dir", "{tmp}/file.txt", "--", "--strategy", "ddp"],
         "--trace-dir {tmp}/file.txt exists and is not a directory"),
        (["nodes", "--", "--strategy", "ddp", "--report", "{tmp}"], "--report {tmp} is a directory"),
        # all the agents' ranks on this machine, checked as one launch of them (they had started)
        (["nodes", "--nnodes", "2", "--nproc-per-node", "512", "--", "--global-batch", "1024"],
         "1024 ranks do not fit this machine"),
        (["import", "{tmp}/rank0.json", "-o", "{tmp}"], "output {tmp} is a directory"),
        # had been named as the world size it made (-1 x 2)
        (["nodes", "--nnodes", "-1", "--", "--strategy", "ddp"], "--nnodes must be >= 1, got -1"),
        # an earlier, larger run's rank: read back with this run's once it had trained (a traceback)
        (["nodes", "--trace-dir", "{tmp}/old", "--", "--strategy", "ddp"],
         "--trace-dir {tmp}/old holds rank00004.json, which this run of 4 ranks would not overwrite"),
    ],
    ids=["elastic", "nodes", "nodes' run", "nodes' ranks", "import", "nodes' count", "nodes' old ranks"],
)
def test_the_other_commands_check_outputs_and_ranks_before_they_start(monkeypatch, capsys, tmp_path, argv,
                                                                      message):
    """Before a launch (or reading a profile): a path that cannot take the output, or more ranks than
    the machine holds, exits 2 then, not at the end."""
    from paralab.elastic import launch as elastic_launch
    from paralab.runtime import multinode, worker

    monkeypatch.setattr(worker, "usable_cores", lambda: 2)  # 1024 ranks fit no machine of 2 cores

    (tmp_path / "file.txt").write_text("in the way")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "rank00004.json").write_text("{}")
    for module, name in ((elastic_launch, "launch"), (multinode, "run_local_nodes")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("a process was about to start"))
    assert cli.main([arg.format(tmp=tmp_path) for arg in argv]) == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


@pytest.fixture
def nothing_starts(monkeypatch):
    """Any launch, local, elastic or of local nodes, fails the test: a refusal comes before them all."""
    from paralab.elastic import launch as elastic_launch
    from paralab.runtime import multinode

    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    for module, name in ((elastic_launch, "launch"), (multinode, "run_local_nodes")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("a process was about to start"))


@pytest.mark.parametrize("argv, message", [
    # strategies that reduce no gradients in buckets (the run had gone ahead, bucket_mb "unused")
    (["run", "--strategy", "tp", "--world-size", "2", "--bucket-mb", "5"],
     "--bucket-mb has no effect with strategy tp, which reduces no gradients in buckets; it applies to ddp, "
     "zero2, cp, ep, hybrid"),
    (["run", "--strategy", "zero1", "--world-size", "2", "--bucket-mb", "25"], "--bucket-mb has no effect"),
    # hybrid's ZeRO-1 keeps the whole model as one unit (the cap had been taken and reported, unused)
    (["run", "--strategy", "hybrid", "--world-size", "2", "--dp", "2", "--zero", "1", "--bucket-mb", "0.01"],
     "--bucket-mb has no effect: hybrid with --zero 1 reduce-scatters the whole model's gradients as one"),
    # a V's two chunks per rank: other virtual stages are refused, not replaced by 2 in silence
    (["run", "--strategy", "pp", "--world-size", "2", "--schedule", "zbv", "--virtual-stages", "3",
      "--microbatches", "4"], "zbv always runs 2 chunks per rank; --virtual-stages must be 2 (or 1), got 3"),
    (["nodes", "--", "--strategy", "dp", "--bucket-mb", "5"], "--bucket-mb has no effect with strategy dp"),
    # one replica averages nothing: paralab's ddp and hybrid keep no buckets for it
    (["run", "--strategy", "ddp", "--world-size", "1", "--bucket-mb", "5"],
     "--bucket-mb has no effect: ddp on 1 rank with dp 1 x cp 1 has one replica"),
    (["run", "--strategy", "hybrid", "--world-size", "2", "--tp", "2", "--bucket-mb", "5"],
     "--bucket-mb has no effect: hybrid on 2 ranks with dp 1 x cp 1 has one replica"),
    (["nodes", "--nnodes", "1", "--nproc-per-node", "1", "--", "--strategy", "ddp", "--bucket-mb", "5"],
     "--bucket-mb has no effect: ddp on 1 rank"),
    # only fp16 scales its loss
    (["run", "--loss-scale", "1024"], "--loss-scale has no effect at dtype fp32, whose loss is not scaled"),
    (["run", "--dtype", "bf16", "--loss-scale", "1024"], "--loss-scale has no effect at dtype bf16"),
    (["elastic", "--nnodes", "1:2", "--loss-scale", "1024"], "--loss-scale has no effect at dtype fp32"),
    # a dense model routes no tokens
    (["run", "--top-k", "2"], "--top-k has no effect: model tiny is dense, with no experts to route tokens "
                              "to; it applies to a mixture of experts: model tiny-moe, small-moe"),
    (["run", "--model", "tiny-moe", "--experts", "0", "--capacity-factor", "1.25"],
     "--capacity-factor has no effect: model tiny-moe with --experts 0 is dense"),
    # levers on one rank, which change nothing (each had run); a hierarchical all-reduce of one rank a
    # node stays allowed: notebook 06's exercise runs it to show it is the flat ring
    (["run", "--strategy", "tp", "--world-size", "1", "--sequence-parallel"], "it needs tp > 1"),
    (["run", "--strategy", "zero3", "--world-size", "1", "--zero-prefetch"], "one rank has no others"),
    (["run", "--strategy", "ddp", "--world-size", "1", "--reduce-dtype", "bf16"],
     "--reduce-dtype bf16 has no reduction to apply to: ddp averages each gradient over its dp x cp ranks"),
    (["run", "--strategy", "hybrid", "--world-size", "2", "--tp", "2", "--zero", "1"],
     "--zero 1 shards over the dp x cp ranks, and this layout has one (dp 1 x cp 1)"),
], ids=["tp bucket", "zero1 bucket at its default", "hybrid zero1 bucket", "zbv virtual stages",
        "nodes' dp bucket", "ddp of one replica",
        "hybrid of one replica", "nodes of one replica", "fp32 loss scale", "bf16 loss scale",
        "elastic loss scale", "dense top-k", "dense capacity",
        "sequence parallel on one rank", "prefetch on one rank", "reduce dtype of one replica",
        "hybrid zero of one replica"])
def test_a_flag_given_that_would_change_nothing_exits_2_before_any_process(nothing_starts, capsys, argv,
                                                                           message):
    """A flag the run would ignore had been accepted: whoever passed it believed it changed something.
    It is refused in one line that names it and says where it applies, even at its default's value."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, field, value", [
    (["--strategy", "ddp", "--world-size", "2", "--bucket-mb", "5"], "bucket_mb", 5.0),
    (["--strategy", "zero2", "--world-size", "2", "--bucket-mb", "5"], "bucket_mb", 5.0),
    (["--strategy", "hybrid", "--world-size", "4", "--tp", "2", "--bucket-mb", "5"], "bucket_mb", 5.0),
    # ZeRO-2 cuts its units by the cap on one replica too
    (["--strategy", "zero2", "--world-size", "1", "--bucket-mb", "5"], "bucket_mb", 5.0),
    (["--dtype", "fp16", "--loss-scale", "1024"], "loss_scale", 1024.0),
    # left out, the defaults apply whatever the strategy and dtype: they never count as given
    (["--strategy", "tp", "--world-size", "2"], "bucket_mb", 25.0),
    (["--dtype", "bf16"], "loss_scale", None),  # fp16 would start at config.FP16_LOSS_SCALE
])
def test_those_flags_still_apply_where_they_have_an_effect(argv, field, value):
    args = cli.build_parser().parse_args(["run", *argv])
    cfg = cli.config_from_args(args).validate()  # the config's own checks (a loss scale's) pass too
    cli.refuse_a_bucket_cap_of_one_replica(args, cfg)  # what run asks too, once the world is known
    assert getattr(cfg, field) == value


@pytest.mark.parametrize("command, typed, kernel", [
    ("run", "sdpa", "sdpa"), ("run", "fused", "sdpa"), ("run", "standard", "math"),
    ("elastic", "fused", "sdpa"),
    ("simulate", "fused", "fused"), ("simulate", "sdpa", "fused"), ("plan", "math", "standard"),
])
def test_an_attention_kernel_is_taken_by_either_name_in_every_command(command, typed, kernel):
    """run names the kernels as torch does (sdpa, math), the simulator as the literature does (fused,
    standard): a flag copied from one command to the other means the same kernel there."""
    required = ["--gpus", "8"] if command == "plan" else []
    assert cli.build_parser().parse_args([command, *required, "--attention", typed]).attention == kernel


def test_the_attention_table_names_every_kernel_of_both_vocabularies_once():
    from paralab.config import ATTENTION_AS_SIMULATED, ATTENTION_KERNELS
    from paralab.sim.specs import ATTENTION

    assert sorted(ATTENTION_AS_SIMULATED) == sorted(ATTENTION_KERNELS)
    assert sorted(ATTENTION_AS_SIMULATED.values()) == sorted(ATTENTION)


@pytest.mark.parametrize("command", ["run", "simulate"])
def test_an_attention_kernel_of_neither_name_is_refused_with_the_commands_own(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args([command, "--attention", "flash"])
    assert exit_.value.code == 2
    (refusal,) = [line for line in capsys.readouterr().err.splitlines() if "invalid choice: 'flash'" in line]
    own, other = (("sdpa", "math"), ("standard", "fused"))[:: 1 if command == "run" else -1]
    said = refusal.split("choose from", 1)[1]  # the choices the refusal offers, past the usage line
    assert all(name in said for name in own) and not any(name in said for name in other), refusal


@pytest.mark.parametrize("strategy, world, options, applies", [
    ("ddp", 2, {}, True), ("ddp", 1, {}, False), ("zero2", 1, {}, True), ("torch_ddp", 1, {}, True),
    ("hybrid", 4, dict(tp=2, pp=2), False), ("hybrid", 4, dict(tp=2), True), ("tp", 2, {}, False),
])
def test_a_run_summary_says_the_bucket_cap_where_it_applies(strategy, world, options, applies):
    """The cap --bucket-mb would be refused for is the one a summary leaves out (bucket_mb: null)."""
    from paralab.layout import resolve_layout
    from paralab.strategies.registry import bucket_cap_applies

    cfg = RunConfig(strategy=strategy, world_size=world, **options)
    assert bucket_cap_applies(cfg.strategy, resolve_layout(cfg)) is applies


# a shell's view of the CLI's warnings (pytest records warnings instead of printing them): a run that
# warns of more ranks than cores (one usable core) and stops before any rank, and a warning from elsewhere
_SHELL = """
import sys, warnings
from paralab import cli
from paralab.runtime import launch
from paralab.runtime.result import RunError
def stop(*args):
    raise RunError(None, "stopped before any rank started", "")
launch.usable_cores, launch._launch_ranks = (lambda: 1), stop
warnings.warn_explicit("torch says so", UserWarning, "/elsewhere/torch_module.py", 7)
sys.exit(cli.main(["run", "--strategy", "ddp", "--world-size", "2", "--steps", "1"]))
"""


def test_more_ranks_than_cores_is_a_one_line_warning_and_others_keep_their_format():
    """warnings' default format had printed the file, the line and the source line under it; a
    warning from elsewhere (torch's) keeps that format."""
    out = subprocess.run([sys.executable, "-c", _SHELL], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.splitlines()
    assert "/elsewhere/torch_module.py:7: UserWarning: torch says so" in lines[0]
    assert lines[-2:] == [
        "paralab: warning: world size 2 exceeds the 1 usable CPU cores: ranks will time-share cores, so "
        "step times show contention, not scaling",
        "paralab: run failed: stopped before any rank started"]


def test_whatever_records_warnings_still_records_paralabs(monkeypatch):
    """Only the format changes: a catch_warnings(record=True) (pytest.warns, pytest's own capture)
    still records paralab's warnings, which a replaced showwarning had printed instead."""
    import warnings

    from paralab.runtime.result import RunError

    def stop(*args):
        raise RunError(None, "stopped before any rank started", "")

    monkeypatch.setattr(launch_module, "usable_cores", lambda: 1)
    monkeypatch.setattr(launch_module, "_launch_ranks", stop)
    with pytest.warns(RuntimeWarning, match="exceeds the 1 usable CPU cores"):
        assert cli.main(["run", "--strategy", "ddp", "--world-size", "2", "--steps", "1"]) == 1
    assert warnings.formatwarning.__name__ == "formatwarning"  # put back


@pytest.fixture
def paralab_profiles(tmp_path):
    """Two ranks' profiles that carry a paralab pipeline run's meta, as `paralab run --profile` writes
    it (the torch fixture's events, which the check does not read)."""
    import gzip

    fixture = os.path.join(os.path.dirname(__file__), "data", "kineto_gpu")

    def write(run: dict):
        out = tmp_path / f"profiles-{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        for name, opener in (("rank0.json", open), ("rank1.json.gz", gzip.open)):
            with opener(os.path.join(fixture, name), "rt") as f:
                data = json.load(f)
            with opener(out / name, "wt") as f:
                json.dump({**data, "paralab": run}, f)
        return out

    return write


@pytest.mark.parametrize("run, facts, message", [
    ({"schedule": "1f1b", "pp": 2, "microbatches": 4}, ["--schedule", "zbv"],
     "--schedule zbv contradicts these profiles: they are of a paralab run whose schedule was 1f1b"),
    ({"schedule": "", "pp": 1, "microbatches": 1}, ["--schedule", "1f1b"], "whose schedule was none"),
    ({"schedule": "1f1b", "pp": 2, "microbatches": 4}, ["--microbatches", "8"],
     "--microbatches 8 contradicts"),
], ids=["another schedule", "a schedule without a pipeline", "other microbatches"])
def test_import_refuses_a_fact_that_a_paralab_profile_contradicts(paralab_profiles, capsys, tmp_path, run,
                                                                   facts, message):
    """A profile of a paralab run carries its schedule, pp and microbatches; a fact given over them had
    replaced them in the imported trace without a word."""
    out = tmp_path / "trace.json"
    assert cli.main(["import", str(paralab_profiles(run)), "-o", str(out), *facts]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not out.exists(), err


def test_import_takes_a_fact_that_agrees_with_the_profile_or_that_it_lacks(paralab_profiles, tmp_path):
    from paralab.trace import Trace

    profiles, out = paralab_profiles({"schedule": "1f1b", "pp": 2, "microbatches": 4}), tmp_path / "t.json"
    assert cli.main(["import", str(profiles), "-o", str(out), "--schedule", "1f1b", "--pp", "2",
                     "--tokens-per-step", "4096"]) == 0
    meta = Trace.load(out).meta
    facts = (meta["schedule"], meta["pp"], meta["microbatches"], meta["tokens_per_step"])
    assert facts == ("1f1b", 2, 4, 4096)


def test_a_failed_run_exits_1_naming_the_rank(capsys, no_leftover_ranks):
    assert cli.main(["run", "--strategy", "dp", "--world-size", "2", "--steps", "3",
                     "--fail", "rank=1,step=1"]) == 1
    assert "rank 1 failed" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["run", "--steps", "many"], "argument --steps: invalid int value: 'many'"),
    (["simulate", "--model", "gpt3-125m", "--zero", "4"], "argument --zero: invalid choice: 4"),
    (["simulate", "--stage-layers", "a,b"], "expected whole numbers separated by commas"),  # was <lambda>
    (["elastic", "--nnodes", "a:b"], "--nnodes takes N or MIN:MAX"),
    # an unknown flag is said by its command, which names its own --help (it had said `paralab --help`)
    (["run", "--bogus"], "paralab run: unrecognized arguments: --bogus"),
    # two names of one option, two values: the last had won without a word
    (["run", "--strategy", "pp", "--microbatches", "4", "--accumulate", "2"],
     "--microbatches 4 and --accumulate 2 are one option: give it once"),
])
def test_unparseable_arguments_exit_2_in_one_line(capsys, argv, message):
    """As every refusal: one line that names the argument (the usage block is behind --help)."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and err.count("\n") == 1, err
    assert f"(see paralab {argv[0]} --help)" in err


def test_one_option_under_its_two_names_with_one_value_or_one_name_twice_is_taken():
    """Only two names with two values contradict; one name given twice keeps argparse's rule (the last
    wins: a script's override of its own default)."""
    parse = cli.build_parser().parse_args
    assert parse(["run", "--microbatches", "4", "--accumulate", "4"]).microbatches == 4
    assert parse(["run", "--accumulate", "2", "--accumulate", "8"]).microbatches == 8
    # each parse stands alone: an earlier parse's --accumulate 8 had refused this one, one parser reused
    twice = [parse(["run", "--microbatches", "2", "--microbatches", str(k)]).microbatches for k in (3, 5)]
    assert twice == [3, 5]


def test_an_unknown_flag_before_the_command_is_said_by_paralab(capsys):
    """``paralab --bogus run`` had been said by ``paralab run``, whose --help does not list it either."""
    with pytest.raises(SystemExit) as info:
        cli.main(["--bogus", "run"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err == "paralab: unrecognized arguments: --bogus (see paralab --help)\n"


@pytest.mark.parametrize("argv", [
    ["run", "--strategy", "pp", "--world-size", "2", "--stage-layers", "-1,5"],
    ["simulate", "--model", "gpt3-125m", "--pp", "2", "--stage-layers", "-1,13"],
    ["nodes", "--nnodes", "2", "--", "--strategy", "pp", "--stage-layers", "-1,5"],
])
def test_a_list_starting_with_a_minus_is_the_flags_value(capsys, argv):
    """argparse alone reads -1,5 as a flag and says only "expected one argument"; the list's own check
    says what is wrong with it, before any process starts."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "invalid configuration: --stage-layers -1," in err and err.count("\n") == 1, err


@pytest.mark.parametrize("command", ["run", "nodes", "elastic", "bench", "simulate", "plan", "import"])
def test_help_says_every_flags_default(capsys, command):
    """Each flag says what it does, and its default where one applies (not None, False or "")."""
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert info.value.code == 0
    assert "(default: None)" not in text and "(default: False)" not in text and "(default: )" not in text
    for action in cli.build_parser()._subparsers._group_actions[0].choices[command]._actions:
        if action.option_strings:
            assert action.help, f"{command} {action.option_strings[0]} says nothing in --help"
    if command == "run":
        assert "a strategy name; `paralab strategies` lists them (default: ddp)" in text
        assert "--steps STEPS optimizer steps (default: " in text


@pytest.mark.parametrize("argv, says", [
    (["run", "--strategy", "ddp", "--zero-prefetch"], "--zero-prefetch gathers ZeRO-3's next part ahead"),
    (["run", "--strategy", "tp", "--world-size", "2", "--reduce-dtype", "bf16"],
     "--reduce-dtype bf16 would change nothing: tp reduces gradients only under sequence parallelism "
     "(--sequence-parallel)"),
    (["run", "--strategy", "torch_fsdp", "--world-size", "2", "--dtype", "fp16"], "use --dtype bf16"),
    (["nodes", "--nproc-per-node", "1", "--", "--strategy", "ddp", "--zero-prefetch"],
     "--zero-prefetch gathers"),
    (["simulate", "--model", "gpt3-175b", "--gpus", "64", "--pp", "8", "--virtual-stages", "5"],
     "--virtual-stages 5 needs interleaved"),
])
def test_a_refusal_names_the_flags_that_were_typed(capsys, argv, says):
    """A shell user reads the flags they typed, not the config's field names (paralab.run's own)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


@pytest.mark.parametrize("message, said", [
    ("with pp=1 there is no pipeline; stage_layers needs pp > 1",
     "with --pp 1 there is no pipeline; --stage-layers needs pp > 1"),
    ("cp_mode=alltoall needs heads that divide", "--cp-mode alltoall needs heads that divide"),
    ("the model has 4 layers (paralab.stage_split.balanced_split)",
     "the model has 4 layers (paralab.stage_split.balanced_split)"),
    ("use oversubscribe=True to start them", "use --oversubscribe to start them"),
    ("virtual_stages=2) cannot run", "--virtual-stages 2) cannot run"),
    # a user's path is theirs, whatever its directories are named
    ("--trace-dir /tmp/sweep/pp=2 is a file", "--trace-dir /tmp/sweep/pp=2 is a file"),
    ("use schedule='1f1b'.", "use --schedule 1f1b."),
    # a list as the flag takes it, not as Python prints it
    ("stage_layers [1, 1, 1] gives 3 stages", "--stage-layers 1,1,1 gives 3 stages"),
    ("stage_layers=[2, 2] fits", "--stage-layers 2,2 fits"),
])
def test_config_fields_are_said_as_the_run_commands_flags(message, said):
    (run_parser,) = cli.build_parser().parse_args(["run"]).said_in
    assert said_as_flags(message, run_parser) == said


def test_a_reader_that_goes_away_is_not_an_error(monkeypatch, capsys):
    """`paralab plan ... | head -1`: the pipe closes before the output is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", buffering=1) as closed_pipe:  # line-buffered, as on a terminal
        monkeypatch.setattr(sys, "stdout", closed_pipe)
        assert (cli.main(["plan", "--model", "gpt3-13b", "--gpus", "64", "--hardware", "a100"])
                == cli.EXIT_SIGPIPE)
    assert capsys.readouterr().err == ""


def test_a_broken_pipe_elsewhere_is_still_an_error(monkeypatch):
    def broken(args):
        raise BrokenPipeError("a worker's stdin closed")

    monkeypatch.setattr("paralab.sim.cli.plan_main", broken)
    with pytest.raises(BrokenPipeError):
        cli.main(["plan", "--model", "gpt3-13b", "--gpus", "64"])


def torchrun(*args: str) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 ARGS``, as a user starts it, in an environment
    without a torchrun's variables (this test process may hold some)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           "2", *args], capture_output=True, text=True, timeout=200, env=env)


@pytest.mark.timeout(240)
def test_torchrun_writes_per_rank_traces_that_merge(tmp_path):
    trace_dir = tmp_path / "traces"
    proc = torchrun("-m", "paralab", "run", "--strategy", "ddp", "--steps", "3", "--bucket-mb", "0.1",
                    "--trace-dir", str(trace_dir), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and len(summary["losses"]) == 3
    assert sorted(p.name for p in trace_dir.iterdir()) == ["rank00000.json", "rank00001.json"]
    from paralab.trace import Trace

    (one, two) = (Trace.load(p).meta["run_id"] for p in sorted(trace_dir.iterdir()))
    assert one == two and len(one) == 32  # the id rank 0 drew, in every rank's file
    merged = tmp_path / "merged.json"
    assert cli.main(["merge", str(trace_dir), "-o", str(merged)]) == 0
    trace = Trace.load(merged)
    assert trace.ranks == [0, 1] and trace.select(kind="all_reduce")
    # every rank's file describes the run: the merged trace's throughput and strategy are the run's
    assert trace.meta["strategy"] == "ddp" and trace.meta["ranks"].keys() == {0, 1}
    assert trace.summary()["tokens_per_s"] > 0
    # and what it measured, as a local run's trace holds it: a report of the folder had drawn no loss
    # and no memory
    assert trace.meta["losses"] == summary["losses"]
    assert trace.meta["peak_memory_bytes"] == summary["peak_memory_bytes"] and trace.meta["memory_by_kind"]
    import paralab

    same = paralab.run("ddp", 2, steps=3, bucket_mb=0.1)
    assert same.losses == pytest.approx(summary["losses"], rel=1e-6)


@pytest.mark.timeout(240)
def test_torchrun_ranks_given_different_settings_are_refused_naming_the_setting(tmp_path):
    """Each node's command line is typed apart: nodes given different seeds had trained on a mix of
    both seeds' data and exited 0, and different step counts had hung until the collective timeout."""
    job = tmp_path / "seed_by_rank.py"
    job.write_text("import os, sys\nfrom paralab import cli\n"
                   "sys.exit(cli.main(['run', '--strategy', 'ddp', '--steps', '2', '--timeout', '100', "
                   "'--seed', os.environ['RANK']]))\n")
    proc = torchrun(str(job))
    assert proc.returncode != 0
    said = ("paralab: invalid configuration: the ranks of this launch were given different settings: "
            "rank 1 has seed 1 against rank 0's 0; give every node the same flags")
    assert said in proc.stderr, proc.stderr[-3000:]
    assert "exitcode  : 2" in proc.stderr  # each rank's own code: invalid


@pytest.mark.timeout(240)
def test_a_torchrun_of_ones_own_names_the_rank_that_failed_and_shows_where_a_hung_rank_was():
    """torchrun's summary had said ``error_file: <N/A>`` for the rank that raised, and the rank that
    hung was stopped without a word, leaving its peer's timeout to read as the cause."""
    raised = torchrun("-m", "paralab", "run", "--strategy", "ddp", "--steps", "3", "--fail", "rank=1,step=1")
    assert raised.returncode == 1
    root = raised.stderr.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root and "error_file: <N/A>" not in root, raised.stderr[-3000:]
    assert "InjectedFault: fault injected on rank 1 at step 1" in root
    hung = torchrun("-m", "paralab", "run", "--strategy", "ddp", "--steps", "3", "--timeout", "5",
                    "--fail", "rank=1,step=1,kind=hang")
    assert hung.returncode == 1
    stack = hung.stderr.split("Current thread")[1]  # what faulthandler printed as torchrun stopped rank 1
    assert 'paralab/runtime/context.py", line' in stack and "in at_step" in stack, hung.stderr[-3000:]


def test_settings_a_rank_may_hold_for_itself_are_not_compared():
    """Threads, timeouts, a profile's folder and the nodes a rank reads from its own environment may
    differ from node to node; what shapes the training may not."""
    from paralab.runtime.worker import disagreement

    base = RunConfig(strategy="ddp", world_size=2)
    own = dataclasses.replace(base, threads_per_rank=3, timeout_s=9.0, nodes=2, profile_dir="/tmp/p",
                              oversubscribe=True)
    assert disagreement([base.to_dict(), own.to_dict()]) is None
    other = dataclasses.replace(base, model=dataclasses.replace(base.model, hidden=128), lr=0.1)
    assert disagreement([base.to_dict()] * 2 + [other.to_dict()]) == (
        "the ranks of this launch were given different settings: rank 2 has lr 0.1 against rank 0's "
        "0.003, model.hidden 128 against rank 0's 64; give every node the same flags")


@pytest.mark.parametrize("argv, message", [
    (["run", "--trace", "{tmp}/same.out", "--report", "{tmp}/same.out"],
     "--trace and --report both name {tmp}/same.out: one would overwrite or mix with the other's output"),
    (["run", "--trace-dir", "{tmp}/d", "--profile", "{tmp}/d/"], "--trace-dir and --profile both name"),
    (["nodes", "--trace-dir", "{tmp}/d", "--", "--profile", "{tmp}/d"],
     "--trace-dir and --profile both name"),
    (["run", "--trace-dir", "{tmp}/d", "--trace", "{tmp}/d/t.json"],
     "--trace {tmp}/d/t.json is inside --trace-dir {tmp}/d, where it would be read as one more rank's"),
], ids=["trace and report", "trace dir and profile", "nodes' trace dir and profile", "trace in trace dir"])
def test_outputs_that_would_clash_exit_2_before_any_process(nothing_starts, capsys, tmp_path, argv, message):
    """Two outputs at one path had been accepted: the file held only the report, the directory could
    not be merged. (A --trace-dir an earlier run wrote is reused: a run of another world size there is
    refused where the folder is read, tests/test_trace.py.)"""
    assert cli.main([arg.format(tmp=tmp_path) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and err.count("\n") == 1, err


@pytest.mark.parametrize("flag, value, instead", [
    ("--trace-dir", "ntd", "give it before --, to nodes itself"),
    ("--world-size", "8", "the world is --nnodes x --nproc-per-node"),
    ("--nodes", "3", "the nodes are --nnodes"),
])
def test_a_run_flag_that_nodes_sets_itself_exits_2(nothing_starts, capsys, flag, value, instead):
    """`paralab nodes` had replaced these without a word."""
    assert cli.main(["nodes", "--", "--strategy", "ddp", flag, value]) == 2
    err = capsys.readouterr().err
    assert f"{flag} after -- has no effect: paralab nodes sets it ({instead})" in err, err


@pytest.mark.parametrize("argv, said", [
    (["--world-size", "4"],
     "--world-size 4 disagrees with this launch, which set 1 (WORLD_SIZE): leave --world-size out under "
     "torchrun, or unset RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT to start a local run"),
    (["--world-size", "4", "--nodes", "2", "--hierarchical"], "--world-size 4 disagrees"),
    # the nodes come from the agents and each one's ranks, not from the variables a rank needs
    (["--nodes", "2"], "--nodes 2 disagrees with this launch, which set 1 (GROUP_WORLD_SIZE and "
                       "LOCAL_WORLD_SIZE)"),
])
def test_flags_that_disagree_with_a_torchrun_environment_exit_2(monkeypatch, capsys, argv, said):
    """Under torchrun (or variables left in a shell that look like it) the launch sets the world and
    the nodes: a --world-size 4 had run one rank and exited 0."""
    from paralab.runtime import torchrun

    monkeypatch.setattr(torchrun, "run_under_torchrun", lambda *a: pytest.fail("the rank was about to run"))
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT="1").items():
        monkeypatch.setenv(key, value)
    assert cli.main(["run", "--strategy", "ddp", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


def test_a_torchrun_ranks_trace_dir_holding_another_runs_files_exits_2_before_it_trains(
        monkeypatch, capsys, tmp_path):
    """A 4-rank run's files left in the folder: a 2-rank torchrun had trained, exited 0 and pointed at
    `paralab merge` of the folder, which then refused it."""
    from paralab.outputs import rank_trace_name
    from paralab.runtime import torchrun

    monkeypatch.setattr(torchrun, "run_under_torchrun", lambda *a: pytest.fail("the rank was about to run"))
    for key, value in dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT="1").items():
        monkeypatch.setenv(key, value)
    for rank in range(4):
        (tmp_path / rank_trace_name(rank)).write_text("{}")
    assert cli.main(["run", "--strategy", "ddp", "--trace-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (f"--trace-dir {tmp_path} holds rank00002.json, rank00003.json, which this run of 2 ranks "
            "would not overwrite") in err, err


def test_nodes_says_a_hierarchy_of_one_node_in_its_own_flag(nothing_starts, capsys):
    """It had said to set --nodes 2, which nodes then refuses after --."""
    assert cli.main(["nodes", "--nnodes", "1", "--", "--strategy", "ddp", "--hierarchical"]) == 2
    err = capsys.readouterr().err
    assert "hierarchical all-reduce needs ranks on at least 2 nodes: give --nnodes 2 or more" in err, err


@pytest.mark.parametrize("env, said", [
    (dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1"),
     "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR are set but MASTER_PORT is not: a rank of a launch"),
    (dict(RANK="0"), "RANK is set but WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not"),
])
def test_half_a_torchrun_environment_exits_2_before_any_process(nothing_starts, monkeypatch, capsys, env,
                                                                 said):
    """A wrapper that forgot MASTER_PORT had had every "rank" train alone, as a local run, and exit 0."""
    from paralab.runtime import torchrun

    for key in torchrun.ENV_KEYS:  # none left from the environment the tests run in
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["run", "--strategy", "ddp", "--world-size", "2"]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


def test_the_store_address_alone_is_no_launch(monkeypatch):
    """MASTER_ADDR and MASTER_PORT left in a shell: a local run, as before."""
    from paralab.runtime import torchrun

    for key in torchrun.ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    torchrun.refuse_half_a_launch()  # no error
    assert not torchrun.under_torchrun()


def test_the_trace_dir_help_says_what_a_local_run_writes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "merged.json from a local run, one file per rank under torchrun" in text


@pytest.mark.timeout(120)
def test_a_run_says_where_its_trace_folder_went_and_what_reads_it(capsys, tmp_path, no_leftover_ranks):
    """Given --trace-dir alone, the summary had named no file: the folder went unmentioned, and --json
    said "trace": null beside the merged.json it wrote. The file opens in Perfetto and reports."""
    folder = tmp_path / "traces"
    assert cli.main(["run", "--strategy", "single", "--steps", "1", "--trace-dir", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"trace: {folder / 'merged.json'} (open in https://ui.perfetto.dev)" in out
    # a run of one step: no "1 steps", no median "after the first" of a step that has none after it
    assert "in fp32, 1 step\n" in out and "step time (its one step, warm-up included): " in out
    assert "traceEvents" in json.loads((folder / "merged.json").read_text())  # the Chrome trace format
    assert cli.main(["run", "--strategy", "single", "--steps", "1", "--trace-dir", str(folder),
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trace"] == str(folder / "merged.json")
    assert cli.main(["report", str(folder), "-o", str(tmp_path / "r.html")]) == 0
    # given --trace too, both files are written and both named: the summary's trace is --trace's
    named = tmp_path / "named.json"
    assert cli.main(["run", "--strategy", "single", "--steps", "1", "--trace-dir", str(folder),
                     "--trace", str(named)]) == 0
    out = capsys.readouterr().out
    assert f"trace: {named} (open" in out and f"the same trace: {folder / 'merged.json'}" in out


@pytest.mark.timeout(120)
def test_a_run_without_spans_says_what_it_did_not_measure(capsys, no_leftover_ranks):
    """--no-trace records step spans only: the pipeline's bubble had read 100% and its bytes {}, as if
    the ranks had idled and sent nothing. Now null (the keys stay), and "not measured" in the text. The
    layout line says the interleaved schedule's virtual stages, as simulate does (v=2)."""
    assert cli.main(["run", "--strategy", "pp", "--world-size", "2", "--schedule", "interleaved",
                     "--virtual-stages", "2", "--microbatches", "4", "--steps", "2", "--no-trace",
                     "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert CONTRACT_KEYS <= set(summary) and summary["losses"] and summary["step_time_s"] > 0
    unmeasured = ("comm_bytes", "comm_payload_bytes", "comm_bytes_by_link", "bubble_fraction", "per_rank")
    assert {key: summary[key] for key in unmeasured} == dict.fromkeys(unmeasured)
    lines = cli.format_summary(summary).splitlines()
    assert ", schedule interleaved v=2, 4 microbatches" in lines[1], lines[1]
    assert "communication: not measured (--no-trace)" in lines
    assert "pipeline bubble (measured idle fraction): not measured (--no-trace)" in lines
    # a run over two nodes splits its bytes by link, as its --json does (README promises it)
    over_nodes = {**summary, "nodes": 2, "comm_bytes": {"all_reduce": 3 * 2**20}, "bubble_fraction": 0.25,
                  "comm_bytes_by_link": {"intra_node": 2**20, "inter_node": 2 * 2**20}}
    lines = cli.format_summary(over_nodes).splitlines()
    assert "by link: 1.000 MiB intra-node, 2.000 MiB inter-node per step (all ranks)" in lines
    assert "pipeline bubble (measured idle fraction): 25.0%" in lines
    # a few bytes read as bytes (fp16's 8-byte overflow check had read "0.000 MiB"); sequence
    # parallel is said on the layout line with the other levers
    few = {**summary, "comm_bytes": {"all_reduce": 8}, "sequence_parallel": True, "tokens_per_s": 8451.2}
    lines = cli.format_summary(few).splitlines()
    assert "all_reduce: 8 B on the wire per step (all ranks)" in lines
    assert lines[3].endswith("tokens/s: 8,451"), lines[3]  # as the report writes it (it had read "8451")
    assert lines[1].endswith(", sequence parallel"), lines[1]


def test_torchs_own_pipeline_says_it_measured_neither_its_bytes_nor_its_bubble(capsys, no_leftover_ranks):
    """torch runs a reference's collectives (and torch_pp its passes) where paralab's recorder does not
    see them: torch_pp had read 0 bytes sent and a 98% bubble of its step spans alone."""
    assert cli.main(["run", "--strategy", "torch_pp", "--world-size", "2", "--microbatches", "4",
                     "--steps", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["comm_bytes"] is None and summary["bubble_fraction"] is None and summary["losses"]
    assert summary["bubble_theoretical"] > 0  # the schedule's own, which no span is needed for
    lines = cli.format_summary(summary).splitlines()
    said = "not measured (torch runs its collectives out of paralab's sight)"
    assert f"communication: {said}" in lines and f"pipeline bubble (measured idle fraction): {said}" in lines


@pytest.mark.parametrize("argv, message", [
    (["run", "--fail", "rank=1"], "paralab run: --fail needs rank=R,step=K: step= is missing"),
    (["elastic", "--fail", "step=2"], "paralab elastic: --fail needs rank=R,step=K: rank= is missing"),
    (["elastic", "--slow", "factor=3"], "paralab elastic: --slow needs rank=R,factor=F: rank= is missing"),
])
def test_a_key_value_flag_without_a_key_says_which(capsys, argv, message):
    """Had said "fault step must be a whole number, got None": the step was left out."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith(message) and err.count("\n") == 1, err


@pytest.mark.parametrize("command, says", [
    ("run", "--schedule SCHEDULE pipeline schedule (pp, hybrid): naive, gpipe, 1f1b, interleaved, zb-h1, "
            "zbv, dualpipev"),
    ("run", "model chunks per pipeline rank: 2 or more for interleaved; zbv and dualpipev always hold 2"),
    # a tuple's repr had shown: (default: (1, 4))
    ("elastic", "--nnodes MIN:MAX node range of the rendezvous (torchrun's --nnodes); one worker per node "
                "(default: 1:4)"),
])
def test_help_says_what_the_code_accepts_as_it_is_typed(capsys, command, says):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    assert says in " ".join(capsys.readouterr().out.split())


def test_the_strategies_list_every_schedule(capsys):
    """naive ran but was listed nowhere (README's table is this one: tests/test_layout.py)."""
    from paralab.schedules import SCHEDULES

    assert cli.main(["strategies"]) == 0
    assert f"`--schedule {' / '.join(SCHEDULES)}`" in capsys.readouterr().out
    assert cli.build_parser().parse_args(["elastic"]).nnodes == (1, 4)


@pytest.mark.parametrize("command, offers, not_offered", [
    ("run", "kind=hang", "during=save"), ("elastic", "during=save", "kind=hang")])
def test_each_commands_help_offers_only_the_faults_it_takes(capsys, command, offers, not_offered):
    """One text had served both: run's --help offered during=save, which run refuses, and elastic's
    kind=hang."""
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert offers in said and not_offered not in said
