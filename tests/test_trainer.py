"""The local trainer: verl's losses on real batches, gradient accumulation, SFT, checkpoints vLLM reloads."""

import json
import random
import sys
from pathlib import Path

import httpx
import polars as pl
import pytest
import torch
from test_vllm import reload_weights  # vLLM's run-time reload through its dev endpoints
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner
from verl.trainer.ppo.core_algos import (
    compute_grpo_outcome_advantage,
    compute_policy_loss_vanilla,
    kl_penalty,
)

from otel_rl.cli import app
from otel_rl.train.config import ConfigError, config_from_dict, load_config
from otel_rl.train.sft import sft_batches, tokenize_chat
from otel_rl.train.trainer import Trainer
from otel_rl.train.worker import TrainerProcess
from otel_rl.transforms.advantages import rollout_advantages
from otel_rl.transforms.export import to_dataproto

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
import calc_task  # noqa: E402

REWARDS = {"g1": [1.0, 0.0, 0.0, 1.0], "g2": [1.0, 1.0, 0.0, 0.0]}


def settings(model: Path, **overrides) -> dict:
    return {"model": str(model), "torch_threads": 1, "seed": 0, **overrides}


def expert_chat(task: dict, rng: random.Random) -> dict:
    """One transcript of the noisy scripted expert (what stage 1 of the demo fine-tunes on)."""
    messages = [{"role": "user", "content": task["question"]}]
    messages.append(calc_task.expert_reply(messages, rng))
    if messages[-1].get("tool_calls"):
        expression = json.loads(messages[-1]["tool_calls"][0]["function"]["arguments"])["expression"]
        a, op, b = expression[:2], expression[2], expression[3:]
        messages.append({"role": "tool", "content": str(calc_task.OPERATORS[op](int(a), int(b)))})
        messages.append(calc_task.expert_reply(messages, rng))
    return {"messages": messages}


@pytest.fixture(scope="module")
def samples(tiny_tokenizer) -> pl.DataFrame:
    """Eight rollouts in two GRPO groups, as otel_rl.transforms makes them: calculator prompts, tool-call
    answers, one multi-turn response whose tool-result tokens are masked out."""
    rng = random.Random(0)
    tasks = calc_task.sample_tasks(calc_task.split_problems(0)[0], 8, "train", seed=0)
    rows = []
    for i, task in enumerate(tasks):
        group = "g1" if i < 4 else "g2"
        prompt = tiny_tokenizer.apply_chat_template(
            [{"role": "user", "content": task["question"]}], add_generation_prompt=True
        )["input_ids"]
        answer = tiny_tokenizer(f"The answer is {rng.randint(10, 999)}.<|im_end|>")["input_ids"]
        response, mask = answer, [1] * len(answer)
        if i == 0:  # call, tool result (not sampled: mask 0), final answer
            call = tiny_tokenizer('<tool_call>{"name": "calc"}</tool_call><|im_end|>')["input_ids"]
            result = tiny_tokenizer("\n<|im_start|>tool\n85<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
            response = call + result + answer
            mask = [1] * len(call) + [0] * len(result) + [1] * len(answer)
        rows.append(
            {
                "segment_id": f"s{i}",
                "rollout_id": f"r{i}",
                "group_id": group,
                "prompt_ids": prompt,
                "response_ids": response,
                "response_mask": mask,
                "reward": REWARDS[group][i % 4],
                "loss_weight": 1.0,
            }
        )
    frame = pl.DataFrame(rows)
    advantages = rollout_advantages(frame.select("rollout_id", "group_id", "reward"), "grpo")
    return frame.join(advantages.select("rollout_id", "advantage"), on="rollout_id")


def with_logprobs(samples: pl.DataFrame, logprobs: torch.Tensor | None) -> pl.DataFrame:
    """The samples with `rollout_logprobs` (as the gateway records them) from a padded tensor, or none."""
    if logprobs is None:
        empty = pl.Series([[]] * samples.height, dtype=pl.List(pl.Float64))
        return samples.with_columns(rollout_logprobs=empty, has_logprobs=pl.lit(False))
    lengths = samples["response_ids"].list.len().to_list()
    values = [logprobs[i, :n].tolist() for i, n in enumerate(lengths)]
    masks = samples["response_mask"].to_list()
    masked = [
        [v * m for v, m in zip(row, mask, strict=True)] for row, mask in zip(values, masks, strict=True)
    ]
    return samples.with_columns(rollout_logprobs=pl.Series(masked), has_logprobs=pl.lit(True))


def current_logprobs(trainer: Trainer, batch) -> torch.Tensor:
    tensors = {key: batch.batch[key] for key in ("input_ids", "attention_mask", "position_ids", "responses")}
    with torch.no_grad():
        return trainer.response_logprobs(trainer.model, tensors)


def test_one_step_on_a_fixed_batch_lowers_verl_ppo_loss_on_that_batch(
    tiny_model_dir, samples, tiny_tokenizer
):
    trainer = Trainer(config_from_dict(settings(tiny_model_dir, optim={"lr": 1e-3})))
    on_policy = to_dataproto(with_logprobs(samples, None), tiny_tokenizer.pad_token_id)
    before = current_logprobs(trainer, on_policy)
    batch = to_dataproto(with_logprobs(samples, before), tiny_tokenizer.pad_token_id)
    mask = batch.batch["response_mask"].float()
    actor = trainer.actor_config

    metrics = trainer.step(batch)
    after = current_logprobs(trainer, batch)
    loss_before, _ = compute_policy_loss_vanilla(
        before, before, batch.batch["advantages"], mask, config=actor
    )
    loss_after, _ = compute_policy_loss_vanilla(before, after, batch.batch["advantages"], mask, config=actor)
    assert loss_after < loss_before - 1e-3
    assert metrics["mismatch"] < 1e-6  # the recorded logprobs were this very policy's
    assert metrics["response_tokens"] == mask.sum().item()


def test_advantages_and_loss_equal_verls_functions_on_the_same_tensors(
    tiny_model_dir, samples, tiny_tokenizer
):
    """Two micro-batches of 3 and one of 2, off-policy samples (served logprobs differ), then a KL step."""
    config = settings(tiny_model_dir, optim={"lr": 1e-3, "micro_batch_size": 3})
    config["algorithm"] = {"rollout_is": "token", "rollout_is_threshold": 2.0, "kl_coef": 0.5}
    trainer = Trainer(config_from_dict(config))
    probe = to_dataproto(with_logprobs(samples, None), tiny_tokenizer.pad_token_id)
    own = current_logprobs(trainer, probe)
    served = own + torch.linspace(-1.0, 1.0, own.numel()).reshape(own.shape)  # stale / mismatched sampling
    batch = to_dataproto(with_logprobs(samples, served), tiny_tokenizer.pad_token_id)
    tensors = batch.batch
    mask = tensors["response_mask"].float()

    advantages, _ = compute_grpo_outcome_advantage(
        tensors["token_level_scores"], tensors["response_mask"], batch.non_tensor_batch["uid"]
    )
    torch.testing.assert_close(tensors["advantages"], advantages, atol=1e-6, rtol=0)

    served = tensors["rollout_log_probs"]
    is_weights = torch.exp(own - served).clamp(max=2.0) * mask  # truncated importance sampling, by hand
    expected, _ = compute_policy_loss_vanilla(
        own, own, tensors["advantages"], mask, config=trainer.actor_config, rollout_is_weights=is_weights
    )
    metrics = trainer.step(batch)
    assert metrics["loss"] == pytest.approx(expected.item(), abs=1e-6)
    assert metrics["mismatch"] == pytest.approx(
        ((own - served).abs() * mask).sum().item() / mask.sum().item()
    )
    assert metrics["kl_loss"] == pytest.approx(0.0, abs=1e-7)  # still the reference policy

    # Second step: the policy moved, so the KL to the starting (reference) policy counts.
    now = current_logprobs(trainer, batch)
    is_weights = torch.exp(now - served).clamp(max=2.0) * mask
    pg, _ = compute_policy_loss_vanilla(
        now, now, tensors["advantages"], mask, config=trainer.actor_config, rollout_is_weights=is_weights
    )
    kl = (kl_penalty(now, own, "low_var_kl") * mask).sum() / mask.sum()
    metrics = trainer.step(batch)
    assert metrics["kl_loss"] == pytest.approx(kl.item(), abs=1e-6) and kl > 0
    assert metrics["loss"] == pytest.approx(pg.item() + 0.5 * kl.item(), abs=1e-6)


def test_gradient_accumulation_gives_the_same_update_as_one_full_batch(
    tiny_model_dir, samples, tiny_tokenizer
):
    batch = to_dataproto(with_logprobs(samples, None), tiny_tokenizer.pad_token_id)
    trainers = [
        Trainer(config_from_dict(settings(tiny_model_dir, optim={"lr": 1e-3, "micro_batch_size": size})))
        for size in (2, 8)
    ]
    losses = [trainer.step(batch)["loss"] for trainer in trainers]
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    # the accumulated gradients (Adam's first step, ~lr·sign(g), would amplify float noise in tiny entries)
    for a, b in zip(trainers[0].model.parameters(), trainers[1].model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4)


def test_a_trainer_resumed_from_its_checkpoint_continues_exactly_as_one_never_stopped(
    tiny_model_dir, samples, tiny_tokenizer, tmp_path
):
    batch = to_dataproto(with_logprobs(samples, None), tiny_tokenizer.pad_token_id)
    config = config_from_dict(settings(tiny_model_dir, optim={"lr": 1e-3, "warmup_steps": 3}))
    uninterrupted = Trainer(config)
    uninterrupted.step(batch)
    uninterrupted.save(tmp_path / "step-1")
    uninterrupted.save_state(tmp_path / "step-1")
    resumed = Trainer(config.model_copy(update={"model": tmp_path / "step-1"}))
    resumed.load_state(tmp_path / "step-1")
    fresh_optimizer = Trainer(config.model_copy(update={"model": tmp_path / "step-1"}))
    second = [trainer.step(batch) for trainer in (uninterrupted, resumed, fresh_optimizer)]
    assert second[1]["lr"] == second[0]["lr"] != second[2]["lr"]  # the warm-up schedule went on
    for a, b in zip(uninterrupted.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)
    drift = max((a - c).abs().max().item() for a, c in zip(
        uninterrupted.model.parameters(), fresh_optimizer.model.parameters(), strict=True
    ))  # fmt: skip
    assert drift > 1e-5  # without the optimizer state the update differs (Adam's moments restart)


def test_a_trainer_in_its_own_process_updates_and_saves_exactly_like_one_in_this_process(
    tiny_model_dir, samples, tiny_tokenizer, tmp_path
):
    batch = to_dataproto(with_logprobs(samples, None), tiny_tokenizer.pad_token_id)
    config = config_from_dict(settings(tiny_model_dir, optim={"lr": 1e-3}))
    here = Trainer(config)
    there = TrainerProcess(config)
    try:
        assert there.pad_token_id == tiny_tokenizer.pad_token_id
        assert there.step(batch) == here.step(batch)
        saved = there.save(tmp_path / "step-1")
        assert there.save_state(saved).name == "trainer_state.pt"
    finally:
        there.close()
    reloaded = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    for a, b in zip(here.model.parameters(), reloaded.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_sft_masks_cover_exactly_the_assistant_turns_and_training_lowers_their_loss(tiny_model_dir):
    rng = random.Random(1)
    tasks = calc_task.sample_tasks(calc_task.split_problems(0)[0], 16, "train", seed=1)
    chats = [expert_chat(task, rng) for task in tasks]
    config = settings(tiny_model_dir, steps=12, optim={"lr": 3e-3, "warmup_steps": 2, "schedule": "cosine"})
    trainer = Trainer(config_from_dict(config))

    multi_turn = next(chat for chat in chats if len(chat["messages"]) == 4)
    ids, mask = tokenize_chat(trainer.tokenizer, multi_turn)
    trained_text = trainer.tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    call = json.loads(multi_turn["messages"][1]["tool_calls"][0]["function"]["arguments"])
    assert trained_text == (
        f'<tool_call>{{"name": "calc", "arguments": {json.dumps(call)}}}</tool_call><|im_end|>'
        f"{multi_turn['messages'][3]['content']}<|im_end|>"
    )

    batches = sft_batches(trainer.tokenizer, chats, batch_size=8, seed=0)
    fixed = next(batches)
    losses = [trainer.sft_step(*fixed)["loss"] for _ in range(12)]
    assert losses[-1] < 0.7 * losses[0]


def test_a_checkpoint_it_writes_reloads_in_vllm_changes_greedy_output_and_matches_its_logprobs(
    vllm_server, tiny_model_dir, tmp_path
):
    trainer = Trainer(config_from_dict(settings(tiny_model_dir, optim={"lr": 3e-3})))
    prompt = trainer.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 37 + 48?"}], add_generation_prompt=True
    )["input_ids"]

    def complete(**params) -> dict:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "logprobs": 1, "return_token_ids": True}
        response = httpx.post(f"{vllm_server.url}/v1/completions", json=body | params, timeout=120)
        response.raise_for_status()
        return response.json()["choices"][0]

    before = complete(temperature=0, ignore_eos=True)["token_ids"]
    target = trainer.tokenizer("The answer is 85.<|im_end|>")["input_ids"]
    ids = torch.tensor([prompt + target])
    loss_mask = torch.tensor([[0] * len(prompt) + [1] * len(target)])
    for _ in range(15):
        trainer.sft_step(ids, torch.ones_like(ids), loss_mask)
    checkpoint = trainer.save(tmp_path / "step-1")
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "tokenizer.json").is_file()
    try:
        reload_weights(vllm_server, checkpoint)
        after = complete(temperature=0)["token_ids"]
        reloaded = AutoModelForCausalLM.from_pretrained(checkpoint)
        assert after != before
        assert after[: len(target)] == target  # what the trainer taught it
        with torch.no_grad():
            expected = reloaded.generate(torch.tensor([prompt]), max_new_tokens=len(after), do_sample=False)
        assert expected[0, len(prompt) :].tolist() == after

        sampled = complete(temperature=1.0, seed=3)
        served = sampled["logprobs"]["token_logprobs"]
        frame = pl.DataFrame(
            {
                "segment_id": ["s"],
                "rollout_id": ["r"],
                "group_id": ["g"],
                "prompt_ids": [prompt],
                "response_ids": [sampled["token_ids"]],
                "response_mask": [[1] * len(served)],
                "rollout_logprobs": [served],
                "has_logprobs": [True],
                "reward": [1.0],
                "advantage": [0.0],
                "loss_weight": [1.0],
            }
        )
        metrics = trainer.step(to_dataproto(frame, trainer.tokenizer.pad_token_id))
        assert metrics["mismatch"] < 1e-4  # float32 vLLM and the float32 trainer agree on every token
    finally:
        reload_weights(vllm_server, tiny_model_dir)  # the session's server serves the base weights


def test_config_errors_name_the_field_and_the_problem(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("model: m\noptim: {lr: -1, micro_batchsize: 4}\nalgorithm: {policy_loss: nope}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert "optim.lr: Input should be greater than 0" in message
    assert "optim.micro_batchsize: Extra inputs are not permitted" in message

    path.write_text("model: m\nalgorithm: {policy_loss: nope}\n")
    result = CliRunner().invoke(app, ["train", "--config", str(path), "--offline"])
    assert result.exit_code == 1 and "algorithm.policy_loss: Unsupported loss mode: nope" in result.output

    path.write_text("model: m\n")
    result = CliRunner().invoke(app, ["train", "--config", str(path), "--offline"])
    assert result.exit_code == 1 and "offline RL needs a rollout filter" in result.output
    assert load_config(path, {"offline": {"where": "true"}}).offline.where == "true"


def test_sft_command_fine_tunes_on_a_chat_jsonl_file(tiny_model_dir, tmp_path):
    rng = random.Random(2)
    tasks = calc_task.sample_tasks(calc_task.split_problems(0)[0], 8, "train", seed=2)
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(expert_chat(task, rng)) + "\n" for task in tasks))
    config = tmp_path / "sft.yaml"
    config.write_text(
        f"model: {tiny_model_dir}\noutput_dir: {tmp_path / 'out'}\nsteps: 3\noffline: {{sft_batch_size: 4}}\n"
    )

    result = CliRunner().invoke(app, ["train", "--config", str(config), "--sft", "--chats", str(chats)])
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3] and all(m["loss"] > 0 for m in metrics)
    assert (tmp_path / "out" / "step-3" / "model.safetensors").is_file()


def test_a_step_whose_mismatch_is_above_the_setting_warns_naming_the_worst_calls(
    tiny_model_dir, tiny_tokenizer, samples, caplog
):
    """Recorded logprobs that are not the policy's (a constrained call's, say) raise the mismatch: the step
    names the calls, rollout and span, with the largest; an on-policy step stays quiet."""
    trainer = Trainer(config_from_dict(settings(tiny_model_dir, steps=2)))
    spans = [["call-0a", "call-0b"]] + [[f"call-{i}"] for i in range(1, samples.height)]
    named = samples.with_columns(span_ids=pl.Series(spans))
    pad = tiny_tokenizer.pad_token_id
    with caplog.at_level("WARNING", logger="otel_rl.train.correction"):
        own = current_logprobs(trainer, to_dataproto(with_logprobs(named, None), pad))
        trainer.step(to_dataproto(with_logprobs(named, own), pad))
        assert not caplog.records

        own = current_logprobs(trainer, to_dataproto(with_logprobs(named, None), pad))
        served = own.clone()
        mask = to_dataproto(with_logprobs(named, None), pad).batch["response_mask"].bool()
        answer_of_0 = mask[0].nonzero().flatten()[-3:]  # row 0's last run: its second call's answer
        served[0, answer_of_0] -= 6.4
        served[3][mask[3]] -= 2.0
        metrics = trainer.step(to_dataproto(with_logprobs(named, served), pad))
    assert metrics["mismatch"] > 0.1
    [record] = caplog.records
    message = record.getMessage()
    assert "above algorithm.mismatch_warning 0.1" in message
    first, second = message.index("rollout r0 span call-0b"), message.index("rollout r3 span call-3")
    assert first < second and "call-0a" not in message
