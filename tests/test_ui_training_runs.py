"""The web view shows offline and SFT runs on its training page, and a link to any page survives the login:
a real `otel-rl train --sft` against a real server, its page in headless Chromium (tests/test_ui_pages.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from otel_rl_server import OTEL_RL, ServerProcess
from test_ui_pages import Page, chromium, with_page

CHATS = [
    {
        "messages": [
            {"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": str(a + b)},
        ]
    }
    for a, b in ((2, 3), (4, 5), (10, 7), (8, 8))
]


@pytest.fixture(scope="module")
def sft_run(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[tuple[ServerProcess, str]]:
    """A server, and the id of the SFT run `otel-rl train --sft` recorded on it (3 steps)."""
    workdir = tmp_path_factory.mktemp("sft_run")
    server = ServerProcess(workdir / "otel_rl.duckdb", workdir).start()
    try:
        chats = workdir / "chats.jsonl"
        chats.write_text("".join(json.dumps(chat) + "\n" for chat in CHATS))
        config = workdir / "sft.yaml"
        config.write_text(
            f"model: {tiny_model_dir}\noutput_dir: {workdir / 'out'}\nsteps: 3\n"
            "offline: {sft_batch_size: 2}\n"
            f"server: {{url: {server.http_url}, token: {server.token}}}\n"
        )
        result = subprocess.run(
            [str(OTEL_RL), "train", "--config", str(config), "--sft", "--chats", str(chats)],
            capture_output=True,
            text=True,
            env=os.environ | {"COLUMNS": "200"},
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "its steps are on the web view's training page" in result.stdout
        runs = httpx.get(f"{server.http_url}/ui/api/training/runs", headers=server.auth, timeout=30).json()
        yield server, runs[0]["run_id"]
    finally:
        server.stop()


def test_an_sft_run_is_listed_with_its_steps(sft_run) -> None:
    server, run_id = sft_run
    runs = httpx.get(f"{server.http_url}/ui/api/training/runs", headers=server.auth, timeout=30).json()
    assert [(r["run_id"][:4], r["steps"]) for r in runs] == [("sft-", 3)]
    steps = httpx.get(
        f"{server.http_url}/ui/api/training/steps", params={"run_id": run_id}, headers=server.auth, timeout=30
    ).json()
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["train_s"] > 0 and s["loss"] > 0 for s in steps)


async def rendered(page: Page, route: str, what: str) -> None:
    await page.wait_for(f"document.body?.dataset.rendered === {json.dumps('#' + route)}", what)


def test_the_token_link_can_carry_a_route_and_the_training_page_draws_the_sft_run(sft_run) -> None:
    server, run_id = sft_run
    route = f"/training?run={run_id}"

    async def scenario(page: Page) -> None:
        await page.send("Page.navigate", url=f"{server.http_url}/ui/#token={server.token}&route={route}")
        await rendered(page, route, "the training page the link named")
        assert server.token not in await page.evaluate("location.href")
        assert await page.evaluate("document.querySelector('select[name=run]').value") == run_id
        assert await page.evaluate("!document.getElementById('no-training')")
        # the step-time chart: one bar (train time) per step
        assert await page.evaluate("document.querySelectorAll('#charts rect.bar').length") >= 3
        # the loss curve, the only one an SFT run has
        assert await page.evaluate("document.querySelectorAll('#charts path.series').length") == 1
        assert page.errors == []

    with chromium() as endpoint:
        asyncio.run(with_page(endpoint, scenario))


def test_a_shared_page_link_opens_that_page_after_the_login(sft_run) -> None:
    server, run_id = sft_run
    route = f"/training?run={run_id}"

    async def scenario(page: Page) -> None:
        await page.send("Page.navigate", url=f"{server.http_url}/ui/#{route}")
        await page.wait_for("!!document.querySelector('form.login input[name=token]')", "the login form")
        assert await page.evaluate("location.hash") == f"#{route}"
        await page.evaluate(
            f"document.querySelector('form.login input').value = {json.dumps(server.token)};"
            " document.querySelector('form.login button').click()"
        )
        await rendered(page, route, "the shared page after the login")
        assert await page.evaluate("document.querySelector('select[name=run]').value") == run_id
        assert page.errors == []

    with chromium() as endpoint:
        asyncio.run(with_page(endpoint, scenario))
