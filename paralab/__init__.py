"""paralab: a visual lab for the parallel training of large models.

    import paralab
    run = paralab.run(strategy="ddp", world_size=4, steps=5)
    run.losses, run.summary, run.trace

Every strategy runs for real as torch.distributed processes and is traced; ``paralab.sim`` predicts
the same runs (and much larger ones) with a cost model, as the same Trace type.
"""

import os

from paralab.config import MODEL_PRESETS, ConfigError, ModelConfig, RunConfig
from paralab.layout import Layout, resolve_layout
from paralab.runtime.result import RunError, RunResult
from paralab.trace import Span, Trace
from paralab.trace_import import import_profile

__version__ = "0.1.0"


def run(strategy: str = "ddp", world_size: int = 1, steps: int = 5, model="tiny", *, progress=None,
        trace_path: str | None = None, **options) -> RunResult:
    """Run ``strategy`` on ``world_size`` local ranks and return a RunResult.

    ``model`` is a preset name ("tiny", "small", ...), a ModelConfig or a dict of its fields; other
    options are RunConfig fields (global_batch, seed, device, bucket_mb, pp, schedule, ...). A config
    that cannot work raises ConfigError before any process starts; a failing rank raises RunError. An
    option the strategy does not use (a ``bucket_mb`` handed to every strategy of a benchmark) is run
    and listed in the result's ``unused_options``, where the CLI refuses its flag.
    """
    from paralab.outputs import check_outputs
    from paralab.runtime.launch import launch

    cfg = RunConfig.build(model, strategy=strategy, world_size=world_size, steps=steps, **options)
    # before the run: a directory or a number given as trace_path had been refused once it had trained,
    # and a file given as profile_dir by every rank once it had started
    if trace_path and not isinstance(trace_path, str | os.PathLike):
        raise ConfigError(f"trace_path must be a file's path, got {trace_path!r}")
    if progress is not None and not callable(progress):  # it had raised from the launcher's watch loop
        raise ConfigError(f"progress must be a function of (step, steps), got {progress!r}")
    check_outputs(files=[("trace_path", trace_path)], dirs=[("profile_dir", cfg.profile_dir)])
    result = launch(cfg, progress=progress)
    if trace_path:
        result.save_trace(trace_path)
    return result


__all__ = [
    "run", "RunConfig", "ModelConfig", "MODEL_PRESETS", "Layout", "resolve_layout", "ConfigError", "RunError",
    "RunResult", "Trace", "Span", "import_profile", "__version__",
]
