"""The speedup explorer: measured step time and speedup over the steps of each run and against world
size, beside the cost model's prediction and two ideals.

The ideals answer different questions. "n devices, n x" is what adding accelerators would give if
nothing else cost anything. "What this machine allows" is the ceiling of the machine the runs were
measured on: CPU ranks share its cores, so n ranks of t threads can use at most min(n t, cores)
cores, and the speedup over the one-rank baseline (t1 threads) can never pass min(n t, cores) /
min(t1, cores); it is drawn beside the prediction for this machine only (beside an h100's it had read as
the h100's ceiling). The prediction for the measuring machine is ``paralab.sim.bridge.predict_run`` on
``local`` (this machine, calibrated) or, on GPUs, on the preset that matches them; the curve against
world size can be redrawn for any preset, model and dtype.
"""

from __future__ import annotations

import dataclasses

from paralab.widgets._common import (
    attach,
    figure_widget,
    message,
    refuse,
    replace_figure,
    row,
    toggle,
    up_to,
    widgets,
)

WORLD_SIZES = [1, 2, 4, 8, 16, 32, 64]
THIS_MACHINE = "this machine"


def this_machine() -> str | None:
    """The hardware preset that prices runs here: ``local`` without GPUs, the preset named in the
    GPU's name with them (None when no preset matches: no prediction is better than a wrong one)."""
    import torch

    from paralab.sim.hardware import PRESETS

    if not torch.cuda.is_available():
        return "local"
    name = torch.cuda.get_device_name(0).lower()
    return next((key for key in sorted(PRESETS, key=len, reverse=True) if key in name), None)


def machine_allows(cfg, sizes) -> dict[int, float]:
    """{n: the largest speedup over one rank that this CPU's cores allow n ranks} (module docstring)."""
    from paralab.runtime.worker import threads_for, usable_cores

    cores = usable_cores()

    def used(n: int) -> int:
        return min(n * threads_for(cfg, n), cores)

    return {n: used(n) / used(1) for n in sizes}


def calibrated(threads, tell) -> None:
    """Measure this machine for ranks of each of ``threads`` torch threads it has not been measured for
    (10-30 s each, then cached), calling ``tell(cache path)`` before each. The predictions on ``local``
    (paralab.sim.bridge.hardware_for_run) then read the cache: measured by them, the explorer's first
    open had sat 20 s without a word."""
    from paralab.sim.hardware import local

    for count in sorted(set(threads)):
        local(threads=count, on_measure=tell)


def _config_at(cfg, n: int, model: str, dtype: str):
    """``cfg`` at ``n`` ranks. One rank runs ``single``, the mesh's options back to their defaults; a
    strategy of several axes (hybrid) grows its data-parallel degree and keeps tp, pp, cp and ep, as
    adding replicas does (a size they do not divide is refused, and the explorer says why); a
    single-axis strategy spreads over all ``n``. The ranks per node are kept."""
    from paralab.config import MODEL_PRESETS
    from paralab.strategies.registry import OPTION_DEFAULTS, TUNING_OPTIONS, get_strategy

    per_node = max(cfg.world_size // max(cfg.nodes, 1), 1)
    changes = dict(world_size=n, nodes=n // per_node if n % per_node == 0 else 1, model=MODEL_PRESETS[model],
                   model_name=model, dtype=dtype)
    if n == 1:
        mesh = {option: value for option, value in OPTION_DEFAULTS.items() if option not in TUNING_OPTIONS}
        changes.update(strategy="single", **mesh)
    elif len(get_strategy(cfg.strategy).axes) > 1:
        changes["dp"] = 0  # filled from the world size and the other degrees (paralab.layout)
    return dataclasses.replace(cfg, **changes)


def predicted_curve(cfg, model: str, hardware: str, dtype: str,
                    max_world: int) -> tuple[list[dict], list[str]]:
    """Predicted points (world size, step time, tokens/s) of ``cfg`` at 1, 2, 4 ... ``max_world``
    ranks with its global batch (a hybrid grown along dp: :func:`_config_at`), and why the sizes the
    model or the layout refuses were left out."""
    from paralab.config import ConfigError
    from paralab.sim.bridge import predict_run
    from paralab.sim.specs import SpecError

    points, skipped = [], []
    for n in [w for w in WORLD_SIZES if w <= max_world]:
        try:
            p = predict_run(_config_at(cfg, n, model, dtype), hardware)
        except (ConfigError, SpecError) as exc:
            skipped.append(f"{n} ranks: {exc}")
            continue
        points.append({"world_size": n, "step_time_s": p.step_time_s, "tokens_per_s": p.tokens_per_s})
    return points, skipped


def speedup_explorer(runs, baseline=None, max_world: int = 16):
    """Measured runs ({world size: RunResult}, or a list of them; the one-rank run is the baseline
    unless ``baseline`` is given) beside the prediction. Controls redraw the predicted curve against
    world size: hardware ("this machine" or a preset), model (a lab preset), dtype, and how far.

    Attributes: ``controls``, ``figure``, ``message``, ``redraw()``.
    """
    from paralab.config import MODEL_PRESETS
    from paralab.runtime.result import RunResult
    from paralab.runtime.worker import threads_for
    from paralab.sim import hardware as hw_mod
    from paralab.sim.bridge import predict_run
    from paralab.viz.scaling import speedup_steps

    given = list(runs.values()) if isinstance(runs, dict) else list(runs)
    if not given or not all(isinstance(run, RunResult) for run in given):  # {} had been min() of nothing
        raise ValueError(f"runs must be one or more RunResults of paralab.run, by world size or in a list, "
                         f"got {runs!r}"[:300])
    runs = runs if isinstance(runs, dict) else {r.layout.world_size: r for r in given}  # a generator is spent
    baseline = baseline if baseline is not None else runs[min(runs)]
    cfg = runs[max(runs)].config
    here = this_machine()
    measured = {n: r for n, r in runs.items()}
    w = widgets()
    msg = w.HTML()

    def tell(cache) -> None:
        from paralab.sim.hardware import MEASURING

        said = MEASURING.format(cache)
        print(said)  # the cell's output, while the explorer is built (not yet on screen)
        msg.value = message(said)  # the explorer's, when a control's redraw measures

    if here == "local":
        calibrated((threads_for(r.config, n) for n, r in measured.items()), tell)
    predicted_here = {n: predict_run(r.config, here).step_time_s for n, r in measured.items()} if here else {}
    controls = {
        "hardware": w.Dropdown(options=[THIS_MACHINE, *hw_mod.PRESETS], value=THIS_MACHINE,
                               description="predict on"),
        "model": w.Dropdown(options=list(MODEL_PRESETS),
                            value=cfg.model_name if cfg.model_name in MODEL_PRESETS
                            else "tiny", description="model"),
        "dtype": toggle(["fp32", "bf16"], cfg.dtype if cfg.dtype != "fp16" else "bf16", "dtype"),
        "max_world": up_to(WORLD_SIZES[1:], max_world, "rank", argument="max_world"),
    }
    fw = figure_widget(speedup_steps(measured, baseline))

    def redraw(*_):
        c = {k: v.value for k, v in controls.items()}
        hardware = here if c["hardware"] == THIS_MACHINE else c["hardware"]
        notes = []
        curve = None
        if hardware is None:
            notes.append("no hardware preset matches these GPUs: choose one to see a prediction")
        else:
            try:
                if hardware == "local":
                    calibrated((threads_for(cfg, n) for n in WORLD_SIZES if n <= c["max_world"]), tell)
                curve, skipped = predicted_curve(cfg, c["model"], hardware, c["dtype"], c["max_world"])
            except Exception as exc:  # a calibration or cost-model failure: say it, keep the figure
                refuse(msg, fw, f"{type(exc).__name__}: {exc}")
                return
            notes += [f"not predicted: {s}" for s in skipped]
        sizes = sorted({*measured, *(p["world_size"] for p in curve or [])})
        this_cpu = here == "local" and c["hardware"] == THIS_MACHINE  # the cores' ceiling is this CPU's
        allows = machine_allows(cfg, sizes) if this_cpu else None
        label = f"predicted on {c['hardware'] if hardware == here else hardware}: {c['model']}, {c['dtype']}"
        fig = speedup_steps(measured, baseline, predicted=predicted_here, curve=curve or None,
                            ideal_here=allows, curve_label=label,
                            title=f"{cfg.strategy}: measured{' beside predicted' if curve else ''}, "
                                  f"global batch {cfg.global_batch}")
        replace_figure(fw, fig)
        msg.value = message("\n".join(notes), "info") if notes else ""

    for control in controls.values():
        control.observe(redraw, names="value")
    app = w.VBox([row(controls["hardware"], controls["model"]),
                  row(controls["dtype"], controls["max_world"]), msg, fw])
    attach(app, controls=controls, figure=fw, message=msg, redraw=redraw)
    redraw()
    return app
