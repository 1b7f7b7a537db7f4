"""What paralab's commands share on the command line: exit codes, ``key=value`` options, and the
flags of every training run (``paralab run`` and ``paralab elastic`` declare them once, here).

Exit codes (a contract, README "The `--json` contract"): 0 success; 2 invalid configuration or
arguments (message on stderr, no process started); 1 a run that failed (which rank, what it raised).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import weakref
from collections.abc import Callable

from paralab.config import (
    ATTENTION_AS_SIMULATED,
    ATTENTION_KERNELS,
    DEVICES,
    DTYPES,
    FP16_LOSS_SCALE,
    MODEL_PRESETS,
    OPTIMIZERS,
    RECOMPUTE,
    TrainingConfig,
    nulls_for_non_finite,
)

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
EXIT_SIGPIPE = 141  # the reader of stdout went away, as shells report a program killed by SIGPIPE
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report a program killed by SIGINT


class DefaultsShown(argparse.HelpFormatter):
    """--help says each flag's default, where it has one its help does not already say: a default of
    None or "" is a flag left out (the command decides), and False a switch, neither worth a word."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default in ("", argparse.SUPPRESS)
        quiet = unset or "default" in text
        if quiet or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)".lstrip()


class OneLineErrors(argparse.ArgumentParser):
    """argparse, saying a bad argument in one line as every other refusal does (the usage block is
    behind --help); exit 2. Its --help shows the defaults (:class:`DefaultsShown`), as do the
    subcommands' parsers it makes. A flag is taken only as spelled whole: argparse's prefix matching
    had read ``run --seq 64`` as ``--sequence-parallel`` and then refused the stray "64" (``simulate``
    has a ``--seq``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsShown)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_INVALID, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """Arguments no parser took are said by the subcommand's parser (``said_in``), which names its
        own --help: "paralab run: unrecognized arguments: --bogus (see paralab run --help)", where the
        top parser had pointed at ``paralab --help``, which lists no run flag. One given before the
        command's name (``paralab --bogus run``) is the top parser's to say."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            given = sys.argv[1:] if args is None else list(args)
            command = getattr(parsed, "command", None)
            before = given[:given.index(command)] if command in given else given
            said_in = getattr(parsed, "said_in", None) or [self]
            said_by = self if any(arg in before for arg in extra) else said_in[0]
            said_by.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


NUMBERS_LIST = r"\[[-\d.,\s]*\]"  # a Python list of numbers as a message prints it: [1, 3, 3, 1]


def said_as_flags(message: str, parser: argparse.ArgumentParser) -> str:
    """A refusal of paralab's Python API said in ``parser``'s flags, for whoever typed a command: the
    configuration's fields it names (``zero_prefetch``, ``cp_mode=alltoall``) become the flags that set
    them (``--zero-prefetch``, ``--cp-mode alltoall``). A field of one word is changed only where it is
    given a value (``pp=1``), since bare it is an English word (the model, pp > 1)."""
    for action in parser._actions:  # argparse keeps no public list of a parser's flags
        long = [option for option in action.option_strings if option.startswith("--")]
        if not long or action.dest == "help":
            continue
        switch = action.nargs == 0  # store_true: name=True is the flag alone
        field = re.escape(action.dest)
        bare = "" if "_" in action.dest else "(?==)"
        # a word of its own, not part of a path (a sweep's directory named pp=2) or a dotted name; its
        # value a list of numbers (after = or a space) or running to a space, a comma, a colon, a bracket
        # or a sentence's full stop
        pattern = (rf"(?<![\w.\-/]){field}{bare}(?:=({NUMBERS_LIST}|[^\s/]+?)|\s({NUMBERS_LIST}))?"
                   rf"(?=[\s,;:)]|\.(?:\s|$)|$)")

        def flag(match, long=long[0], switch=switch):
            value = match.group(1) or match.group(2)
            if value is None or (switch and value == "True"):
                return long
            if value.startswith("["):  # a list's repr, as the flag takes it (--stage-layers 1,3,3,1)
                return long + " " + ",".join(part.strip() for part in value.strip("[]").split(","))
            return long + " " + value.strip("'")  # a repr's quotes: the shell takes the word bare

        message = re.sub(pattern, flag, message)
    return message


LIST_STARTING_WITH_MINUS = re.compile(r"-\d+(,-?\d+)+")


def attach_negative_lists(argv: list[str]) -> list[str]:
    """``argv`` with a list that starts with a minus sign (``--stage-layers -1,5``) attached to its flag
    (``--stage-layers=-1,5``): argparse takes ``-1,5`` for a flag of its own and would say only that
    the flag "expected one argument", where the list's own check says what is wrong with it."""
    joined: list[str] = []
    for word in argv:
        if joined and joined[-1].startswith("--") and "=" not in joined[-1] \
                and LIST_STARTING_WITH_MINUS.fullmatch(word):
            joined[-1] += "=" + word
        else:
            joined.append(word)
    return joined


def int_list(text: str) -> list[int]:
    """An argument of whole numbers separated by commas (--stage-layers 1,3,3,1)."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("expected whole numbers separated by commas, like 1,3,3,1, "
                                         f"got {text!r}") from None


def below_one(args, flags) -> str:
    """The first of ``flags`` given below 1 (a count of GPUs, sequences, stages...), said as its flag;
    empty when none is."""
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value < 1:
            return f"--{flag.replace('_', '-')} must be >= 1, got {value}"
    return ""


def json_text(obj) -> str:
    """``obj`` as JSON that any reader accepts: a non-finite number (nan, inf) becomes null."""
    return json.dumps(nulls_for_non_finite(obj), allow_nan=False)


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def key_values(text: str) -> dict:
    """Parse ``rank=1,factor=1.5`` into {"rank": 1, "factor": 1.5} (for --fail, --slow)."""
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if not value:
            raise argparse.ArgumentTypeError(f"expected key=value pairs like rank=1,step=3, got {text!r}")
        out[key.strip()] = _number(value.strip())
    return out


def attention_named(to_this_command: dict[str, str]):
    """The type of an ``--attention`` flag: the command's own name for a kernel, or the other
    commands' name for it turned into this one's (``to_this_command``), so ``simulate --attention
    sdpa`` and ``run --attention fused`` mean what they say. Anything else is left for ``choices``
    to refuse."""
    return lambda text: to_this_command.get(text, text)


class OneValueWhateverItsName(argparse.Action):
    """An option of several names (``--microbatches``, ``--accumulate``) given under two of them with
    different values is refused, naming both: the last had won without a word. One name given twice
    keeps argparse's rule, the last wins (a script's override of its own defaults)."""

    def __call__(self, parser, namespace, values, option_string=None):
        parsing, said = self._said
        if parsing() is not namespace:  # another parse: what an earlier one said is not this one's
            said = {}
            self._said = (weakref.ref(namespace), said)
        others = [f"{name} {value}" for name, value in said.items()
                  if name != option_string and value != values]
        if others:
            parser.error(f"{others[0]} and {option_string} {values} are one option: give it once")
        said[option_string] = values
        setattr(namespace, self.dest, values)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the namespace being parsed (weakly: a later one may reuse a dead one's id) and each name's value
        self._said: tuple[Callable[[], object], dict[str, object]] = (lambda: None, {})


class NeedsTheKeysOfItsMetavar(argparse.Action):
    """A flag of ``key=value`` pairs (type :func:`key_values`) whose metavar names the keys it needs
    (``rank=R,step=K``): one left out is refused in the flag's own terms, ``--fail needs
    rank=R,step=K: step= is missing``, where the run's config had said "fault step must be a whole
    number, got None". Other keys (kind=hang) are the config's to check."""

    def __call__(self, parser, namespace, values, option_string=None):
        missing = [key for key in re.findall(r"(\w+)=", self.metavar) if key not in values]
        if missing:
            parser.error(f"{option_string} needs {self.metavar}: {missing[0]}= is missing")
        setattr(namespace, self.dest, values)


def add_training_args(p: argparse.ArgumentParser, defaults: TrainingConfig, presets=MODEL_PRESETS,
                      fault_help: str = "a rank raises (kind=hang: stops answering)",
                      shapes_help: str = "") -> None:
    """The flags of TrainingConfig's fields, with ``defaults``' values (RunConfig or ElasticConfig), the
    model ``presets`` the command trains, where a shape of one's own is given (``shapes_help``: run's
    from Python; elastic's workers build presets only), and what ``--fail`` does in it (``fault_help``:
    each command takes its own kinds of fault)."""
    p.add_argument("--model", default=defaults.model_name, help=f"preset: {', '.join(presets)}{shapes_help}")
    p.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps")
    p.add_argument("--global-batch", type=int, default=defaults.global_batch,
                   help="samples per step over all ranks, whatever the world size")
    p.add_argument("--seed", type=int, default=defaults.seed,
                   help="the weights' initialisation, the data and each rank's dropout")
    p.add_argument("--device", default=defaults.device, choices=DEVICES,
                   help="auto: CUDA when every local rank has a GPU of its own, else the CPU")
    p.add_argument("--lr", type=float, default=defaults.lr, help="learning rate")
    p.add_argument("--optimizer", default=defaults.optimizer, choices=OPTIMIZERS,
                   help="what updates the weights")
    p.add_argument("--timeout", type=float, default=defaults.timeout_s,
                   help="seconds a collective may hang before the run fails")
    p.add_argument("--threads", type=int, default=defaults.threads_per_rank,
                   help="torch threads per rank (0: a fair share of the cores)")
    p.add_argument("--no-trace", action="store_true", help="record step spans only")
    p.add_argument("--trace", metavar="PATH", help="write the merged trace in Chrome trace format (Perfetto)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--dtype", default=defaults.dtype, choices=DTYPES,
                   help="parameters and activations for compute; "
                        "master weights and optimizer states stay fp32")
    p.add_argument("--reduce-dtype", default=defaults.reduce_dtype, choices=DTYPES,
                   help="dtype gradients are reduced in across ranks (fp32, as FSDP2's default)")
    p.add_argument("--loss-scale", type=float,  # None: not given (refused but at fp16: config.py)
                   help=f"fp16: where the dynamic loss scale starts (default {FP16_LOSS_SCALE:g}; halved "
                        "on overflow, doubled after 200 good steps)")
    p.add_argument("--recompute", default=defaults.recompute, choices=RECOMPUTE,
                   help="activation recomputation: selective (attention cores) or full (every block)")
    p.add_argument("--attention", default=defaults.model.attention, choices=ATTENTION_KERNELS,
                   type=attention_named({sim: lab for lab, sim in ATTENTION_AS_SIMULATED.items()}),
                   help="sdpa (simulate's fused): torch's fused attention; math (simulate's standard): "
                        "the s x s scores written out")
    p.add_argument("--oversubscribe", action="store_true",
                   help="start more local ranks than the cores and memory hold (refused otherwise)")
    p.add_argument("--fail", type=key_values, action=NeedsTheKeysOfItsMetavar, metavar="rank=R,step=K",
                   help=f"make rank R fail at step K (testing): {fault_help}")


def build_config(cls, args, **options):
    """A ``cls`` (RunConfig or ElasticConfig) from parsed :func:`add_training_args` flags and the
    command's own ``options``: the preset model, with the attention kernel asked for."""
    cfg = cls.build(args.model, **training_options(args), **options)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention=args.attention))


def training_options(args) -> dict:
    """TrainingConfig keyword arguments (all but the model) from parsed :func:`add_training_args` flags."""
    return dict(steps=args.steps, global_batch=args.global_batch, seed=args.seed, device=args.device,
                lr=args.lr, optimizer=args.optimizer, timeout_s=args.timeout,
                threads_per_rank=args.threads, trace=not args.no_trace, fault=args.fail,
                oversubscribe=args.oversubscribe, dtype=args.dtype, reduce_dtype=args.reduce_dtype,
                recompute=args.recompute, loss_scale=args.loss_scale)
