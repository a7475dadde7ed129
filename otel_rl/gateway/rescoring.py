"""Behaviour logprobs that are the policy's: which calls vLLM sampled from a constrained distribution, and the
scoring pass that gives the policy's own logprobs of their sampled tokens.

vLLM applies a structured-output grammar (forced tool choice, response formats, `structured_outputs`) to the
logits before its sampler, so even `--logprobs-mode raw_logprobs` returns the masked distribution's logprobs;
logit biases, bad words, allowed tokens, min_tokens and penalties run inside the sampler, before the processed
logprobs the gateway records. For such a call the gateway asks the same server for the `prompt_logprobs` of
prompt + completion, which vLLM computes from the model's logits alone (docs/gateway.md).
"""

import logging
from typing import Any

import orjson

from otel_rl.gateway.client import UpstreamClient, UpstreamError
from otel_rl.gateway.outputs import CallOutput

log = logging.getLogger(__name__)

# otel_rl.logprobs.source: what the recorded logprobs are
SAMPLING = "sampling"  # vLLM's logprobs of the distribution it sampled from, which is the policy's
RESCORED = "rescored"  # the policy's own, from the scoring pass (the call was constrained)
CONSTRAINED = "constrained"  # the constrained distribution's: not the policy's, kept out of importance ratios

# Structured-output request fields (vLLM 0.32's `structured_outputs` and the older `guided_*` spellings).
GUIDED_FIELDS = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
)
# Fields whose presence with these neutral values leaves the distribution alone.
NEUTRAL = {"repetition_penalty": 1, "frequency_penalty": 0, "presence_penalty": 0, "min_tokens": 0}


def constraints(sent: dict[str, Any]) -> list[str]:
    """The fields of a request body, as sent to vLLM, that make it sample from another distribution than the
    policy's at the call's temperature (top_k, top_p and min_p are the sampling convention, not these)."""
    found = []
    tool_choice = sent.get("tool_choice")
    if sent.get("tools") and (tool_choice == "required" or isinstance(tool_choice, dict)):
        found.append("tool_choice")
    response_format = sent.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        found.append("response_format")
    found += [name for name in GUIDED_FIELDS if sent.get(name)]
    found += [name for name in ("logit_bias", "allowed_token_ids", "bad_words") if sent.get(name)]
    found += [
        name
        for name, neutral in NEUTRAL.items()
        if isinstance(sent.get(name), int | float) and sent[name] != neutral
    ]
    return found


def rescorable(sent: dict[str, Any], output: CallOutput | None) -> bool:
    """Whether the scoring pass gives logprobs in the recorded convention, for known token ids: the policy's
    at temperature 1 (vLLM's processed logprobs at temperature 1, and its greedy ones, are unscaled)."""
    temperature = sent.get("temperature")
    if temperature is not None and temperature not in (0, 1):
        return False
    return (
        output is not None
        and output.prompt_token_ids is not None
        and bool(output.choices)
        and all(choice.token_ids and choice.logprobs is not None for choice in output.choices)
    )


def scoring_body(model: str | None, output: CallOutput) -> dict[str, Any]:
    """One completions request scoring each choice: prompt + its tokens, one generated token (the least vLLM
    accepts), the prompt's logprobs of the tokens as they are (0 alternatives)."""
    prompt = output.prompt_token_ids or []
    body: dict[str, Any] = {
        "prompt": [prompt + (choice.token_ids or []) for choice in output.choices],
        "max_tokens": 1,
        "prompt_logprobs": 0,
        "temperature": 0,
    }
    if model is not None:
        body["model"] = model
    return body


def scored_logprobs(response: dict[str, Any], output: CallOutput) -> list[list[float]]:
    """Each choice's tokens' logprobs read from the scoring response; ValueError when it lacks one."""
    start = len(output.prompt_token_ids or [])
    by_index = {choice.get("index"): choice for choice in response.get("choices") or ()}
    scored = []
    for i, choice in enumerate(output.choices):
        entries = (by_index.get(i) or {}).get("prompt_logprobs")
        tokens = choice.token_ids or []
        if not isinstance(entries, list) or len(entries) != start + len(tokens):
            raise ValueError(f"the scoring response has no prompt logprobs for choice {i}")
        try:
            scored.append([float(entries[start + k][str(t)]["logprob"]) for k, t in enumerate(tokens)])
        except (KeyError, TypeError) as error:
            raise ValueError(f"the scoring response lacks a token of choice {i}: {error!r}") from None
    return scored


async def policy_logprobs(
    client: UpstreamClient, server_url: str, sent: dict[str, Any], output: CallOutput, timeout_s: float
) -> str:
    """The logprobs source of a finished call; a constrained call's choices get the policy's logprobs in place
    when the scoring pass on `server_url` (the server that sampled it, under the same weights) succeeds."""
    if not constraints(sent):
        return SAMPLING
    if not rescorable(sent, output):
        return CONSTRAINED
    try:
        status, content = await client.request(
            "POST",
            f"{server_url}/v1/completions",
            timeout_s=timeout_s,
            json=scoring_body(sent.get("model"), output),
        )
        if status != 200:
            raise ValueError(f"HTTP {status}: {content[:300]!r}")
        scored = scored_logprobs(orjson.loads(content), output)
    except (UpstreamError, ValueError) as error:  # orjson.JSONDecodeError is a ValueError
        log.warning("scoring a constrained call failed, its logprobs are marked constrained: %s", error)
        return CONSTRAINED
    for choice, logprobs in zip(output.choices, scored, strict=True):
        choice.logprobs = logprobs
    return RESCORED
