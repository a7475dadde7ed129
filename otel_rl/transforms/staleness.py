"""The one staleness rule: how many policy versions behind the weights being trained a sample was drawn.

A policy version is the gateway's number for the weights it serves (`otel_rl.policy.version` on every call it
records): version N is the weights after N updates. An online step trains the weights of the version served
while its groups ran, and produces the next one. A sample (a segment, a rollout, a group) was drawn at the
oldest version of its calls (`policy_version_min`); it is `trained - that` versions behind, and too stale to
train on when that is more than `max_staleness` (train.algorithm.max_staleness). A sample whose calls
recorded no version is of unknown age: it is kept. The trainer (launcher, samples), resume and the web view
all judge staleness with these two functions.
"""

from __future__ import annotations

import polars as pl


def versions_behind(sampled: pl.Expr, trained: int | pl.Expr) -> pl.Expr:
    """How many policy versions the weights being trained (`trained`) are ahead of those that sampled."""
    return trained - sampled


def fresh(sampled: pl.Expr, trained: int | pl.Expr, max_staleness: int) -> pl.Expr:
    """Whether a sample drawn at version `sampled` may train policy version `trained` (unknown: yes)."""
    return sampled.is_null() | (versions_behind(sampled, trained) <= max_staleness)
