"""The simulator side of paralab: cost model, memory estimator, event simulator, planner.

Everything here predicts what a run would do without starting processes, and the event simulator
returns the same :class:`paralab.trace.Trace` a measured run produces, so the two can be overlaid.
"""

from paralab.sim import context  # noqa: F401  (installs the context-parallel predictions in cost)
from paralab.sim.cost import Prediction, predict, predict_trace
from paralab.sim.events import simulate_schedule, simulated_bubble
from paralab.sim.hardware import get_hardware
from paralab.sim.planner import explain, plan
from paralab.sim.presets import get_model
from paralab.sim.specs import HardwareSpec, ModelSpec, ParallelSpec, SpecError

__all__ = [
    "simulate_schedule", "simulated_bubble", "predict", "predict_trace", "Prediction", "plan", "explain",
    "get_hardware", "get_model", "ModelSpec", "ParallelSpec", "HardwareSpec", "SpecError",
]
