"""A refused credential says what the route accepts and where the admin token is (docs/collector.md)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fake_vllm import FakeVLLM
from openai import AuthenticationError, OpenAI
from otel_rl_server import ServerProcess

from otel_rl.auth import admin_token_whereabouts

IN_THE_TOKEN_FILE = "the admin token (in the file .otel_rl/token, in the folder where otel-rl serve started)"


@pytest.fixture(scope="module")
def server_with_its_own_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`otel-rl serve` as the quick start runs it: no token given, so it writes .otel_rl/token in its folder
    (an empty --token counts as none), with a vLLM-style server behind the gateway."""
    workdir = tmp_path_factory.mktemp("own_token")
    with FakeVLLM() as fake:
        server = ServerProcess(workdir / "otel_rl.duckdb", workdir, token="", flags=("--vllm", fake.url))
        server.start()
        server.token = (workdir / ".otel_rl" / "token").read_text().strip()
        yield server
        server.stop()


def test_a_model_call_with_a_wrong_key_hears_which_keys_the_gateway_takes(server_with_its_own_token) -> None:
    client = OpenAI(base_url=f"{server_with_its_own_token.http_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(AuthenticationError) as refused:
        client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
    message = str(refused.value)
    assert "unknown bearer token: this route accepts" in message
    assert f"{IN_THE_TOKEN_FILE} or a rollout key (orl-rk-..., issued by the rollout controller)" in message

    # The key it names works.
    client = OpenAI(
        base_url=f"{server_with_its_own_token.http_url}/v1",
        api_key=server_with_its_own_token.token,
        max_retries=0,
    )
    reply = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content


@pytest.mark.parametrize("authorization", [None, "Bearer x"])
def test_an_admin_route_names_the_admin_token_only(server_with_its_own_token, authorization) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    response = httpx.post(
        f"{server_with_its_own_token.http_url}/v1/query",
        json={"sql": "SELECT 1"},
        headers=headers,
        timeout=30,
    )
    assert response.status_code == 401
    detail = response.json()["detail"]
    assert detail.startswith("missing bearer token" if authorization is None else "unknown bearer token")
    assert detail.endswith(f"{IN_THE_TOKEN_FILE} only")


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (".otel_rl/token (new)", "in the file .otel_rl/token, in the folder where otel-rl serve started"),
        ("--token", "given to the server as --token"),
        ("OTEL_RL_TOKEN", "given to the server as OTEL_RL_TOKEN"),
        ("--token-file /run/secrets/t", "in the file /run/secrets/t (--token-file)"),
        ("OTEL_RL_TOKEN_FILE /run/t", "in the file /run/t (OTEL_RL_TOKEN_FILE)"),
    ],
)
def test_the_admin_token_is_named_by_where_the_server_got_it(source: str, said: str) -> None:
    assert admin_token_whereabouts(source) == said
