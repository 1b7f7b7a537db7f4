"""The memory levers explorer: change the model, the sequence and the levers, see the predicted memory
by kind at once, and measure the same settings on this machine beside it.

Predictions come from the cost model's memory formulas (paralab.sim.bridge.predict_memory, the same
numbers ``paralab simulate`` prints): the kinds at the step's fullest moment. "Measure" runs two steps
of single-device training with those settings and draws the kinds at the moment of their peak (the
second step's, once the optimizer's states exist, as the prediction's steady state has them), so a
learner sees which formula each lever changes and whether the measurement agrees. A setting whose
predicted tensors would take more than half the memory this machine has free is not measured.
"""

from __future__ import annotations

from paralab.widgets._common import attach, figure_widget, message, refuse, replace_figure, widgets

KINDS = ("params", "grads", "optimizer", "activations")


def run_config(c: dict, vocab: int = 128):
    """The single-device RunConfig of the explorer's control values: two steps, so that the second
    step's peak holds the optimizer's states (the first allocates them after its backward)."""
    from paralab import RunConfig

    model = dict(layers=c["layers"], hidden=c["hidden"], heads=max(1, c["hidden"] // 16), vocab=vocab,
                 seq_len=c["seq"], attention=c["attention"])
    return RunConfig.build(model, strategy="single", world_size=1, steps=2, global_batch=c["micro_batch"],
                           dtype=c["dtype"], recompute=c["recompute"])


def too_big_to_measure(predicted: dict) -> str:
    """Why a run whose tensors are predicted at ``predicted`` (bytes by kind) is not started here: more
    than half the memory this machine has free (autograd's workspaces and the allocator come on top),
    or "" when it may run."""
    from paralab.runtime.worker import RANK_MEMORY_BYTES, available_memory_bytes

    need, free = sum(predicted[k] for k in KINDS) + RANK_MEMORY_BYTES, available_memory_bytes()
    if free and need > free / 2:
        return (f"not measured: its tensors are predicted at {need / 2**30:.1f} GiB with the process, more "
                f"than half the {free / 2**30:.1f} GiB this machine has free; lower the sequence, "
                "micro-batch or model, or use sdpa attention")
    return ""


def levers_explorer(layers: int = 4, hidden: int = 64, seq: int = 128, micro_batch: int = 4,
                    vocab: int = 128, dtype: str = "fp32"):
    """Sliders (layers, hidden, sequence, micro-batch) and toggles (dtype, recompute, attention) over
    the predicted memory by kind; a button measures the same run. Attributes: ``controls``,
    ``figure``, ``measure()``, ``measured`` (the last measured per-kind peaks), ``message``."""
    from paralab.sim.bridge import predict_memory
    from paralab.viz.memory import memory

    w = widgets()
    controls = {
        "layers": w.SelectionSlider(options=[1, 2, 4, 8, 16], value=layers, description="layers"),
        "hidden": w.SelectionSlider(options=[32, 64, 128, 256, 512], value=hidden, description="hidden"),
        "seq": w.SelectionSlider(options=[32, 64, 128, 256, 512, 1024], value=seq, description="sequence"),
        "micro_batch": w.SelectionSlider(options=[1, 2, 4, 8, 16], value=micro_batch,
                                         description="micro-batch"),
        "dtype": w.ToggleButtons(options=["fp32", "bf16"], value=dtype, description="dtype"),
        "recompute": w.ToggleButtons(options=["none", "selective", "full"], value="none",
                                     description="recompute"),
        "attention": w.ToggleButtons(options=["sdpa", "math"], value="sdpa", description="attention"),
    }
    msg = w.HTML()
    button = w.Button(description="Measure on this machine", button_style="primary", icon="play")
    state: dict = {"measured": None}

    def values() -> dict:
        return {k: v.value for k, v in controls.items()}

    def draw() -> None:
        bars = {"predicted": {k: v for k, v in predict_memory(run_config(values(), vocab)).items()
                              if k in KINDS}}
        if state["measured"] is not None:
            bars["measured"] = state["measured"]
        c = values()
        layers = f"{c['layers']} layer" + ("s" if c["layers"] != 1 else "")
        title = (f"memory by kind, one device: {layers}, hidden {c['hidden']}, "
                 f"sequence {c['seq']}, micro-batch {c['micro_batch']}, {c['dtype']}, "
                 f"recompute {c['recompute']}, {c['attention']}")
        replace_figure(fw, memory(bars, title=title))

    def redraw(*_) -> None:
        state["measured"] = None  # a measurement of other settings no longer applies
        msg.value = ""
        try:
            draw()
        except Exception as exc:  # a shape the model refuses: say so, keep the last figure
            refuse(msg, fw, f"{type(exc).__name__}: {exc}")

    def measure(*_) -> dict | None:
        from paralab.runtime.launch import launch

        try:
            cfg = run_config(values(), vocab)
            if refusal := too_big_to_measure(predict_memory(cfg)):
                msg.value = message(refusal, "error")
                return None
            msg.value = message("measuring two steps ...")
            run = launch(cfg)
        except Exception as exc:
            msg.value = message(f"{type(exc).__name__}: {exc}", "error")
            return None
        state["measured"] = {k: run.summary["memory_by_kind"][0][k] for k in KINDS}
        msg.value = message("measured: the kinds at the moment of the run's peak (its second step's), as the "
                            "prediction gives them at its fullest moment", "ok")
        draw()
        return state["measured"]

    fw = figure_widget(memory({"predicted": dict.fromkeys(KINDS, 0)}))
    for control in controls.values():
        control.observe(redraw, names="value")
    button.on_click(measure)
    app = w.VBox([
        w.HBox([controls["layers"], controls["hidden"]]), w.HBox([controls["seq"], controls["micro_batch"]]),
        w.HBox([controls["dtype"]]), w.HBox([controls["recompute"]]), w.HBox([controls["attention"], button]),
        msg, fw,
    ])
    attach(app, controls=controls, figure=fw, message=msg, measure=measure, redraw=redraw,
           measured=lambda: state["measured"])
    redraw()
    return app
