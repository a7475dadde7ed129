"""One staleness rule (transforms/staleness.py), as the launcher, resume and the web view apply it."""

from datetime import UTC, datetime

import polars as pl

from otel_rl.train.groups import reusable_groups, stale_groups
from otel_rl.ui.routes import staleness


def test_a_group_is_stale_once_its_oldest_call_is_more_than_max_staleness_versions_behind():
    versions = {"same": 4, "one_behind": 3, "two_behind": 2, "unknown": None}

    assert stale_groups(versions, trained=4, max_staleness=1) == {"two_behind"}
    assert stale_groups(versions, trained=4, max_staleness=0) == {"one_behind", "two_behind"}


def test_resume_and_the_launcher_agree_on_which_groups_are_fresh():
    ended = datetime(2026, 1, 1, tzinfo=UTC)
    rows = pl.DataFrame(
        {
            "group_id": ["same", "one_behind", "two_behind", "unknown"],
            "status": ["ok"] * 4,
            "policy_version_min": [4, 3, 2, None],
            "ended_at": [ended] * 4,
        }
    )
    versions = dict(rows.select("group_id", "policy_version_min").iter_rows())
    for max_staleness in (0, 1, 2):
        reused = reusable_groups(rows, consumed=set(), group_size=1, trained=4, max_staleness=max_staleness)
        stale = stale_groups(versions, trained=4, max_staleness=max_staleness)
        assert set(reused) == set(rows["group_id"]) - stale


def test_the_web_view_counts_versions_behind_the_policy_each_step_trained():
    # a step span records the version it produced: step 1 trained version 4 and produced 5
    versions = pl.DataFrame(
        {"step": [1, 1, 2], "policy_version": [5, 5, 6], "policy_version_min": [4, 2, 5]},
        schema={"step": pl.Int32, "policy_version": pl.Int32, "policy_version_min": pl.Int64},
    )

    chart = staleness(versions)

    assert chart.to_dicts() == [
        {"step": 1, "max_lag": 2, "mean_lag": 1.0, "rollouts": 2},
        {"step": 2, "max_lag": 0, "mean_lag": 0.0, "rollouts": 1},
    ]
    # the lag the chart shows is what the trainer judges: a lag of 2 is stale with max_staleness 1
    assert stale_groups({"lag2": 2}, trained=4, max_staleness=1) == {"lag2"}
