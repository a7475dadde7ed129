"""Curation by difficulty probes: each task's trusted rewards in the store (store/reads.py `probe_outcomes`)
decide whether it trains (mixed outcomes, and a capped share of always-fail tasks), and tasks of an
evaluation set's repositories never do."""

import random
from dataclasses import dataclass

import polars as pl

from otel_rl.coding.tasks import Task


@dataclass(frozen=True)
class Curation:
    mixed: list[Task]
    always_fail: list[Task]  # the capped share kept
    excluded_repos: list[Task]  # tasks of an evaluation set's repository
    audit: list[Task]  # a flagged rollout of it passed: a person looks before it trains
    dropped: dict[str, str]  # instance_id -> why it does not train (always pass, unprobed, over the cap)

    @property
    def selected(self) -> list[Task]:
        return [*self.mixed, *self.always_fail]


def curate(
    tasks: list[Task], outcomes: pl.DataFrame, *, always_fail_share: float, eval_repos: set[str], seed: int
) -> Curation:
    """Mixed-outcome tasks (0 < passes < probes), plus always-fail ones up to `always_fail_share` of the
    selection (drawn with `seed`); tasks whose `repo` is an evaluation set's are left out first, then tasks a
    flagged rollout passed go to the audit list."""
    if not 0.0 <= always_fail_share < 1.0:
        raise ValueError(f"always-fail share {always_fail_share}: between 0 and 1 (1 excluded)")
    counts = {
        row["task_id"]: (row["probes"], row["passes"], row["flagged_passes"])
        for row in outcomes.iter_rows(named=True)
    }
    mixed, failing, excluded, audit, dropped = [], [], [], [], {}
    for task in tasks:
        probes, passes, flagged_passes = counts.get(task.instance_id, (0, 0, 0))
        if task.repo in eval_repos:
            excluded.append(task)
        elif flagged_passes:
            audit.append(task)
        elif probes == 0:
            dropped[task.instance_id] = "no probe with a trusted reward"
        elif passes == probes:
            dropped[task.instance_id] = f"always passes ({passes}/{probes})"
        elif passes == 0:
            failing.append(task)
        else:
            mixed.append(task)
    # share = f / (mixed + f)  =>  f = share * mixed / (1 - share)
    cap = int(always_fail_share * len(mixed) / (1.0 - always_fail_share))
    kept = sorted(random.Random(seed).sample(failing, min(cap, len(failing))), key=tasks.index)
    for task in failing:
        if task not in kept:
            dropped[task.instance_id] = f"always fails, over the {always_fail_share:g} share"
    return Curation(mixed, kept, excluded, audit, dropped)
