"""Requests that would cost the server memory or time, or make vLLM fetch a URL, sent with a rollout key as
a harness would send them to a real `otel-rl serve` (the vLLM-style fake behind it): each is answered 400 at
once in its API's error shape, naming the field and the limit, nothing reaches vLLM, and the server keeps
serving. The admin's `--request-limits` moves a limit and allows media origins."""

import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_vllm import MODEL, FakeVLLM
from otel_rl_server import OTEL_RL, ServerProcess

MAX_N = 4  # set by this module's server; every other limit keeps its default
ALLOWED_ORIGIN = "https://images.example.com"
METADATA = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
REFUSAL_S = 5.0  # a refusal is a few milliseconds; today's code forwarded n=1,000,000 and hung for minutes
PIXEL = (  # a 1x1 PNG
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLM]:
    with FakeVLLM() as server:
        yield server


@pytest.fixture(scope="module")
def served(fake: FakeVLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("limits")
    limits = json.dumps({"max_n": MAX_N, "allowed_media_urls": [ALLOWED_ORIGIN]})
    flags = ("--vllm", fake.base_url, "--request-limits", limits)
    server = ServerProcess(workdir / "otel_rl.duckdb", workdir, flags=flags).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def key(served: ServerProcess) -> str:
    """A harness's credential: a rollout key, not the admin token."""
    response = httpx.post(
        f"{served.http_url}/v1/admin/rollouts/limits-{uuid.uuid4().hex[:8]}/key",
        headers=served.auth,
        timeout=10,
    )
    response.raise_for_status()
    return response.json()["key"]


def send(served: ServerProcess, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{served.http_url}{path}", json={"model": MODEL, **body}, headers=headers, timeout=60)


def message_of(path: str, response: httpx.Response) -> str:
    """The error's message, from the API's own error shape."""
    body = response.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    else:
        assert body["error"]["type"] == "BadRequestError", body
    return body["error"]["message"]


def refused(served: ServerProcess, fake: FakeVLLM, key: str, path: str, body: dict[str, Any]) -> str:
    """Send `body`; assert a prompt 400 that reached no vLLM; return the error's message."""
    before = len(fake.requests)
    started = time.monotonic()
    response = send(served, key, path, body)
    elapsed = time.monotonic() - started
    assert response.status_code == 400, response.text[:500]
    assert elapsed < REFUSAL_S
    assert len(fake.requests) == before  # nothing was forwarded
    return message_of(path, response)


def rss_bytes(server: ServerProcess) -> int:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


USER = [{"role": "user", "content": "Hi"}]
MILLION = 1_000_000


def test_n_of_a_million_is_refused_at_once_and_every_route_keeps_answering(served, fake, key):
    rss_before = rss_bytes(served)
    answers: list[httpx.Response] = []

    def attack() -> None:
        for path, body in [
            ("/v1/chat/completions", {"messages": USER}),
            ("/v1/completions", {"prompt": "Hi"}),
        ]:
            answers.append(send(served, key, path, {**body, "n": MILLION, "max_tokens": 16}))

    attackers = [threading.Thread(target=attack) for _ in range(8)]
    started = time.monotonic()
    for thread in attackers:
        thread.start()
    health = httpx.get(f"{served.http_url}/healthz", timeout=REFUSAL_S)
    for thread in attackers:
        thread.join(timeout=60)
    assert time.monotonic() - started < 2 * REFUSAL_S
    assert health.status_code == 200
    assert [a.status_code for a in answers] == [400] * 16
    assert f"`n` is {MILLION}, over this gateway's limit of {MAX_N} (request_limits.max_n" in answers[0].text
    assert rss_bytes(served) - rss_before < 50 * 1024 * 1024
    # The server still serves: a model call within the limits, and a query.
    assert send(served, key, "/v1/chat/completions", {"messages": USER, "n": MAX_N}).status_code == 200
    assert served.scalar("SELECT 1") == 1


def test_the_admins_limit_holds_at_its_value(served, fake, key):
    ok = send(served, key, "/v1/chat/completions", {"messages": USER, "n": MAX_N})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == MAX_N
    message = refused(served, fake, key, "/v1/chat/completions", {"messages": USER, "n": MAX_N + 1})
    assert f"limit of {MAX_N} (request_limits.max_n, set with --request-limits)" in message


def many(n: int, item: Any) -> list[Any]:
    return [item] * n


CHAT, TEXT, MESSAGES, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"
HI = {"messages": USER}
HI_MESSAGES = {"max_tokens": 16, "messages": USER}
FUNCTION = {"type": "function", "function": {"name": "f"}}
NAMESPACE = {"type": "namespace", "name": "ns", "tools": many(1000, {"type": "function", "name": "f"})}
BIG_SCHEMA = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"enum": ["x" * 70_000]}}}
CASES = [  # (path, body, the field named, the limit named)
    (CHAT, {**HI, "max_tokens": 10**9}, "`max_tokens` is", 131072),
    (CHAT, {**HI, "max_completion_tokens": 10**9}, "`max_completion_tokens`", 131072),
    (CHAT, {**HI, "min_tokens": 200_000}, "`min_tokens`", 131072),
    (CHAT, {**HI, "logprobs": True, "top_logprobs": 1000}, "`top_logprobs`", 20),
    (CHAT, {**HI, "prompt_logprobs": 10**5}, "`prompt_logprobs`", 20),
    (CHAT, {"messages": many(10_001, USER[0])}, "`messages` has 10001 items", 10000),
    (CHAT, {"messages": [{"role": "user", "content": many(100_001, "a")}]},
     "`messages[0].content` brings the call to 100001 content parts", 100000),
    (CHAT, {**HI, "tools": many(1001, FUNCTION)}, "`tools` has 1001 items", 1000),
    (CHAT, {**HI, "stop": many(17, "x")}, "`stop` has 17 items", 16),
    (CHAT, {**HI, "stop": "x" * 257}, "`stop` has 257 characters", 256),
    (CHAT, {**HI, "bad_words": ["x" * 300]}, "`bad_words[0]`", 256),
    (CHAT, {**HI, "logit_bias": {str(i): 1 for i in range(2049)}}, "`logit_bias`", 2048),
    (CHAT, {**HI, "stop_token_ids": list(range(2049))}, "`stop_token_ids`", 2048),
    (CHAT, {**HI, "response_format": BIG_SCHEMA}, "`response_format` is", 65536),
    (CHAT, {**HI, "documents": many(10_001, {"text": "d"})}, "`documents`", 10000),
    (TEXT, {"prompt": "Hi", "best_of": MAX_N + 1}, "`best_of` is", MAX_N),
    (TEXT, {"prompt": "Hi", "logprobs": 21}, "`logprobs` is 21", 20),
    (TEXT, {"prompt": many(131_073, 72)}, "`prompt` has 131073 items", 131072),
    (TEXT, {"prompt": "Hi", "n": 10**6}, "`n` is", MAX_N),
    (MESSAGES, {**HI_MESSAGES, "max_tokens": 10**9}, "`max_tokens` is", 131072),
    (MESSAGES, {**HI_MESSAGES, "messages": many(10_001, USER[0])}, "`messages` has", 10000),
    (MESSAGES, {**HI_MESSAGES, "stop_sequences": many(17, "x")}, "`stop_sequences`", 16),
    (MESSAGES, {**HI_MESSAGES, "tools": many(1001, {"name": "f", "input_schema": {}})}, "`tools`", 1000),
    (MESSAGES, {**HI_MESSAGES, "system": many(100_001, {"type": "text", "text": "s"})}, "`system`", 100000),
    (f"{MESSAGES}/count_tokens", {"messages": many(10_001, USER[0])}, "`messages` has", 10000),
    (RESPONSES, {"input": "Hi", "max_output_tokens": 10**9}, "`max_output_tokens`", 131072),
    (RESPONSES, {"input": "Hi", "top_logprobs": 21}, "`top_logprobs`", 20),
    (RESPONSES, {"input": many(10_001, USER[0])}, "`input` has 10001 items", 10000),
    (RESPONSES, {"input": "Hi", "tools": [NAMESPACE]}, "`tools` has 1001 tools", 1000),
    (RESPONSES, {"input": "Hi", "stop": many(17, "x")}, "`stop` has 17 items", 16),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "field", "limit"), CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES])
def test_a_field_over_its_limit_is_refused_naming_the_field_and_the_limit(
    served, fake, key, path, body, field, limit
):
    message = refused(served, fake, key, path, body)
    assert field in message and f"over this gateway's limit of {limit} (request_limits." in message


@pytest.mark.parametrize(("path", "body", "named"), [
    ("/v1/chat/completions", {"messages": USER, "chat_template": "{% for i in range(10**9) %}x{% endfor %}"},
     "`chat_template` is not accepted"),
    ("/v1/chat/completions", {"messages": USER, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}},
     "`chat_template_kwargs.chat_template`"),
    ("/v1/chat/completions", {"messages": USER, "kv_transfer_params": {"remote_host": "10.0.0.1"}},
     "`kv_transfer_params` is not accepted"),
    ("/v1/chat/completions", {"messages": USER, "n": "1000000"}, "`n` must be an integer"),
    ("/v1/chat/completions", {"messages": USER, "top_logprobs": -1}, "`top_logprobs` must be at least 0"),
    ("/v1/completions", {"prompt": "Hi", "prompt_embeds": "AAAA"}, "`prompt_embeds` is not accepted"),
])  # fmt: skip
def test_a_field_the_gateway_does_not_pass_on_is_refused_naming_it(served, fake, key, path, body, named):
    assert named in refused(served, fake, key, path, body)


def image(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]  # fmt: skip


def input_image(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]


def parts(*content: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(content)}]


PIXEL_PART = {"type": "image_url", "image_url": {"url": PIXEL}}
FETCHES = [  # (path, body, what the message says)
    (CHAT, {"messages": image(METADATA)}, "the gateway fetches no URL for a caller"),
    (CHAT, {"messages": image(f"{ALLOWED_ORIGIN}@169.254.169.254/")}, "fetches no URL"),
    (CHAT, {"messages": image(f"{ALLOWED_ORIGIN}.attacker.test/a.png")}, "fetches no URL"),
    (CHAT, {"messages": parts({"type": "audio_url", "audio_url": {"url": "file:///etc/passwd"}})},
     "fetches no URL"),
    (CHAT, {"messages": parts({"type": "video_url", "video_url": {"url": METADATA}})}, "fetches no URL"),
    (CHAT, {"messages": parts({"image_url": {"url": METADATA}})},
     "`messages[0].content[0].type` None is not accepted"),
    (CHAT, {"messages": parts({**PIXEL_PART, "uuid": "someone-elses"})}, "`messages[0].content[0].uuid`"),
    (CHAT, {"messages": parts({"type": "image_embeds", "image_embeds": "AAAA"})},
     "'image_embeds' is not accepted"),
    (CHAT, {"messages": image("data:image/png;base64," + "A" * (8 * 1024 * 1024))},
     "over this gateway's limit of 8388608 (request_limits.max_data_url_bytes"),
    (CHAT, {"messages": parts(*many(17, PIXEL_PART))},
     "is media part 17 of the call, over this gateway's limit of 16"),
    (RESPONSES, {"input": input_image(METADATA)}, "the gateway fetches no URL for a caller"),
    (RESPONSES, {"input": parts({"type": "input_file", "file_url": METADATA})},
     "input_file parts are not accepted"),
    (MESSAGES, {"max_tokens": 16, "messages": parts({"type": "image", "source": {"type": "url",
     "url": METADATA}})}, "image blocks are not supported"),
    (MESSAGES, {"max_tokens": 16, "messages": parts({"type": "document", "source": {"type": "url",
     "url": METADATA}})}, "'document' blocks are not allowed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "says"), FETCHES, ids=[f"{f[0]}-{i}" for i, f in enumerate(FETCHES)]
)
def test_a_media_url_the_admin_did_not_allow_never_reaches_vllm(served, fake, key, path, body, says):
    assert says in refused(served, fake, key, path, body)


@pytest.mark.parametrize(("path", "body", "url"), [
    ("/v1/chat/completions", {"messages": image(f"{ALLOWED_ORIGIN}/cat.png")}, f"{ALLOWED_ORIGIN}/cat.png"),
    ("/v1/chat/completions", {"messages": image(PIXEL)}, PIXEL),
    ("/v1/responses", {"input": input_image(PIXEL)}, PIXEL),
    ("/v1/responses", {"input": input_image(f"{ALLOWED_ORIGIN}/cat.png")}, f"{ALLOWED_ORIGIN}/cat.png"),
])  # fmt: skip
def test_an_allowed_origin_or_a_bounded_data_url_is_passed_on(served, fake, key, path, body, url):
    before = len(fake.requests)
    response = send(served, key, path, body)
    assert response.status_code == 200, response.text[:500]
    [forwarded] = fake.requests[before:]
    parts = forwarded.body["messages"][-1]["content"]
    assert {"type": "image_url", "image_url": {"url": url}} in parts


@pytest.mark.parametrize(("limits", "says"), [
    ('{"max_nn": 3}', "max_nn"),
    ('{"max_n": 0}', "max_n"),
    ('{"allowed_media_urls": ["https://images.example.com/any/path"]}', "allowed_media_urls"),
])  # fmt: skip
def test_serve_refuses_request_limits_it_cannot_apply(tmp_path, limits, says):
    started = subprocess.run(
        [str(OTEL_RL), "serve", "--db", str(tmp_path / "x.duckdb"), "--request-limits", limits],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert started.returncode == 2, started.stdout + started.stderr
    assert "--request-limits" in started.stderr and says in started.stderr
    assert not (tmp_path / "x.duckdb").exists()  # refused before the store opened
