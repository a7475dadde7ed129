"""Samples through the retokenized path with the tiny model's real tokenizer, drift, and verl's DataProto."""

import json

import numpy as np
import polars as pl
import torch
from samples_data import call, calls_frame, rewards_frame, rollouts_frame

from otel_rl.tinymodel import CALC_TOOL
from otel_rl.transforms.export import sft_records, to_dataproto
from otel_rl.transforms.samples import build_samples
from otel_rl.transforms.tokens import measure_drift

SYSTEM = {"role": "system", "content": "You are a calculator agent."}
USER = {"role": "user", "content": "What is 37 + 48?"}
TOOL_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "name": "calc", "arguments": '{"expression": "37+48"}'}],
}
TOOL_RESULT = {"role": "tool", "content": "85", "tool_call_id": "call_1"}
ANSWER = {"role": "assistant", "content": "The answer is 85."}


def calculator_calls(rollout_id: str, tokenizer=None) -> pl.DataFrame:
    """The calculator agent's two calls as normalized messages; with a tokenizer, also their exact ids."""
    turns = [
        ([SYSTEM, USER], TOOL_CALL, "tool_calls"),
        ([SYSTEM, USER, TOOL_CALL, TOOL_RESULT], ANSWER, "stop"),
    ]
    rows = []
    for t, (inputs, output, finish) in enumerate(turns):
        prompt = completion = None
        if tokenizer is not None:
            prompt = encode(tokenizer, inputs, generation_prompt=True)
            full = encode(tokenizer, [*inputs, output])
            completion = full[len(prompt) : -1]  # without the template's newline after <|im_end|>
        rows.append(
            call(
                rollout_id,
                f"{rollout_id}-{t}",
                prompt,
                [completion] if completion is not None else None,
                [[-0.5] * len(completion)] if completion is not None else None,
                t=t,
                finish=[finish],
                messages=inputs,
                outputs=[{**output, "finish_reason": finish}],
                tools=[CALC_TOOL],
            )
        )
    return calls_frame(*rows)


def encode(tokenizer, messages, generation_prompt=False) -> list[int]:
    hf = [
        {**m, "tool_calls": [{"type": "function", "function": c} for c in m["tool_calls"]]}
        if "tool_calls" in m
        else m
        for m in messages
    ]
    text = tokenizer.apply_chat_template(
        hf, tools=[CALC_TOOL], add_generation_prompt=generation_prompt, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_retokenized_calls_merge_into_one_segment_with_the_tool_result_masked(tiny_tokenizer):
    samples, report = build_samples(
        calculator_calls("r1"),
        rollouts_frame(("r1", "g", "ok")),
        rewards_frame(("r1", 1.0)),
        tokenizer=tiny_tokenizer,
    )
    row = samples.row(0, named=True)
    assert samples.height == 1 and row["token_source"] == "retokenized"
    whole = encode(tiny_tokenizer, [SYSTEM, USER, TOOL_CALL, TOOL_RESULT, ANSWER])
    assert row["prompt_ids"] + row["response_ids"] == whole[:-1]  # the final newline is never sampled
    assert row["prompt_ids"] == encode(tiny_tokenizer, [SYSTEM, USER], generation_prompt=True)
    mask = np.array(row["response_mask"], dtype=bool)
    sampled = tiny_tokenizer.decode(np.array(row["response_ids"])[mask])
    masked = tiny_tokenizer.decode(np.array(row["response_ids"])[~mask])
    assert (
        sampled
        == '<tool_call>{"name": "calc", "arguments": {"expression": "37+48"}}</tool_call><|im_end|>'
        + ("The answer is 85.<|im_end|>")
    )
    assert masked == "\n<|im_start|>tool\n85<|im_end|>\n<|im_start|>assistant\n"
    assert not row["has_logprobs"] and set(row["rollout_logprobs"]) == {0.0}
    assert report.token_sources == {"retokenized": 2}


def test_exact_ids_that_match_the_template_give_the_same_samples_and_no_drift(tiny_tokenizer):
    exact = calculator_calls("r1", tiny_tokenizer)
    samples, report = build_samples(
        exact, rollouts_frame(("r1", "g", "ok")), rewards_frame(("r1", 1.0)), tokenizer=tiny_tokenizer
    )
    retokenized, _ = build_samples(
        calculator_calls("r1"),
        rollouts_frame(("r1", "g", "ok")),
        rewards_frame(("r1", 1.0)),
        tokenizer=tiny_tokenizer,
    )
    columns = ["prompt_ids", "response_ids", "response_mask"]
    assert samples.select(columns).rows() == retokenized.select(columns).rows()
    assert samples["token_source"].item() == "exact" and samples["has_logprobs"].item()
    assert (report.drift.compared, report.drift.differing) == (2, 0)


def test_drift_reports_the_share_of_differing_calls_and_the_first_differing_position(tiny_tokenizer):
    exact = calculator_calls("r1", tiny_tokenizer)
    prompts = exact["prompt_token_ids"].to_list()
    prompts[1][7] = 3  # the server saw a different token here
    drift = measure_drift(exact.with_columns(prompt_token_ids=pl.Series(prompts)), tiny_tokenizer, limit=10)
    assert (drift.compared, drift.differing, drift.share, drift.first_diff_positions) == (2, 1, 0.5, [7])


def test_sft_export_writes_each_segments_conversation_in_openai_chat_format(tiny_tokenizer):
    calls = pl.concat([calculator_calls("r1"), calculator_calls("r2")])
    samples, _ = build_samples(
        calls,
        rollouts_frame(("r1", "g", "ok"), ("r2", "g", "ok")),
        rewards_frame(("r1", 1.0), ("r2", 0.0)),
        tokenizer=tiny_tokenizer,
    )
    records = sft_records(samples, calls, min_reward=0.5)
    assert records == [
        {
            "messages": [
                SYSTEM,
                USER,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "calc", "arguments": '{"expression": "37+48"}'},
                        }
                    ],
                },
                TOOL_RESULT,
                ANSWER,
            ],
            "tools": [CALC_TOOL],
        }
    ]
    json.dumps(records)


def test_a_dataproto_from_samples_runs_through_verls_advantage_and_policy_loss():
    from verl.trainer.ppo import core_algos
    from verl.workers.config.actor import ActorConfig

    calls = calls_frame(
        call("r1", "a", [1, 2, 3], [[10, 11]], [[-0.1, -0.2]], t=1),
        call("r1", "b", [1, 2, 3, 10, 11, 4], [[12]], [[-0.3]], t=2),
        call("r2", "c", [1], [[13, 14, 15, 16]], [[-0.4, -0.5, -0.6, -0.7]], t=1),
    )
    samples, _ = build_samples(
        calls, rollouts_frame(("r1", "g", "ok"), ("r2", "g", "ok")), rewards_frame(("r1", 1.0), ("r2", 0.0))
    )
    batch = to_dataproto(samples, pad_token_id=0)
    b = batch.batch
    assert b["prompts"].tolist() == [[1, 2, 3], [0, 0, 1]]
    assert b["responses"].tolist() == [[10, 11, 4, 12], [13, 14, 15, 16]]
    assert b["response_mask"].tolist() == [[1, 1, 0, 1], [1, 1, 1, 1]]
    assert b["attention_mask"].tolist() == [[1] * 7, [0, 0, 1, 1, 1, 1, 1]]
    assert b["position_ids"].tolist() == [list(range(7)), [0, 0, 0, 1, 2, 3, 4]]
    assert b["token_level_scores"].tolist() == [[0, 0, 0, 1.0], [0, 0, 0, 0]]
    assert torch.allclose(
        b["rollout_log_probs"], torch.tensor([[-0.1, -0.2, 0, -0.3], [-0.4, -0.5, -0.6, -0.7]])
    )
    assert list(batch.non_tensor_batch["uid"]) == ["g", "g"]
    assert b["loss_weights"].tolist() == [1.0, 1.0]

    # verl's own GRPO over the batch's uids agrees with the rollout-level advantages
    verl_advantages, _ = core_algos.compute_grpo_outcome_advantage(
        b["token_level_scores"], b["response_mask"], batch.non_tensor_batch["uid"]
    )
    assert torch.allclose(verl_advantages, b["advantages"], atol=1e-5)

    config = ActorConfig(
        strategy="local", rollout_n=2, ppo_micro_batch_size_per_gpu=2, clip_ratio=0.2, use_torch_compile=False
    )
    log_prob = (b["rollout_log_probs"] + 0.05).requires_grad_()
    loss, metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=b["rollout_log_probs"],
        log_prob=log_prob,
        advantages=b["advantages"],
        response_mask=b["response_mask"].float(),
        loss_agg_mode="token-mean",
        config=config,
        rollout_is_weights=b["loss_weights"][:, None] * b["response_mask"],
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_prob.grad).all()
    assert log_prob.grad[b["response_mask"] == 0].abs().sum() == 0
    assert "actor/pg_clipfrac" in metrics
    seq_loss = core_algos.agg_loss(
        -log_prob.detach(), b["response_mask"].float(), "seq-mean-token-mean", global_batch_size=2
    )
    assert torch.isfinite(seq_loss)


def test_a_dataproto_leaves_out_rollout_log_probs_when_a_row_lacks_them():
    calls = calls_frame(call("r1", "a", [1], [[10]], None, t=1), call("r2", "b", [1], [[11]], [[-0.2]], t=1))
    samples, _ = build_samples(
        calls, rollouts_frame(("r1", None, "ok"), ("r2", None, "ok")), rewards_frame(("r1", 1.0), ("r2", 0.0))
    )
    batch = to_dataproto(samples, pad_token_id=0)
    assert "rollout_log_probs" not in batch.batch.keys()  # noqa: SIM118
    assert list(batch.non_tensor_batch["uid"]) == ["r1", "r2"]  # no group: each rollout is its own
