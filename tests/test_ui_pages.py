"""The web view's pages in headless Chromium (Debian's `chromium`), driven over the DevTools protocol.

`check_pages` runs against the live server the quick demo leaves serving (tests/test_demo.py): one demo run
serves both. The protocol is spoken over the browser's websocket with aiohttp's client (already a dependency):
no browser download, no driver binary. The test here checks the driver itself on a page of known content.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from otel_rl.query import query

CHROMIUM = "/usr/bin/chromium"
REPOSITORY = Path(__file__).resolve().parents[1]
ARTIFACTS = REPOSITORY / ".otel_rl" / "test-artifacts" / "ui"
WAIT_S = 30.0


class Page:
    """One browser tab over the DevTools protocol: navigate, evaluate, wait, screenshot; collects every
    console error and uncaught exception."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._next_id = 0
        self._replies: dict[int, asyncio.Future] = {}
        self.errors: list[str] = []
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message in self._ws:
            event = json.loads(message.data)
            if "id" in event:
                self._replies.pop(event["id"]).set_result(event)
            elif event.get("method") == "Runtime.exceptionThrown":
                details = event["params"]["exceptionDetails"]
                self.errors.append(details.get("exception", {}).get("description") or details["text"])
            elif event.get("method") == "Runtime.consoleAPICalled" and event["params"]["type"] == "error":
                self.errors.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in event["params"]["args"])
                )
            elif event.get("method") == "Log.entryAdded" and event["params"]["entry"]["level"] == "error":
                entry = event["params"]["entry"]
                self.errors.append(f"{entry['text']} ({entry.get('url', '')})")

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        reply = self._replies[self._next_id] = asyncio.get_running_loop().create_future()
        await self._ws.send_str(json.dumps({"id": self._next_id, "method": method, "params": params}))
        answer = await asyncio.wait_for(reply, WAIT_S)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, what: str, timeout_s: float = WAIT_S) -> Any:
        """The value of `expression` once it is truthy; fails naming `what` (and the page's text) if never."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.1)
        text = await self.evaluate("document.body.innerText.slice(0, 2000)")
        raise AssertionError(
            f"{what}: not seen within {timeout_s:g} s; the page says:\n{text}\nerrors: {self.errors}"
        )

    async def goto(self, url: str) -> None:
        """Open `url` and wait until the view has drawn its route (app.js marks `body[data-rendered]`)."""
        await self.send("Page.navigate", url=url)
        route = url.partition("#")[2]
        route = "/rollouts" if route.startswith("token=") else route
        await self.wait_for(
            f"document.body?.dataset.rendered === {json.dumps('#' + route)}", f"the page {url}"
        )

    async def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))


@contextmanager
def chromium() -> Iterator[str]:
    """Headless Chromium on a free DevTools port; yields its HTTP endpoint (http://127.0.0.1:PORT)."""
    profile = tempfile.mkdtemp(prefix="otel-rl-chromium-")
    process = subprocess.Popen(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-extensions", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
         f"--user-data-dir={profile}",
         "--window-size=1280,1000", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for line in process.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/..."
            found = re.search(r"DevTools listening on ws://([^/]+)/", line)
            if found:
                yield f"http://{found.group(1)}"
                break
        else:
            raise RuntimeError(f"chromium exited with {process.wait()} before its DevTools endpoint was up")
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stderr.close()
        shutil.rmtree(profile, ignore_errors=True)


async def with_page(endpoint: str, scenario) -> None:  # noqa: ANN001 - an async callable taking a Page
    async with aiohttp.ClientSession() as session:
        async with session.put(f"{endpoint}/json/new?about:blank") as response:
            target = await response.json()
        async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=64 * 1024 * 1024) as ws:
            page = Page(ws)
            for domain in ("Page", "Runtime", "Log"):
                await page.send(f"{domain}.enable")
            await scenario(page)


def check_pages(base_url: str, token: str, expect: dict[str, Any], artifacts: Path = ARTIFACTS) -> None:
    """Every page of the view against a live server: no console error anywhere, and what each page must show.

    `expect`: `train_rollouts` (the ids of the store's train rollouts), `rollout` (a rollout id) and
    `rollout_calls`, `rollout_tools` (its numbers of calls and tool calls), `merged_rollout` (a rollout
    whose sample merges several calls).
    """

    async def scenario(page: Page) -> None:
        # the link the demo writes beside its store: the token moves out of the address bar at once
        await page.goto(f"{base_url}/ui/#token={token}")
        await page.wait_for(
            "location.hash === '#/rollouts' && !!document.querySelector('#rollouts-table tbody')", "rollouts"
        )
        assert token not in await page.evaluate("location.href")
        await page.screenshot(artifacts / "rollouts.png")

        await page.goto(f"{base_url}/ui/#/rollouts?split=train&limit=1000")
        await page.wait_for(
            "location.hash.includes('split=train') && !!document.querySelector('#rollouts-table tbody')",
            "train rollouts",
        )
        listed = await page.wait_for(
            "(() => { const t = [...document.querySelectorAll('#rollouts-table tbody tr td:first-child a')];"
            " return t.length ? t.map(a => a.title) : null })()",
            "the train rollouts' rows",
        )
        assert sorted(listed) == sorted(expect["train_rollouts"])

        sql = "SELECT count(*) AS n FROM rollouts WHERE split = 'train'"
        await page.evaluate(
            f"document.querySelector('form.sql textarea').value = {json.dumps(sql)};"
            " document.querySelector('form.sql button').click()"
        )
        count = await page.wait_for(
            "document.querySelector('#sql-result tbody td')?.textContent", "the SQL box's result"
        )
        assert int(count) == len(expect["train_rollouts"])

        await page.goto(f"{base_url}/ui/#/rollout/{expect['rollout']}")
        calls = await page.wait_for(
            "document.querySelectorAll('#calls details.call').length", "the rollout's calls"
        )
        assert calls == expect["rollout_calls"]
        assert await page.evaluate("document.querySelectorAll('svg.timeline rect.call').length") == calls
        tools = await page.evaluate("document.querySelectorAll('svg.timeline rect.tool').length")
        assert tools == expect["rollout_tools"]
        assert await page.evaluate("document.querySelectorAll('#calls .message').length") >= calls
        await page.screenshot(artifacts / "rollout.png")

        await page.goto(f"{base_url}/ui/#/sample/{expect['merged_rollout']}")
        await page.wait_for("!!document.querySelector('#segments .segment')", "the inspector's segments")
        counts = await page.evaluate(
            "({trained: document.querySelectorAll('#segments .token.trained').length,"
            " inserted: document.querySelectorAll('#segments .token.inserted').length,"
            " prompt: document.querySelectorAll('#segments .token.prompt').length,"
            " calls: document.querySelectorAll('#segments .boundary').length})"
        )
        assert counts["trained"] > 0 and counts["inserted"] > 0 and counts["prompt"] > 0, counts
        assert counts["calls"] >= 2, counts  # a merged multi-turn sample: several calls' answers in one
        await page.screenshot(artifacts / "sample.png")

        await page.goto(f"{base_url}/ui/#/training")
        lines = await page.wait_for(
            "document.querySelectorAll('#charts path.series').length", "the training curves"
        )
        assert lines >= 4  # reward and success (train and val), mismatch, staleness
        assert (
            await page.evaluate("document.querySelectorAll('#charts rect.bar').length") > 0
        )  # step time, reloads
        assert await page.evaluate("document.querySelectorAll('#charts [data-download]').length") >= 12
        await page.screenshot(artifacts / "training.png")

        # without the token, the login form; the token typed there opens the page asked for
        await page.evaluate("document.getElementById('logout').click()")
        await page.wait_for("!!document.querySelector('form.login input[name=token]')", "the login form")
        await page.evaluate(
            f"document.querySelector('form.login input').value = {json.dumps(token)};"
            " document.querySelector('form.login button').click()"
        )
        await page.wait_for(
            "document.body.dataset.rendered === '#/training'", "the training page after login"
        )
        assert page.errors == []

    with chromium() as endpoint:
        asyncio.run(with_page(endpoint, scenario))


def test_the_devtools_driver_reports_a_pages_console_errors_and_content(tmp_path):
    page_file = tmp_path / "page.html"
    page_file.write_text(
        "<p id=ok>ready</p><script>console.error('boom');"
        " setTimeout(() => { throw new Error('late') }, 10)</script>"
    )

    async def scenario(page: Page) -> None:
        await page.send("Page.navigate", url=page_file.as_uri())
        assert await page.wait_for("document.getElementById('ok')?.textContent", "the paragraph") == "ready"
        deadline = asyncio.get_running_loop().time() + 10
        while not any("late" in error for error in page.errors):  # the timer's error, reported when it runs
            assert asyncio.get_running_loop().time() < deadline, page.errors
            await asyncio.sleep(0.05)
        await page.screenshot(tmp_path / "page.png")
        assert any("boom" in error for error in page.errors), page.errors
        with pytest.raises(AssertionError, match="never-there: not seen"):
            await page.wait_for("false", "never-there", timeout_s=0.5)

    with chromium() as endpoint:
        asyncio.run(with_page(endpoint, scenario))
    assert (tmp_path / "page.png").read_bytes().startswith(b"\x89PNG")


# The banner names the file the link (with the admin token) is in; the token itself is never printed.
VIEW_LINE = re.compile(r"web view: (http://\S+)/ui \(its link with the admin token: (\S+), mode 600")


def view_expectations(base_url: str, token: str) -> dict[str, Any]:
    """What the pages must show, from the store the server serves (asked through its query API)."""

    def sql(statement: str) -> list[tuple]:
        return query(statement, server=base_url, token=token).rows()

    train = [row[0] for row in sql("SELECT rollout_id FROM rollouts WHERE split = 'train'")]
    rollout, calls = sql(
        "SELECT rollout_id, n_calls FROM rollouts ORDER BY n_calls DESC, rollout_id LIMIT 1"
    )[0]
    tools = sql(f"SELECT count(*) FROM tool_calls WHERE rollout_id = '{rollout}'")[0][0]
    # the expert harness's rollouts call the model, then the calculator, then the model again: one merged
    # two-call sample each (retokenized from their messages: the expert's model is a script, not vLLM)
    merged = sql(
        "SELECT rollout_id FROM rollouts WHERE service_name = 'expert_agent' AND n_calls >= 2 LIMIT 1"
    )
    return {
        "train_rollouts": train,
        "rollout": rollout,
        "rollout_calls": calls,
        "rollout_tools": tools,
        "merged_rollout": merged[0][0],
    }


def run_checking_the_view(command: list[str], *, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """Run a command that ends by serving the web view (`otel-rl demo`): wait for the link it prints, check
    every page against that live server, then Ctrl-C it (SIGINT); returns its exit code and output."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(timeout_s, process.kill)
    watchdog.start()
    stdout: list[str] = []
    stderr: list[str] = []
    readers = [threading.Thread(target=lambda: stderr.extend(process.stderr), daemon=True)]
    readers[0].start()
    try:
        for line in process.stdout:
            stdout.append(line)
            link = VIEW_LINE.search(line)
            if link:
                break
        else:
            raise AssertionError(f"no web view link in the output:\n{''.join(stdout)[-3000:]}")
        readers.append(threading.Thread(target=lambda: stdout.extend(process.stdout), daemon=True))
        readers[-1].start()
        base_url, link_path = link.groups()
        assert "#token=" not in "".join(stdout), "the link with the token was printed"
        token = (cwd / link_path).read_text().strip().split("#token=", 1)[1]
        check_pages(base_url, token, view_expectations(base_url, token))
        process.send_signal(signal.SIGINT)
        code = process.wait(60)
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
        for reader in readers:
            reader.join(10)
    return subprocess.CompletedProcess(command, code, "".join(stdout), "".join(stderr))
