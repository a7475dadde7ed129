"""Behaviour logprobs that are the policy's on real vLLM: guided and unguided calls through the gateway record
the logprobs transformers gives the sampled tokens on the same weights, and say which kind they recorded."""

import uuid
from collections.abc import Iterator

import numpy as np
import openai
import pytest
import torch
from gateway_server import ADMIN_TOKEN, GatewayServer, teacher_forced
from transformers import AutoModelForCausalLM

from otel_rl.tinymodel import CALC_TOOL

MESSAGES = [{"role": "user", "content": "What is 37 + 48?"}]
TOLERANCE = 1e-3  # float32 on both sides agree to ~1e-6; a grammar's mask moves them by nats
NAMED_CALC = {"type": "function", "function": {"name": "calc"}}
# (request fields, logprobs source, constraints): at temperature 1 and 0 constrained calls are rescored
CALLS = {
    "unguided": ({}, "sampling", None),
    "tool_choice_required": ({"tools": [CALC_TOOL], "tool_choice": "required"}, "rescored", ["tool_choice"]),
    "json_response_format": ({"response_format": {"type": "json_object"}}, "rescored", ["response_format"]),
    "streamed_named_tool": (
        {"tools": [CALC_TOOL], "tool_choice": NAMED_CALC, "stream": True},
        "rescored",
        ["tool_choice"],
    ),
    "penalized_greedy": ({"frequency_penalty": 1.5, "temperature": 0}, "rescored", ["frequency_penalty"]),
}


@pytest.fixture(scope="module")
def gateway(vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    with GatewayServer(tmp_path_factory.mktemp("gateway") / "store.duckdb", vllm=[vllm_server.url]) as server:
        yield server


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def call(gateway: GatewayServer, **fields) -> str:
    """One chat call through the gateway in a rollout of its own (its id returned)."""
    rollout = f"rollout-{uuid.uuid4().hex[:12]}"
    client = openai.OpenAI(
        base_url=gateway.url,
        api_key=ADMIN_TOKEN,
        default_headers={"x-otel-rl-rollout-id": rollout},
        max_retries=0,
    )
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 24, "temperature": 1, "seed": 7} | fields
    response = client.chat.completions.create(**body)
    if fields.get("stream"):
        for _ in response:  # the stream read to its end
            pass
    return rollout


def policy_delta(hf_model, span: dict) -> float:
    """The largest |recorded - transformers| over the call's sampled tokens."""
    [completion] = span["choice_token_ids"]
    expected = teacher_forced(hf_model, span["prompt_token_ids"], completion)
    scored = expected[torch.arange(len(completion)), torch.tensor(completion)].numpy()
    return float(np.max(np.abs(np.asarray(span["choice_logprobs"][0]) - scored)))


def test_guided_and_unguided_calls_record_the_policys_logprobs(gateway, hf_model) -> None:
    rollouts = {name: call(gateway, **fields) for name, (fields, _, _) in CALLS.items()}
    for name, (_, source, constraints) in CALLS.items():
        [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollouts[name]}'")
        assert len(span["choice_token_ids"][0]) > 3, name
        delta = policy_delta(hf_model, span)  # before this was built: 6.5 nats for a forced tool call
        assert delta < TOLERANCE, (name, delta)
        attributes = span["attributes"]
        assert attributes["otel_rl.logprobs.source"] == source, name
        assert attributes["otel_rl.decoding.constrained"] is (constraints is not None), name
        assert attributes.get("otel_rl.decoding.constraints") == constraints, name

    where = ", ".join(f"'{rollout}'" for rollout in rollouts.values())
    columns = "rollout_id, logprobs_source, decoding_constrained"
    rows = gateway.query(f"SELECT {columns} FROM llm_calls WHERE rollout_id IN ({where})").to_pylist()
    by_rollout = {row["rollout_id"]: row for row in rows}
    for name, (_, source, constraints) in CALLS.items():
        row = by_rollout[rollouts[name]]
        assert (row["logprobs_source"], row["decoding_constrained"]) == (source, constraints is not None)


def test_a_constrained_call_that_cannot_be_rescored_is_marked_constrained(gateway, hf_model) -> None:
    """At temperature 0.7 vLLM's logprobs are the scaled distribution's: prompt logprobs cannot give them."""
    rollout = call(gateway, tools=[CALC_TOOL], tool_choice="required", temperature=0.7)
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["attributes"]["otel_rl.logprobs.source"] == "constrained"
    assert span["attributes"]["otel_rl.decoding.constrained"] is True
    [row] = gateway.query(
        f"SELECT logprobs_source, decoding_constrained FROM llm_calls WHERE rollout_id = '{rollout}'"
    ).to_pylist()
    assert row == {"logprobs_source": "constrained", "decoding_constrained": True}
