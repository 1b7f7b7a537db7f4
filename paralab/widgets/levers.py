"""The memory levers explorer: change the model, the sequence and the levers, see the predicted memory
by kind at once, and measure the same settings on this machine beside it.

Predictions come from the cost model's memory formulas (paralab.sim.bridge.predict_memory, the same
numbers ``paralab simulate`` prints): the kinds at the step's fullest moment. "Measure" runs two steps
of single-device training with those settings and draws the kinds at the moment of their peak (the
second step's, once the optimizer's states exist, as the prediction's steady state has them), so a
learner sees which formula each lever changes and whether the measurement agrees. A setting whose
predicted tensors would take more than half the memory this machine has free, or whose steps would
take more than a minute here, is not measured.
"""

from __future__ import annotations

from functools import cache

from paralab.viz._common import byte_scale
from paralab.widgets._common import (
    attach,
    figure_widget,
    message,
    refuse,
    replace_figure,
    row,
    select,
    toggle,
    widgets,
)

KINDS = ("params", "grads", "optimizer", "activations")


def run_config(c: dict, vocab: int = 128):
    """The single-device RunConfig of the explorer's control values: two steps, so that the second
    step's peak holds the optimizer's states (the first allocates them after its backward)."""
    from paralab import RunConfig

    model = dict(layers=c["layers"], hidden=c["hidden"], heads=max(1, c["hidden"] // 16), vocab=vocab,
                 seq_len=c["seq"], attention=c["attention"])
    return RunConfig.build(model, strategy="single", world_size=1, steps=2, global_batch=c["micro_batch"],
                           dtype=c["dtype"], recompute=c["recompute"])


MEASURE_BUDGET_S = 60.0  # the longest a measurement may take here before the explorer asks for less


@cache
def matmul_rate(dtype: str, size: int = 256) -> float:
    """FLOP/s this process's linear layers reach in ``dtype`` on the CPU (their forward and backward
    matmuls, as the calibration times them), timed once a session: a CPU without bf16 units runs bf16
    a thirtieth as fast as fp32 (3 against 90 GFLOP/s on a 2-core box)."""
    from paralab.sim.calibration import linear_rows

    (_, _, _, seconds), = linear_rows([(size, size, size)], dtype)
    return 2 * size**3 / seconds


def too_slow_to_measure(cfg) -> str:
    """Why a run of ``cfg`` is not started here: its steps' hardware FLOPs (recompute included) at this
    machine's matrix-multiply rate in the run's dtype would take more than :data:`MEASURE_BUDGET_S`, a
    bound from below (the other kernels come on top); or "" when it may run. Pressed, the button had
    held the kernel for five minutes over bf16 at 8 layers of 512, then said the run hung."""
    from paralab.config import resolve_device
    from paralab.sim import bridge, counting

    if resolve_device(cfg.device, 1) == "cuda":  # a GPU's rate is not the CPU's timed here
        return ""
    model, parallel = bridge.specs_from_run(cfg)
    flops = cfg.steps * counting.flops_per_step(model, parallel.global_batch, parallel.recompute)["hardware"]
    rate = matmul_rate(cfg.dtype)
    if flops / rate <= MEASURE_BUDGET_S:
        return ""
    return (f"not measured: its {cfg.steps} steps would take at least {flops / rate / 60:.0f} min here "
            f"({flops:.2g} FLOPs at the {rate / 1e9:.1f} GFLOP/s this machine's {cfg.dtype} matrix "
            "multiplies reach); lower the layers, hidden size, sequence or micro-batch"
            + (", or use fp32" if cfg.dtype != "fp32" else ""))


def too_big_to_measure(predicted: dict, attention: str = "math") -> str:
    """Why a run whose tensors are predicted at ``predicted`` (bytes by kind) is not started here: more
    than half the memory this machine has free (autograd's workspaces and the allocator come on top),
    or "" when it may run. The fused kernel is offered only to a run of ``attention`` "math" (it had
    been offered to one that had it)."""
    from paralab.runtime.worker import RANK_MEMORY_BYTES, available_memory_bytes

    need, free = sum(predicted[k] for k in KINDS) + RANK_MEMORY_BYTES, available_memory_bytes()
    if free and need > free / 2:
        return (f"not measured: its tensors are predicted at {need / 2**30:.1f} GiB with the process, more "
                f"than half the {free / 2**30:.1f} GiB this machine has free; lower the sequence, "
                "micro-batch or model" + (", or use sdpa attention" if attention == "math" else ""))
    return ""


def inside_backward(measured: dict, predicted: dict, recompute: str) -> str:
    """Why a measured peak holds gradients the predicted one does not, or "". The cost model weighs the
    backward's moments at its ends (paralab.sim.cost): its last layer's without the gradients made
    before that layer is recomputed, its first layer's and its end with them. So a measured peak with
    gradients where the prediction has none fell early in the backward: the head's gradients, and
    under selective recomputation the last layer's after its attention core, beside the recomputed
    core (0.63 MiB of 53.7 at 8 layers, hidden 128, 256 tokens, math attention). The message names
    only what the run's ``recompute`` policy makes (it had spoken of selective recomputation under
    full)."""
    if not measured["grads"] or predicted["grads"]:
        return ""
    made = "the head's" + (", and the last layer's after its attention core" if recompute == "selective"
                           else "")
    beside = {"none": "the saved activations", "selective": "the recomputed attention core",
              "full": "the recomputed activations"}[recompute]
    return (f"\nits peak fell early in the backward, with the gradients made by then ({made}) beside "
            f"{beside}: the prediction weighs that moment without those gradients")


def levers_explorer(layers: int = 4, hidden: int = 64, seq: int = 128, micro_batch: int = 4,
                    vocab: int = 128, dtype: str = "fp32"):
    """Sliders (layers, hidden, sequence, micro-batch) and toggles (dtype, recompute, attention) over
    the predicted memory by kind; a button measures the same run. Attributes: ``controls``,
    ``figure``, ``button``, ``measure()``, ``measured`` (the last measured per-kind peaks), ``message``."""
    from paralab.sim.bridge import predict_memory
    from paralab.viz.memory import memory

    w = widgets()
    controls = {
        "layers": select(w.SelectionSlider, "layers", [1, 2, 4, 8, 16], layers, description="layers"),
        "hidden": select(w.SelectionSlider, "hidden", [32, 64, 128, 256, 512], hidden, description="hidden"),
        "seq": select(w.SelectionSlider, "seq", [32, 64, 128, 256, 512, 1024], seq, description="sequence"),
        "micro_batch": select(w.SelectionSlider, "micro_batch", [1, 2, 4, 8, 16], micro_batch,
                              description="micro-batch"),
        "dtype": toggle(["fp32", "bf16"], dtype, "dtype", argument="dtype"),
        "recompute": toggle(["none", "selective", "full"], "none", "recompute"),
        "attention": toggle(["sdpa", "math"], "sdpa", "attention"),
    }
    msg = w.HTML()
    button = w.Button(description="Measure on this machine", button_style="primary", icon="play",
                      layout=w.Layout(width="auto"))
    state: dict = {"measured": None}

    def values() -> dict:
        return {k: v.value for k, v in controls.items()}

    def draw() -> None:
        bars = {"predicted": {k: v for k, v in predict_memory(run_config(values(), vocab)).items()
                              if k in KINDS}}
        if state["measured"] is not None:
            bars["measured"] = state["measured"]
        # in the unit of the tallest bar: in MiB, 40 GiB of math attention's scores had read "40k"
        _, unit = byte_scale(max(sum(kinds.values()) for kinds in bars.values()))
        fig = memory(bars, title="memory by kind on one device", unit=unit)
        # the settings under the bars: a title naming them all had run under the plot's toolbar
        c = values()
        layers = f"{c['layers']} layer" + ("s" if c["layers"] != 1 else "")
        fig.update_xaxes(title_text=f"{layers}, hidden {c['hidden']}, sequence {c['seq']}, micro-batch "
                                    f"{c['micro_batch']}, {c['dtype']}, recompute {c['recompute']}, "
                                    f"{c['attention']}")
        # every kind of a bar in one hover: a kind a few pixels tall is still read there
        fig.update_layout(hovermode="x unified")
        replace_figure(fw, fig)

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
            predicted = predict_memory(cfg)
            if refusal := too_big_to_measure(predicted, cfg.model.attention) or too_slow_to_measure(cfg):
                msg.value = message(refusal, "error")
                return None
            msg.value = message("measuring two steps ...")
            button.disabled = True  # one measurement at a time: a click while one runs had queued another
            run = launch(cfg)
        except Exception as exc:
            msg.value = message(f"{type(exc).__name__}: {exc}", "error")
            return None
        finally:
            button.disabled = False
        state["measured"] = {k: run.summary["memory_by_kind"][0][k] for k in KINDS}
        said = ("measured: the kinds at the moment of the run's peak (its second step's), as the prediction "
                "gives them at its fullest moment")
        msg.value = message(said + inside_backward(state["measured"], predicted, cfg.recompute), "ok")
        draw()
        return state["measured"]

    fw = figure_widget(memory({"predicted": dict.fromkeys(KINDS, 0)}))
    for control in controls.values():
        control.observe(redraw, names="value")
    button.on_click(measure)
    app = w.VBox([
        row(controls["layers"], controls["hidden"]), row(controls["seq"], controls["micro_batch"]),
        row(controls["dtype"], controls["attention"]), row(controls["recompute"], button),
        msg, fw,
    ])
    attach(app, controls=controls, figure=fw, message=msg, button=button, measure=measure, redraw=redraw,
           measured=lambda: state["measured"])
    redraw()
    return app
