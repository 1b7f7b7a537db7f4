"""Launching ranks (from Python, a notebook, or under torchrun) and collecting what they measured."""

from paralab.runtime.result import RunError, RunResult

__all__ = ["RunError", "RunResult"]
