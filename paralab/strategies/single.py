"""Single-device training: the baseline every parallel strategy must reproduce step for step."""

from __future__ import annotations

from paralab.strategies.common import GradSync, full_model, train_model
from paralab.strategies.registry import Strategy


def train(ctx):
    return train_model(ctx, full_model(ctx), GradSync())


STRATEGIES = [Strategy("single", "plain training", axes=(), train=train,
                       title="single device (the baseline)")]
