"""The simulator side of paralab: cost model, memory estimator, event simulator, planner.

Everything here predicts what a run would do without starting processes, and the event simulator
returns the same :class:`paralab.trace.Trace` a measured run produces, so the two can be overlaid.
"""

from paralab.sim.events import simulate_schedule, simulated_bubble

__all__ = ["simulate_schedule", "simulated_bubble"]
