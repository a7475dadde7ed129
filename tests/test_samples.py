"""Samples from hand-built rollouts: exact ids, masks, logprobs, rewards, advantages, weights, limits."""

import math

import numpy as np
import polars as pl
import pytest
from samples_data import call, calls_frame, rewards_frame, rollouts_frame

from otel_rl.transforms.limits import Limits
from otel_rl.transforms.rewards import RewardSpec
from otel_rl.transforms.samples import SampleOptions, break_line, build_samples


def build(calls, rollouts, rewards, **options):
    return build_samples(calls, rollouts, rewards, options=SampleOptions(**options))


def one(samples: pl.DataFrame, **where) -> dict:
    rows = samples.filter(**where).to_dicts()
    assert len(rows) == 1, rows
    return rows[0]


def test_single_turn_is_one_segment_with_every_response_token_sampled():
    samples, report = build(
        calls_frame(call("r1", "s1", [1, 2, 3], [[10, 11, 12]], [[-0.5, -0.25, -0.125]], t=1, version=7)),
        rollouts_frame(("r1", "g", "ok")),
        rewards_frame(("r1", 1.0)),
    )
    row = one(samples, rollout_id="r1")
    assert row["prompt_ids"] == [1, 2, 3]
    assert row["response_ids"] == [10, 11, 12]
    assert row["response_mask"] == [1, 1, 1]
    assert row["rollout_logprobs"] == [-0.5, -0.25, -0.125]
    assert row["has_logprobs"] and row["token_source"] == "exact"
    assert (row["policy_version_min"], row["policy_version_max"], row["n_calls"]) == (7, 7, 1)
    assert (row["reward"], row["loss_weight"], row["span_ids"]) == (1.0, 1.0, ["s1"])
    assert (report.rollouts, report.rollouts_used, report.calls, report.calls_used, report.segments) == (
        1,
        1,
        1,
        1,
        1,
    )
    assert (report.prompt_tokens, report.response_tokens, report.sampled_tokens) == (3, 3, 3)
    assert report.token_sources == {"exact": 1}


def test_multi_turn_tool_results_join_the_response_masked_with_zero_logprobs():
    calls = calls_frame(
        call("r1", "s1", [1, 2], [[10, 11]], [[-0.1, -0.2]], t=1, version=3),
        # the tool result (20, 21) and template glue (22) arrive in the second prompt
        call("r1", "s2", [1, 2, 10, 11, 20, 21, 22], [[30, 31]], [[-0.3, -0.4]], t=2, version=4),
    )
    samples, _ = build(calls, rollouts_frame(("r1", "g", "ok")), rewards_frame(("r1", 1.0)))
    row = one(samples, rollout_id="r1")
    assert row["prompt_ids"] == [1, 2]
    assert row["response_ids"] == [10, 11, 20, 21, 22, 30, 31]
    assert row["response_mask"] == [1, 1, 0, 0, 0, 1, 1]
    assert np.allclose(row["rollout_logprobs"], [-0.1, -0.2, 0, 0, 0, -0.3, -0.4])
    assert (row["n_calls"], row["policy_version_min"], row["policy_version_max"]) == (2, 3, 4)
    assert row["span_ids"] == ["s1", "s2"]


def test_a_prefix_break_starts_a_new_segment_and_the_rollout_still_weighs_one():
    calls = calls_frame(
        call("r1", "s1", [1, 2], [[10]], [[-0.1]], t=1),
        # the harness rewrote its history: 10 is gone, so this call cannot extend the first segment
        call("r1", "s2", [1, 2, 99, 20], [[30]], [[-0.3]], t=2),
    )
    samples, report = build(calls, rollouts_frame(("r1", "g", "ok")), rewards_frame(("r1", 1.0)))
    assert samples.select("prompt_ids", "response_ids", "response_mask").rows() == [
        ([1, 2], [10], [1]),
        ([1, 2, 99, 20], [30], [1]),
    ]
    assert samples["loss_weight"].to_list() == [0.5, 0.5]
    assert samples["segment_id"].to_list() == ["r1:0", "r1:1"]
    # The report counts the call that did not merge and says where its prompt left the previous context.
    assert report.unmerged_calls == 1
    assert report.first_break == {"span_id": "s2", "position": 2, "expected": 10, "found": 99}


def test_the_report_names_the_first_token_a_re_rendered_answer_changed(tiny_tokenizer):
    answer = tiny_tokenizer.encode('<tool_call>\n{"name": "calc"}</tool_call>')
    prompt = tiny_tokenizer.encode("What is 37 + 48?")
    # The chat template renders the model's own answer back without its newline, as some templates do.
    rendered = tiny_tokenizer.encode('<tool_call>{"name": "calc"}</tool_call>')
    calls = calls_frame(
        call("r1", "s1", prompt, [answer], [[-0.1] * len(answer)], t=1),
        call("r1", "s2", prompt + rendered + prompt, [[5]], [[-0.2]], t=2),
        call("r1", "s3", prompt + rendered + prompt + [5, 6], [[7]], [[-0.3]], t=3),
    )
    samples, report = build_samples(
        calls,
        rollouts_frame(("r1", "g", "ok")),
        rewards_frame(("r1", 1.0)),
        tokenizer=tiny_tokenizer,
        options=SampleOptions(drift_sample=0),
    )
    assert samples.height == 2 and report.unmerged_calls == 1  # s3 extends s2; s2 could not extend s1
    diverged = next(i for i, (a, b) in enumerate(zip(answer, rendered, strict=False)) if a != b)
    assert report.first_break["span_id"] == "s2"
    assert report.first_break["position"] == len(prompt) + diverged
    assert "\n" in report.first_break["expected_text"]
    line = break_line(report)
    assert line.startswith("1 started a segment of their own")
    assert f"call s2 at prompt token {len(prompt) + diverged}" in line
    assert repr(report.first_break["expected_text"]) in line


def test_interleaved_agents_make_one_segment_each():
    calls = calls_frame(
        call("r1", "a1", [1, 2], [[10]], [[-0.1]], t=1),
        call("r1", "b1", [5, 6], [[50]], [[-0.5]], t=2),
        call("r1", "a2", [1, 2, 10, 3], [[11]], [[-0.2]], t=3),
        call("r1", "b2", [5, 6, 50, 7], [[51]], [[-0.6]], t=4),
    )
    samples, report = build(calls, rollouts_frame(("r1", "g", "ok")), rewards_frame(("r1", 1.0)))
    assert samples.select("span_ids", "prompt_ids", "response_ids", "response_mask").rows() == [
        (["a1", "a2"], [1, 2], [10, 3, 11], [1, 0, 1]),
        (["b1", "b2"], [5, 6], [50, 7, 51], [1, 0, 1]),
    ]
    assert samples["loss_weight"].sum() == pytest.approx(1.0)
    assert report.calls_used == 4


def test_a_retried_identical_call_is_kept_once():
    calls = calls_frame(
        call("r1", "s1", [1, 2], [[10]], [[-0.1]], t=1),
        call("r1", "s1-retry", [1, 2], [[10]], [[-0.1]], t=2),
        call("r1", "s2", [1, 2, 10, 3], [[11]], [[-0.2]], t=3),
    )
    samples, report = build(calls, rollouts_frame(("r1", "g", "ok")), rewards_frame(("r1", 1.0)))
    row = one(samples, rollout_id="r1")
    assert row["response_ids"] == [10, 3, 11] and row["response_mask"] == [1, 0, 1]
    assert row["span_ids"] == ["s1", "s2"]
    assert report.dropped_calls == {"duplicate_call": 1}


def test_n_2_choices_are_sibling_segments_and_the_next_call_extends_the_one_it_continues():
    calls = calls_frame(
        call("r1", "s1", [1, 2], [[10, 11], [12]], [[-0.1, -0.2], [-0.3]], t=1),
        # the agent went on with the second answer
        call("r1", "s2", [1, 2, 12, 3], [[13]], [[-0.4]], t=2),
    )
    samples, _ = build(calls, rollouts_frame(("r1", "g", "ok")), rewards_frame(("r1", 1.0)))
    assert samples.select(
        "span_ids", "choice_indices", "prompt_ids", "response_ids", "response_mask"
    ).rows() == [
        (["s1"], [0], [1, 2], [10, 11], [1, 1]),
        (["s1", "s2"], [1, 0], [1, 2], [12, 3, 13], [1, 0, 1]),
    ]
    assert np.allclose(samples["rollout_logprobs"][1].to_list(), [-0.3, 0.0, -0.4])
    assert samples["loss_weight"].to_list() == [0.5, 0.5]


def test_a_failed_model_call_excludes_the_rollout_as_an_infrastructure_failure():
    calls = calls_frame(
        call("r1", "s1", [1, 2], [[10]], [[-0.1]], t=1),
        call("r1", "s2", [1, 2, 10, 3], None, t=2, is_error=True, finish=[]),
        call("r2", "s3", [1, 2], [[10]], [[-0.1]], t=1),
    )
    rollouts = rollouts_frame(("r1", "g", "ok"), ("r2", "g", "ok"))
    samples, report = build(calls, rollouts, rewards_frame(("r1", 0.0), ("r2", 1.0)))
    assert samples["rollout_id"].to_list() == ["r2"]
    assert report.dropped_rollouts == {"model_call_failed": 1}


def test_with_skip_error_calls_an_error_call_and_an_aborted_choice_are_left_out():
    calls = calls_frame(
        call("r1", "s1", [1, 2], [[10]], [[-0.1]], t=1),
        call("r1", "s2", [1, 2, 10, 3], None, t=2, is_error=True, finish=[]),
        call("r1", "s3", [1, 2, 10, 3], [[11], [12]], [[-0.2], [-0.3]], t=3, finish=["abort", "stop"]),
    )
    samples, report = build(
        calls, rollouts_frame(("r1", "g", "ok")), rewards_frame(("r1", 1.0)), skip_error_calls=True
    )
    row = one(samples, rollout_id="r1")
    assert (row["response_ids"], row["response_mask"], row["span_ids"]) == (
        [10, 3, 12],
        [1, 0, 1],
        ["s1", "s3"],
    )
    assert row["choice_indices"] == [0, 1]
    assert report.dropped_calls == {"model_call_failed": 1, "aborted_choice": 1}


def test_infrastructure_failures_are_excluded_not_scored_zero():
    calls = calls_frame(*(call(r, f"s-{r}", [1, 2], [[10]], [[-0.1]], t=1) for r in ("r1", "r2", "r3", "r4")))
    rollouts = rollouts_frame(
        ("r1", "g", "ok"), ("r2", "g", "ok"), ("r3", "g", "timeout"), ("r4", "g", "crashed")
    )
    rewards = rewards_frame(("r1", 1.0), ("r2", 0.0), ("r3", 0.0))
    samples, report = build(calls, rollouts, rewards, estimator="grpo_no_std")
    assert sorted(samples["rollout_id"]) == ["r1", "r2"]
    assert report.dropped_rollouts == {"status_crashed": 1, "status_timeout": 1}
    # the group baseline is the mean of the two scored rollouts only
    assert dict(samples.select("rollout_id", "advantage").iter_rows()) == {"r1": 0.5, "r2": -0.5}
    assert report.reward_by_group == {"g": {"rollouts": 2, "mean_reward": 0.5}}


def test_a_rollout_without_reward_is_dropped_unless_a_fill_value_is_given():
    calls = calls_frame(
        call("r1", "s1", [1], [[10]], [[-0.1]], t=1), call("r2", "s2", [1], [[11]], [[-0.1]], t=1)
    )
    rollouts = rollouts_frame(("r1", "g", "ok"), ("r2", "g", "ok"))
    samples, report = build(calls, rollouts, rewards_frame(("r1", 1.0)))
    assert samples["rollout_id"].to_list() == ["r1"]
    assert report.dropped_rollouts == {"missing_reward": 1}
    filled, report = build(calls, rollouts, rewards_frame(("r1", 1.0)), reward=RewardSpec(missing=0.0))
    assert dict(filled.select("rollout_id", "reward").iter_rows()) == {"r1": 1.0, "r2": 0.0}
    assert report.dropped_rollouts == {}


def test_only_trusted_sources_and_the_chosen_name_count_and_the_rule_combines_them():
    calls = calls_frame(call("r1", "s1", [1], [[10]], [[-0.1]], t=1))
    rollouts = rollouts_frame(("r1", "g", "ok"))
    rewards = pl.concat(
        [
            rewards_frame(("r1", 0.2), ("r1", 0.8), ("r1", 0.5)),
            rewards_frame(
                ("r1", 100.0), source="harness"
            ),  # the policy's own process: not trusted by default
            rewards_frame(("r1", 50.0), name="style"),
        ]
    )
    expected = {"last": 0.5, "mean": 0.5, "max": 0.8, "sum": 1.5}
    for rule, value in expected.items():
        samples, _ = build(calls, rollouts, rewards, reward=RewardSpec(rule=rule))
        assert samples["reward"].item() == pytest.approx(value), rule
    samples, _ = build(calls, rollouts, rewards, reward=RewardSpec(trusted_sources=("harness",)))
    assert samples["reward"].item() == 100.0
    samples, _ = build(calls, rollouts, rewards, reward=RewardSpec(name="style"))
    assert samples["reward"].item() == 50.0


def test_turn_rewards_stay_on_the_last_token_of_their_call():
    calls = calls_frame(
        call("r1", "s1", [1, 2], [[10, 11]], [[-0.1, -0.2]], t=1),
        call("r1", "s2", [1, 2, 10, 11, 3], [[12]], [[-0.3]], t=2),
    )
    rewards = pl.concat(
        [
            rewards_frame(("r1", 1.0)),
            rewards_frame(("r1", 0.25)).with_columns(level=pl.lit("turn"), span_id=pl.lit("s1")),
        ]
    )
    samples, _ = build(calls, rollouts_frame(("r1", "g", "ok")), rewards)
    assert samples["turn_rewards"].to_list() == [[{"position": 1, "value": 0.25}]]


def test_truncation_cuts_ids_mask_and_logprobs_and_counts_what_was_cut():
    calls = calls_frame(
        call("r1", "s1", [1, 2], [[10, 11]], [[-0.1, -0.2]], t=1),
        call("r1", "s2", [1, 2, 10, 11, 3, 4], [[12, 13]], [[-0.3, -0.4]], t=2),
        call("r2", "s3", [1, 2, 3, 4, 5, 6], [[10]], [[-0.1]], t=1),
    )
    samples, report = build(
        calls,
        rollouts_frame(("r1", "g", "ok"), ("r2", "g", "ok")),
        rewards_frame(("r1", 1.0), ("r2", 1.0)),
        limits=Limits(max_prompt_length=4, max_response_length=5),
    )
    row = one(samples, rollout_id="r1")
    assert (row["response_ids"], row["response_mask"]) == ([10, 11, 3, 4, 12], [1, 1, 0, 0, 1])
    assert np.allclose(row["rollout_logprobs"], [-0.1, -0.2, 0, 0, -0.3])
    assert row["truncated"]
    assert report.cut == {"response_truncated": 1, "response_tokens_cut": 1}
    assert report.dropped_segments == {"prompt_too_long": 1}
    assert report.dropped_rollouts == {"no_samples": 1}


def test_stale_segments_are_dropped():
    calls = calls_frame(
        call("r1", "s1", [1], [[10]], [[-0.1]], t=1, version=5),
        call("r2", "s2", [1], [[11]], [[-0.1]], t=1, version=8),
    )
    samples, report = build(
        calls,
        rollouts_frame(("r1", "g", "ok"), ("r2", "g", "ok")),
        rewards_frame(("r1", 1.0), ("r2", 0.0)),
        current_policy_version=10,
        max_staleness=2,
    )
    assert samples["rollout_id"].to_list() == ["r2"]
    assert report.dropped_segments == {"stale": 1}


def test_a_stale_rollout_never_shapes_its_group_s_baseline():
    # r3 was sampled 5 versions before the policy being trained (max 2): it is dropped before the group's
    # advantages are computed, so r1 and r2 are scored against each other only (mean 0.5), not against a
    # baseline r3's reward raised to 2/3.
    calls = calls_frame(
        call("r1", "s1", [1], [[10]], [[-0.1]], t=1, version=9),
        call("r2", "s2", [1], [[11]], [[-0.1]], t=1, version=9),
        call("r3", "s3", [1], [[12]], [[-0.1]], t=1, version=5),
    )
    samples, report = build(
        calls,
        rollouts_frame(("r1", "g", "ok"), ("r2", "g", "ok"), ("r3", "g", "ok")),
        rewards_frame(("r1", 1.0), ("r2", 0.0), ("r3", 1.0)),
        current_policy_version=10,
        max_staleness=2,
    )

    advantages = dict(samples.select("rollout_id", "advantage").iter_rows())
    fresh_pair = 0.5 / (math.sqrt(0.5) + 1e-6)  # grpo over (1, 0): (r - 0.5) / std
    assert advantages == pytest.approx({"r1": fresh_pair, "r2": -fresh_pair}, abs=1e-5)
    assert report.dropped_rollouts == {"stale": 1} and report.dropped_segments == {"stale": 1}
    assert report.reward_by_group == {"g": {"rollouts": 2, "mean_reward": 0.5}}


def test_group_advantages_match_a_hand_computation_over_rollouts_not_segments():
    # r1 splits into two segments: it must still count once in its group's statistics
    calls = calls_frame(
        call("r1", "a", [1], [[10]], [[-0.1]], t=1),
        call("r1", "b", [2], [[10]], [[-0.1]], t=2),
        call("r2", "c", [1], [[10]], [[-0.1]], t=1),
        call("r3", "d", [1], [[10]], [[-0.1]], t=1),
        call("r4", "e", [1], [[10]], [[-0.1]], t=1),
        call("r5", "f", [1], [[10]], [[-0.1]], t=1),
    )
    rollouts = rollouts_frame(
        ("r1", "g1", "ok"), ("r2", "g1", "ok"), ("r3", "g1", "ok"), ("r4", "g2", "ok"), ("r5", "g2", "ok")
    )
    rewards = rewards_frame(("r1", 1.0), ("r2", 0.0), ("r3", 0.0), ("r4", 2.0), ("r5", 1.0))
    g1, g2 = [1.0, 0.0, 0.0], [2.0, 1.0]
    mean1, mean2 = sum(g1) / 3, sum(g2) / 2
    std1 = math.sqrt(sum((x - mean1) ** 2 for x in g1) / 2)  # unbiased, as torch.std
    std2 = math.sqrt(sum((x - mean2) ** 2 for x in g2) / 1)
    expected = {
        "grpo": [(x - mean1) / (std1 + 1e-6) for x in g1] + [(x - mean2) / (std2 + 1e-6) for x in g2],
        "grpo_no_std": [x - mean1 for x in g1] + [x - mean2 for x in g2],
        # leave-one-out: r_i - mean of the others
        "rloo": [g1[i] - (sum(g1) - g1[i]) / 2 for i in range(3)]
        + [g2[i] - (sum(g2) - g2[i]) for i in range(2)],
    }
    for estimator, values in expected.items():
        samples, _ = build(calls, rollouts, rewards, estimator=estimator)
        per_rollout = dict(samples.group_by("rollout_id").agg(pl.col("advantage").first()).iter_rows())
        assert [per_rollout[r] for r in ("r1", "r2", "r3", "r4", "r5")] == pytest.approx(values, abs=1e-5), (
            estimator
        )
        assert samples.filter(rollout_id="r1")["advantage"].n_unique() == 1


def test_each_rollouts_loss_weights_sum_to_one():
    calls = calls_frame(
        call("r1", "a", [1], [[10]], [[-0.1]], t=1),
        call("r1", "b", [2], [[11]], [[-0.1]], t=2),
        call("r1", "c", [3], [[12]], [[-0.1]], t=3),
        call("r2", "d", [1], [[10], [11]], [[-0.1], [-0.2]], t=1),
        call("r3", "e", [1], [[10]], [[-0.1]], t=1),
    )
    rollouts = rollouts_frame(("r1", "g", "ok"), ("r2", "g", "ok"), ("r3", "g", "ok"))
    samples, _ = build(calls, rollouts, rewards_frame(("r1", 1.0), ("r2", 0.0), ("r3", 1.0)))
    weights = dict(
        samples.group_by("rollout_id")
        .agg(pl.col("loss_weight").sum(), pl.len())
        .select("rollout_id", "loss_weight")
        .iter_rows()
    )
    assert weights == pytest.approx({"r1": 1.0, "r2": 1.0, "r3": 1.0})
    assert samples.filter(rollout_id="r1")["loss_weight"].to_list() == pytest.approx([1 / 3] * 3)


def test_unknown_logprobs_are_zero_and_flagged():
    samples, _ = build(
        calls_frame(call("r1", "s1", [1, 2], [[10, 11]], None, t=1)),
        rollouts_frame(("r1", "g", "ok")),
        rewards_frame(("r1", 1.0)),
    )
    row = one(samples, rollout_id="r1")
    assert row["rollout_logprobs"] == [0.0, 0.0] and not row["has_logprobs"]


def test_constrained_logprobs_are_kept_out_and_rescored_ones_kept_and_both_counted():
    """A constrained call's logprobs are not the policy's (the gateway's scoring pass failed): unknown;
    rescored ones are the policy's. Both calls count in `constrained_calls` and the report's sources."""
    samples, report = build(
        calls_frame(
            call("r1", "s1", [1, 2], [[10, 11]], [[-0.5, -0.25]], t=1),
            call("r1", "s2", [1, 2, 10, 11, 3], [[12]], [[-2.0]], t=2, logprobs_source="constrained"),
            call("r2", "s3", [1, 2], [[13]], [[-0.75]], t=3, logprobs_source="rescored"),
        ),
        rollouts_frame(("r1", "g", "ok"), ("r2", "g", "ok")),
        rewards_frame(("r1", 1.0), ("r2", 0.0)),
    )
    first, second = one(samples, rollout_id="r1"), one(samples, rollout_id="r2")
    assert not first["has_logprobs"] and first["constrained_calls"] == 1 and first["n_calls"] == 2
    assert (
        second["has_logprobs"] and second["rollout_logprobs"] == [-0.75] and second["constrained_calls"] == 1
    )
    assert report.logprobs_sources == {"constrained": 1, "rescored": 1, "sampling": 1}


def test_no_selected_rollouts_give_no_samples_and_an_empty_report():
    samples, report = build(calls_frame(), rollouts_frame(), rewards_frame())
    assert samples.height == 0 and samples.columns[:3] == ["segment_id", "rollout_id", "attempt_id"]
    assert (report.rollouts, report.calls, report.segments, report.dropped_rollouts) == (0, 0, 0, {})
