"""Harness APIs that the gateway translates to and from Chat Completions (Anthropic Messages, Responses).

Each API is a module with the same interface (`Protocol` below). The gateway turns a client's request into
a Chat Completions request, sends it to vLLM's `/v1/chat/completions` (which renders it with the model's
chat template and returns the exact prompt and completion token ids), records that as the call, and turns
vLLM's response or stream back into the API's shape.
"""

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any, cast
from typing import Protocol as Interface


class ProtocolError(ValueError):
    """A request that its API does not allow or the gateway cannot translate; the message names the field."""


class ProtocolStream(Interface):
    """vLLM's chat chunks of one call → the API's server-sent events."""

    def __init__(self, request: dict[str, Any]) -> None: ...

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """The events one parsed chat chunk makes (often none)."""
        ...

    def finish(self) -> bytes:
        """The events that close the stream, once vLLM sent `[DONE]`."""
        ...

    def error(self, status: int, message: str, error_type: str) -> bytes:
        """The event that ends the stream with an error (vLLM failed, or a reload aborted the call)."""
        ...


class Protocol(Interface):
    """What a protocol module exposes (a module, not a class: `messages`, `responses`)."""

    API: str  # recorded on the span as otel_rl.gateway.api
    Stream: type[ProtocolStream]

    def chat_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """The client's request → a Chat Completions request; ProtocolError names a bad field."""
        ...

    def response_body(self, chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        """vLLM's `chat.completion` response → the API's response to the client's `request`."""
        ...

    def error_body(self, status: int, message: str, error_type: str) -> bytes:
        """The API's error body; `error_type` is the gateway's OpenAI-style type (`BadRequestError`, ...)."""
        ...


@dataclass(frozen=True)
class Route:
    """A path served by a protocol module, and the header its clients may send the key in (besides
    `Authorization: Bearer`)."""

    module: str
    api_key_header: str | None = None


ROUTES = {
    "/v1/messages": Route("otel_rl.gateway.messages", api_key_header="x-api-key"),  # ANTHROPIC_API_KEY
    "/v1/responses": Route("otel_rl.gateway.responses"),
}


@cache
def protocols() -> dict[str, tuple[Protocol, Route]]:
    """The protocol modules by path (loaded on first use: they import this module for ProtocolError)."""
    return {
        path: (cast(Protocol, importlib.import_module(route.module)), route) for path, route in ROUTES.items()
    }
