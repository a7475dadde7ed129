"""Typed settings of the gateway (inference servers, per-split sampling, reload and timeout bounds)."""

from typing import Annotated, Any
from urllib.parse import SplitResult, urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from otel_rl.gateway.limits import RequestLimits

# What the trainer assumes for train rollouts: samples from the policy's full distribution, so that the
# recorded logprobs are the policy's (top_k -1 = off, as vLLM spells it).
DEFAULT_SPLIT_SAMPLING: dict[str, dict[str, Any]] = {"train": {"temperature": 1.0, "top_p": 1.0, "top_k": -1}}

SERVER_URL_FORMS = "http://HOST:PORT or http://HOST:PORT/v1 (https too)"
# The paths a server URL may end with: the server's root, or the OpenAI base URL users copy from a client.
ROOT_PATHS = ("", "/", "/v1", "/v1/")


def server_root(url: str, *, given_as: str = "--vllm") -> str:
    """A vLLM server's root URL (`http://host:port`) from the URL a user gives for it (`given_as`).

    The gateway appends `/v1/chat/completions` and `/health` to it, so any other path (`/v1/v1/...`) or
    part that would be dropped or misread is refused here rather than failing every call later.
    """
    parts = urlsplit(url.strip())
    problem = _url_problem(url.strip(), parts)
    if problem is not None:
        raise ValueError(f"{given_as} {url!r}: {problem}; give the server's URL as {SERVER_URL_FORMS}")
    return f"{parts.scheme}://{parts.netloc}"


def _url_problem(url: str, parts: SplitResult) -> str | None:
    if parts.scheme not in ("http", "https"):
        return "it does not start with http:// or https://"
    if not parts.hostname:
        return "it names no host"
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        return "its port is not a number from 0 to 65535"
    if parts.username is not None or parts.password is not None:
        return "it holds credentials"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return "it has a query or a fragment"
    if parts.path not in ROOT_PATHS:
        return f"its path {parts.path!r} is neither / nor /v1"
    return None


class GatewaySettings(BaseModel):
    """How the gateway routes, samples, records and reloads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Base URLs of vLLM servers; each is normalized to the server's root (see server_root).
    servers: tuple[Annotated[str, AfterValidator(server_root)], ...] = ()
    # Sampling parameters forced per split (the rollout's `otel_rl.split`); other splits send the client's.
    split_sampling: dict[str, dict[str, Any]] = Field(default_factory=lambda: dict(DEFAULT_SPLIT_SAMPLING))
    # One model call (a long generation is legitimate); also how long a call waits for a server to answer
    # its connect when every server is down.
    upstream_timeout_s: float = Field(600.0, gt=0)
    connect_timeout_s: float = Field(5.0, gt=0)
    health_interval_s: float = Field(2.0, gt=0)
    pause_wait_s: float = 30.0  # how long a new request waits for a reload before 503 + Retry-After
    # Rollouts and training share the devices: at each update the servers sleep (weights and KV cache
    # released) while the trainer runs, and wake with the new weights (gateway/colocated.py).
    colocated: bool = False
    drain_timeout_s: float = 30.0  # how long a reload waits for in-flight calls before aborting them
    reload_timeout_s: float = Field(300.0, gt=0)  # one server's reload_weights / load_lora_adapter
    forward_otlp: str | None = None  # also send the gateway's spans to this OTLP/HTTP traces endpoint
    span_flush_ms: int = 50  # batch delay of the span exporter (the trainer waits for spans)
    # One call's request body: a coding agent's turn carries its whole conversation (a Codex turn is ~50 KB
    # and grows), far below this; the bound is what the gateway holds in memory per call before parsing.
    max_request_bytes: int = Field(32 * 1024 * 1024, gt=0)
    # What one call may ask for (choices, tokens, messages, media...), checked before it is translated or
    # forwarded (docs/security.md#what-one-model-call-may-ask-for).
    request_limits: RequestLimits = RequestLimits()
