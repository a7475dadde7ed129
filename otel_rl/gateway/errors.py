"""The errors a model call answers when it fails at the gateway, in OpenAI's shape or its protocol's."""

from typing import Any

import orjson
from starlette.responses import Response

from otel_rl.gateway.protocols import Protocol


class CallError(Exception):
    """A call that fails before or instead of reaching vLLM; turned into an OpenAI-style error response."""

    def __init__(
        self,
        status: int,
        message: str,
        error_type: str,
        retry_after_s: float | None = None,
        *,
        span_error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type  # what the client reads
        self.span_error_type = span_error_type or error_type  # the span's error.type
        self.retry_after_s = retry_after_s

    def response(self, protocol: Protocol | None = None) -> Response:
        """The error response, in `protocol`'s shape when the call came in through one."""
        headers = {"retry-after": str(max(1, round(self.retry_after_s)))} if self.retry_after_s else None
        body = (protocol.error_body if protocol else error_body)(self.status, str(self), self.error_type)
        return Response(body, self.status, headers, "application/json")


def error_body(status: int, message: str, error_type: str) -> bytes:
    """An OpenAI-style error body (what the official client turns into an APIError)."""
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": None, "code": status}})


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise CallError(400, f"the request body is not JSON: {error}", "BadRequestError") from None
    if not isinstance(body, dict):
        raise CallError(400, "the request body must be a JSON object", "BadRequestError")
    return body


def vllm_error(content: bytes) -> tuple[str, str]:
    """The message and type of vLLM's error body (OpenAI's shape), or its start as the message."""
    try:
        error = orjson.loads(content)["error"]
        return str(error["message"]), str(error.get("type") or "APIError")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return content[:500].decode(errors="replace"), "APIError"
