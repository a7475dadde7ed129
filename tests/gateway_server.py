"""The `otel-rl serve` app (collector, store, gateway) run in-process by uvicorn on a free port, for tests.

In-process so that tests read the store directly and see the gateway's state; the HTTP path is the real one.
"""

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pyarrow as pa
import torch
import uvicorn
from loopback import ThreadedServer

from otel_rl.server import ServeSettings, create_app

ADMIN_TOKEN = "gateway-test-admin-token"


class GatewayServer:
    """`with GatewayServer(db, vllm=[url]) as server:` → .url (OpenAI base URL), .admin, .spans(where)."""

    def __init__(self, db: Path, *, vllm: list[str], **settings: Any) -> None:
        self.settings = ServeSettings(db=db, grpc_port=None, token=ADMIN_TOKEN, vllm=tuple(vllm), **settings)
        self.app = create_app(self.settings)
        self.store = self.app.state.store
        self.gateway = self.app.state.gateway
        self._serving: ThreadedServer | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL (`.../v1`)."""
        return f"{self.base_url}/v1"

    @property
    def admin(self) -> dict[str, str]:
        return {"authorization": f"Bearer {ADMIN_TOKEN}"}

    def __enter__(self) -> "GatewayServer":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=5)
        self._serving = ThreadedServer(config, sock, what="the otel-rl app").start(timeout_s=30)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._serving is not None
        self._serving.stop(timeout_s=30)

    def rollout_key(self, rollout_id: str, **identity: str) -> str:
        response = httpx.post(
            f"{self.base_url}/v1/admin/rollouts/{rollout_id}/key",
            json=identity,
            headers=self.admin,
            timeout=10,
        )
        response.raise_for_status()
        return response.json()["key"]

    def spans(self, where: str, *, expect: int = 1, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Gateway spans matching `where` (SQL over spans), with attributes parsed and call_tokens joined;
        waits until at least `expect` are stored."""
        sql = f"""
            SELECT s.*, t.prompt_token_ids, t.choice_token_ids, t.choice_logprobs
            FROM spans s LEFT JOIN call_tokens t USING (trace_id, span_id)
            WHERE s.scope_name = 'otel_rl.gateway' AND ({where}) ORDER BY s.start_time_unix_nano"""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.store.query_arrow(sql).to_pylist()
            if len(rows) >= expect or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for row in rows:  # the span's attributes whole: schema.sql stores its content attributes apart
            row["attributes"] = json.loads(row["attributes"]) | json.loads(
                row.pop("content_attributes") or "{}"
            )
        return rows

    def query(self, sql: str) -> pa.Table:
        return self.store.query_arrow(sql)


def policy_version(gateway: GatewayServer) -> int:
    """The policy version the gateway serves now."""
    policy = httpx.get(f"{gateway.base_url}/v1/admin/policy", headers=gateway.admin, timeout=10)
    return policy.json()["version"]


def policy_body(version: int, weights: dict[str, Path]) -> dict[str, Any]:
    return {"version": version, **{kind: str(path) for kind, path in weights.items()}}


def set_policy(gateway: GatewayServer, version: int, **weights: Path) -> httpx.Response:
    """`POST /v1/admin/policy` with `checkpoint=` or `lora_adapter=` folders."""
    body = policy_body(version, weights)
    return httpx.post(f"{gateway.base_url}/v1/admin/policy", json=body, headers=gateway.admin, timeout=120)


async def set_policy_now(gateway: GatewayServer, version: int, **weights: Path) -> httpx.Response:
    """set_policy from the test's event loop, for a reload that must land while its calls run: a thread of
    its own waited seconds for the GIL behind the clients' parsing and the in-process gateway (measured:
    the post reached the gateway 2-3.6 s late, after 960-token streams had ended)."""
    async with httpx.AsyncClient(base_url=gateway.base_url, headers=gateway.admin, timeout=120) as client:
        return await client.post("/v1/admin/policy", json=policy_body(version, weights))


def teacher_forced(model, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """Float32 logprobs under `model` at each completion position (argmax: the greedy tokens)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0].log_softmax(-1)
    return logits[len(prompt_ids) - 1 : -1]


async def keep_calling(
    gateway: GatewayServer,
    prompt: str,
    stop: asyncio.Event,
    answered: list[tuple[bool, Any]],
    reloaded: asyncio.Event,
    *,
    rollout_prefix: str,
    max_tokens: int,
) -> None:
    """Greedy calls with token ids and logprobs, each in a rollout of its own, until `stop` is set; each
    response into `answered`, with whether its call began after `reloaded` was set."""
    async with openai.AsyncOpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN, max_retries=5) as client:
        while not stop.is_set():
            after = reloaded.is_set()
            response = await client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": prompt}],
                temperature=0,
                max_tokens=max_tokens,
                logprobs=True,
                extra_body={"return_token_ids": True},
                extra_headers={"x-otel-rl-rollout-id": f"{rollout_prefix}-{uuid.uuid4().hex[:8]}"},
            )
            answered.append((after, response))


def assert_served_by_versions(
    responses: list, versions: list[int], spans: dict, models: dict, tolerance: float
) -> set[tuple]:
    """Each response's recorded tokens are its own, and it came whole from the weights of the version its
    span names (`models[version]`); checked once per distinct (version, prompt, completion), returned."""
    checked = set()
    for response, version in zip(responses, versions, strict=True):
        completion_ids = response.choices[0].token_ids
        assert spans[response.id]["choice_token_ids"] == [completion_ids]
        key = (version, tuple(response.prompt_token_ids), tuple(completion_ids))
        if key not in checked:
            checked.add(key)
            assert_served_by(models[version], response, tolerance)
    return checked


def assert_served_by(model, response, tolerance: float) -> None:
    """The response's greedy tokens and their logprobs are those of transformers' float32 `model`."""
    completion_ids = response.choices[0].token_ids
    reference = teacher_forced(model, response.prompt_token_ids, completion_ids)
    assert reference.argmax(-1).tolist() == completion_ids
    expected = reference.gather(1, torch.tensor(completion_ids)[:, None])[:, 0]
    received = torch.tensor([entry.logprob for entry in response.choices[0].logprobs.content])
    assert (received - expected).abs().max().item() < tolerance


def reload_during_traffic(
    gateway: GatewayServer, prompts: list[str], traffic: dict, version: int, **weights: Path
) -> tuple[list, httpx.Response]:
    """One client per prompt keeps calling (keep_calling(**traffic)); once each has been answered, the policy
    changes to `weights`; once each has been answered for a call begun after that, the clients stop.
    Returns every response and the reload's answer."""

    async def until(
        enough: Callable[[], bool], calls: asyncio.Future, what: str, timeout_s: float = 120
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not enough():
            if calls.done():
                await calls  # a call failed: say how
            assert time.monotonic() < deadline, f"not {what} within {timeout_s} s"
            await asyncio.sleep(0.05)

    async def scenario() -> tuple[list, httpx.Response]:
        stop, reload_done = asyncio.Event(), asyncio.Event()
        answered: list[tuple[bool, Any]] = []
        calls = asyncio.gather(
            *(keep_calling(gateway, prompt, stop, answered, reload_done, **traffic) for prompt in prompts)
        )
        await until(lambda: len(answered) >= len(prompts), calls, "every client answered before the reload")
        reloaded = await set_policy_now(gateway, version, **weights)
        reload_done.set()

        def each_after() -> bool:
            return sum(after for after, _ in answered) >= len(prompts)

        await until(each_after, calls, "every client answered for a call begun after the reload")
        stop.set()
        await calls
        return [response for _, response in answered], reloaded

    return asyncio.run(scenario())
