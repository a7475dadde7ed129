"""Bounds on what one model call may ask of the server, and the rule for URLs in media parts.

Every request field that costs memory or time (choices, tokens, logprobs, messages, tools, stop sequences,
media) is checked against `RequestLimits` before the call is translated or forwarded; a field over its
limit is refused with a message naming the field, the limit and the setting that raises it. The gateway
fetches nothing for a caller: a media URL reaches vLLM (which would fetch it) only when its scheme and host
are in `allowed_media_urls`; a `data:` URL is bounded in size.
"""

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from otel_rl.gateway.protocols import ProtocolError

SETTING = "--request-limits"  # the `otel-rl serve` flag that sets RequestLimits (JSON)
DEFAULT_PORTS = {"http": 80, "https": 443}
# A host as every URL parser reads it the same way: a DNS name, an IPv4 address or a bracketed IPv6 one.
# Anything else (userinfo, backslashes, percent-escapes) is where parsers disagree on the host.
NETLOC = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


class RequestLimits(BaseModel):
    """What one call may ask for; the admin sets any of them with `--request-limits '{"max_n": 4}'`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_n: int = Field(16, ge=1, description="`n` and `best_of`: choices generated per call")
    max_tokens: int = Field(
        131_072,
        ge=1,
        description="`max_tokens`, `max_completion_tokens`, `max_output_tokens`, `min_tokens` and thinking "
        "budgets",
    )
    max_logprobs: int = Field(
        20,
        ge=0,
        description="`logprobs` (Completions), `top_logprobs`, `prompt_logprobs`, `logprob_token_ids`",
    )
    max_messages: int = Field(
        10_000, ge=1, description="`messages` (Chat, Messages), `input` items (Responses), `documents`"
    )
    max_content_parts: int = Field(
        100_000,
        ge=1,
        description="content parts, blocks and tool calls of a call's messages together; `system` blocks",
    )
    max_tools: int = Field(1_000, ge=0, description="`tools` (a Responses namespace counts its functions)")
    max_stop_sequences: int = Field(
        16, ge=0, description="`stop` / `stop_sequences` strings, and `bad_words`"
    )
    max_stop_chars: int = Field(256, ge=1, description="characters of one stop sequence or bad word")
    max_token_ids: int = Field(
        2_048, ge=0, description="`stop_token_ids`, `allowed_token_ids`, `logit_bias` entries"
    )
    max_prompt_tokens: int = Field(131_072, ge=1, description="a Completions `prompt` given as token ids")
    max_schema_bytes: int = Field(
        65_536, ge=1, description="`response_format`, `structured_outputs`, `text.format` as JSON"
    )
    max_media_parts: int = Field(16, ge=0, description="image, audio and video parts of a call")
    max_data_url_bytes: int = Field(8 * 1024 * 1024, ge=0, description="one `data:` URL of a media part")
    allowed_media_urls: tuple[str, ...] = Field(
        (), description="`scheme://host[:port]` that media URLs may name (vLLM fetches them); none by default"
    )

    @field_validator("allowed_media_urls")
    @classmethod
    def _origins(cls, given: tuple[str, ...]) -> tuple[str, ...]:
        for entry in given:
            parts = urlsplit(entry)
            if not (parts.scheme and parts.hostname and NETLOC.fullmatch(parts.netloc)) or parts.path not in (
                "",
                "/",
            ):
                raise ValueError(f"{entry!r} is not scheme://host or scheme://host:port")
            if parts.scheme.lower() == "data":
                raise ValueError("data: URLs are always accepted up to max_data_url_bytes")
        return tuple(entry.lower().rstrip("/") for entry in given)


class RequestRefused(ProtocolError):
    """A request field over its limit, or a media part the gateway does not forward (HTTP 400)."""


# A rule checks one field's value (`where` is its path in the client's request); a string instead of a
# rule says why the field needs no bound of its own.
Rule = Callable[[Any, str, RequestLimits], None]
Fields = dict[str, Rule | str]


def over(where: str, what: str, limit: str, limits: RequestLimits) -> RequestRefused:
    return RequestRefused(
        f"`{where}` {what}, over this gateway's limit of {getattr(limits, limit)} "
        f"(request_limits.{limit}, set with {SETTING})"
    )


def integer(limit: str, low: int = 0) -> Rule:
    """An integer from `low` to the limit (a string or float would be converted by vLLM: refused)."""

    def check(value: Any, where: str, limits: RequestLimits) -> None:
        if value is None:
            return
        if type(value) is not int:
            raise RequestRefused(f"`{where}` must be an integer")
        if value < low:
            raise RequestRefused(f"`{where}` must be at least {low}")
        if value > getattr(limits, limit):
            raise over(where, f"is {value}", limit, limits)

    return check


def count(limit: str) -> Rule:
    """A list (or object) of at most the limit's items; its items are checked elsewhere or cost nothing."""

    def check(value: Any, where: str, limits: RequestLimits) -> None:
        if isinstance(value, list | dict) and len(value) > getattr(limits, limit):
            raise over(where, f"has {len(value)} items", limit, limits)

    return check


def stop_strings(value: Any, where: str, limits: RequestLimits) -> None:
    """Stop sequences or bad words: a string or a list of them, counted and each bounded in length."""
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list):
        return  # vLLM refuses other types
    count("max_stop_sequences")(strings, where, limits)
    for i, string in enumerate(strings):
        if isinstance(string, str) and len(string) > limits.max_stop_chars:
            at = where if isinstance(value, str) else f"{where}[{i}]"
            raise over(at, f"has {len(string)} characters", "max_stop_chars", limits)


def schema(value: Any, where: str, limits: RequestLimits) -> None:
    """A JSON schema, grammar or regex that vLLM compiles: bounded in serialized size."""
    if value is None:
        return
    try:
        size = len(orjson.dumps(value))
    except orjson.JSONEncodeError:
        raise RequestRefused(f"`{where}` is nested too deep") from None
    if size > limits.max_schema_bytes:
        raise over(where, f"is {size} bytes of JSON", "max_schema_bytes", limits)


def refused(reason: str) -> Rule:
    def check(value: Any, where: str, limits: RequestLimits) -> None:
        if value is not None:
            raise RequestRefused(f"`{where}` is not accepted by this gateway: {reason}")

    return check


def check_fields(fields: Fields, body: dict[str, Any], limits: RequestLimits) -> None:
    """Every rule of `fields` on the body's value (the body's other keys are not read)."""
    for name, rule in fields.items():
        if not isinstance(rule, str) and name in body:
            rule(body[name], name, limits)


class MediaBudget:
    """Counts one call's content parts and media parts while its messages are walked."""

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits
        self.parts = 0
        self.media = 0

    def add_parts(self, n: int, where: str) -> None:
        self.parts += n
        if self.parts > self.limits.max_content_parts:
            what = f"brings the call to {self.parts} content parts"
            raise over(where, what, "max_content_parts", self.limits)

    def media_part(self, where: str) -> None:
        self.media += 1
        if self.media > self.limits.max_media_parts:
            raise over(where, f"is media part {self.media} of the call", "max_media_parts", self.limits)

    def media_url(self, url: Any, where: str) -> None:
        """One media part and its URL: a bounded `data:` URL, or a URL of an allowed scheme and host."""
        self.media_part(where)
        if not isinstance(url, str):
            raise RequestRefused(f"`{where}` must be a URL string")
        if url[:5].lower() == "data:":
            self.data(url, where)
            return
        problem = url_problem(url, self.limits.allowed_media_urls)
        if problem is not None:
            raise RequestRefused(
                f"`{where}`: the gateway fetches no URL for a caller: {problem}; send the media inline as a "
                f"data: URL (the admin may allow origins in request_limits.allowed_media_urls, {SETTING})"
            )

    def data(self, data: Any, where: str) -> None:
        """Inline media (a data: URL, base64 audio), bounded in size."""
        if isinstance(data, str) and len(data) > self.limits.max_data_url_bytes:
            raise over(where, f"is {len(data)} bytes", "max_data_url_bytes", self.limits)


def url_problem(url: str, allowed: tuple[str, ...]) -> str | None:
    """Why `url` may not be fetched, or None when its scheme and host (and port) are allowed."""
    if any(c.isspace() or ord(c) < 32 or c == "\\" for c in url[:4096]) or len(url) > 4096:
        return "the URL has spaces, control characters or backslashes, or is over 4096 characters"
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if not NETLOC.fullmatch(parts.netloc):
        return f"a {scheme or 'schemeless'} URL whose host is not a plain name or address is never fetched"
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        return "the URL's port is not a number"
    origin = (scheme, parts.hostname, port)
    for entry in allowed:
        given = urlsplit(entry)
        if (given.scheme, given.hostname, given.port or DEFAULT_PORTS.get(given.scheme)) == origin:
            return None
    return f"{scheme}://{parts.netloc} is not an allowed origin"
