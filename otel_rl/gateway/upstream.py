"""The request the gateway sends to vLLM, and the response the client gets back from it.

The gateway asks vLLM for token ids and logprobs on every call and forces the sampling parameters of the
rollout's split; the client still receives exactly what it asked for: fields it did not request are set to
null, as vLLM itself writes them when they were not requested.
"""

import codecs
from dataclasses import dataclass
from typing import Any

# Private module: httpx-sse 0.4.3 (pinned, requirements.lock) exports no incremental decoder publicly
from httpx_sse._decoders import SSEDecoder, SSELineDecoder

# The request fields that decide what is sampled: recorded as `otel_rl.sampling.params`.
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "n",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "logprobs",
    "top_logprobs",
    "response_format",
    "structured_outputs",
)


@dataclass(frozen=True)
class ClientAsked:
    """Which of the fields the gateway adds the client asked for itself (those it keeps)."""

    logprobs: bool
    token_ids: bool

    @property
    def everything(self) -> bool:
        return self.logprobs and self.token_ids


def upstream_body(
    operation: str, body: dict[str, Any], forced: dict[str, Any], model: str | None
) -> tuple[dict[str, Any], ClientAsked]:
    """The body to send to vLLM for a client's `body`, and what the client asked for.

    `forced` are the sampling parameters of the rollout's split; `model` replaces the model name when the
    policy is a LoRA adapter (vLLM serves it under its adapter name).
    """
    if operation == "chat":
        asked = ClientAsked(logprobs=bool(body.get("logprobs")), token_ids=bool(body.get("return_token_ids")))
    else:  # completions: `logprobs` is the number of top logprobs; 0 still returns the sampled token's
        asked = ClientAsked(
            logprobs=body.get("logprobs") is not None, token_ids=bool(body.get("return_token_ids"))
        )
    sent = dict(body)
    if not asked.logprobs:
        sent["logprobs"] = True if operation == "chat" else 0
    sent["return_token_ids"] = True
    sent.update(forced)
    if model is not None:
        sent["model"] = model
    return sent, asked


def sampling_params(sent: dict[str, Any]) -> dict[str, Any]:
    """The sampling parameters of a request body as sent."""
    return {name: sent[name] for name in SAMPLING_FIELDS if name in sent}


def strip_response(response: dict[str, Any], asked: ClientAsked) -> dict[str, Any]:
    """Null the fields of a response (or of one stream chunk) that the client did not ask for, in place."""
    if not asked.token_ids and "prompt_token_ids" in response:
        response["prompt_token_ids"] = None
    for choice in response.get("choices") or ():
        if not asked.token_ids:
            if "token_ids" in choice:
                choice["token_ids"] = None
            if "prompt_token_ids" in choice:
                choice["prompt_token_ids"] = None
        if not asked.logprobs and "logprobs" in choice:
            choice["logprobs"] = None
    return response


class SSEEvents:
    """Reads a byte stream of server-sent events into the `data` of each complete event, as the SSE format
    says: lines end in CRLF, LF or CR; an event's `data:` lines join with a newline; comments are skipped.

    httpx-sse's decoders do the reading: the library's public API reads httpx responses, and the gateway's
    upstream client is aiohttp (its chunks are fed here), so its line and event decoders are used directly
    (its exact version is pinned).
    """

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")()  # a character may be split across reads
        self._lines = SSELineDecoder()
        self._events = SSEDecoder()

    def feed(self, data: bytes) -> list[str]:
        """The data of the events that `data` completes."""
        text = self._text.decode(data)
        if not text:
            return []
        payloads = []
        for line in self._lines.decode(text):
            event = self._events.decode(line)
            if event is not None and event.data:
                payloads.append(event.data)
        return payloads
