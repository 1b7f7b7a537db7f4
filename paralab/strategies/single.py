"""Single-device training: the baseline every parallel strategy must reproduce step for step."""

from __future__ import annotations

from paralab.strategies.common import GradSync, full_model, train_data_parallel


def train(ctx):
    return train_data_parallel(ctx, full_model(ctx), GradSync(), dp_rank=0, dp_size=1)
