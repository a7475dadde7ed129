"""Which calls are constrained, and a constrained call whose scoring pass fails: marked, never passed off as
the policy's logprobs (real gateway, the fake vLLM, which answers the scoring request without prompt
logprobs). The scoring itself runs on real vLLM in test_gateway_vllm_logprobs.py."""

import uuid
from collections.abc import Iterator

import openai
import pytest
from fake_vllm import MODEL, FakeVLLM
from gateway_server import ADMIN_TOKEN, GatewayServer

from otel_rl.gateway.rescoring import constraints
from otel_rl.tinymodel import CALC_TOOL

TOOLS = {"tools": [CALC_TOOL]}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, []),
        ({**TOOLS, "tool_choice": "auto"}, []),
        ({**TOOLS, "tool_choice": "none"}, []),
        ({"tool_choice": "required"}, []),  # no tools: vLLM has nothing to force
        ({**TOOLS, "tool_choice": "required"}, ["tool_choice"]),
        ({**TOOLS, "tool_choice": {"type": "function", "function": {"name": "calc"}}}, ["tool_choice"]),
        ({"response_format": {"type": "text"}}, []),
        ({"response_format": {"type": "json_object"}}, ["response_format"]),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, ["response_format"]),
        ({"structured_outputs": {"regex": "[0-9]+"}}, ["structured_outputs"]),
        ({"guided_choice": ["a", "b"]}, ["guided_choice"]),
        ({"logit_bias": {"5": 10}}, ["logit_bias"]),
        ({"logit_bias": {}}, []),
        ({"allowed_token_ids": [1, 2]}, ["allowed_token_ids"]),
        ({"bad_words": ["no"]}, ["bad_words"]),
        ({"min_tokens": 4}, ["min_tokens"]),
        ({"min_tokens": 0, "repetition_penalty": 1.0, "frequency_penalty": 0, "presence_penalty": 0.0}, []),
        ({"repetition_penalty": 1.2, "presence_penalty": 0.5}, ["repetition_penalty", "presence_penalty"]),
        ({"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.1}, []),  # the sampling convention
    ],
)
def test_constraints_are_the_fields_that_change_the_sampled_distribution(fields, expected) -> None:
    assert constraints(fields) == expected


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    with (
        FakeVLLM() as fake,
        GatewayServer(tmp_path_factory.mktemp("rescoring") / "store.duckdb", vllm=[fake.base_url]) as server,
    ):
        yield server


@pytest.mark.parametrize("stream", [False, True])
def test_a_constrained_call_whose_scoring_fails_is_marked_constrained(gateway, stream) -> None:
    rollout = f"rollout-{uuid.uuid4().hex[:12]}"
    client = openai.OpenAI(
        base_url=gateway.url,
        api_key=ADMIN_TOKEN,
        max_retries=0,
        default_headers={"x-otel-rl-rollout-id": rollout},
    )
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        stream=stream,
        logit_bias={"5": 3},
    )
    if stream:
        assert [chunk for chunk in response]  # the client's answer is whole whatever the scoring does
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["status_code"] == 0 and span["choice_logprobs"]
    attributes = span["attributes"]
    assert attributes["otel_rl.logprobs.source"] == "constrained"
    assert (attributes["otel_rl.decoding.constrained"], attributes["otel_rl.decoding.constraints"]) == (
        True,
        ["logit_bias"],
    )
