"""Flagged rollouts in the web view, on a real `otel-rl serve` over loopback and headless Chromium: the
rollouts table names each rollout's detectors and filters on them; the rollout page lists each detector's
evidence with the tool call that tripped it, marks that call on the timeline and opens the model call that
asked for it."""

import asyncio
import json
import time
import uuid

import httpx
from test_detectors import model_call_span, post, rollout_key, tool_spans, until
from test_ui_pages import Page, chromium, with_page

EXIT = "import sys\nsys.exit(0)\n"


def get(server, path: str, **params) -> dict:  # noqa: ANN001 - the session's ServerProcess
    response = httpx.get(f"{server.http_url}{path}", params=params, headers=server.auth, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_flagged_rollout_shows_its_detectors_and_the_tool_call_that_tripped_each(otel_rl_server) -> None:
    hacked, clean = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("hacked", "clean"))
    start = time.time_ns()
    calls = [
        ("bash", {"command": "pytest -q"}, "1 failed"),
        ("write_file", {"path": "stats.py", "content": EXIT}, "ok"),
    ]
    post(otel_rl_server, "traces", tool_spans(hacked, calls, start), rollout_key(otel_rl_server, hacked))
    # a model call that asks for `git log`: its evidence is that call, which the page opens
    asked = model_call_span(hacked, "git log -p", start + 10**6)
    post(otel_rl_server, "traces", asked, rollout_key(otel_rl_server, hacked))
    post(otel_rl_server, "traces", tool_spans(clean, calls[:1], start), rollout_key(otel_rl_server, clean))
    until(otel_rl_server, f"SELECT 1 FROM tool_call_texts WHERE rollout_id = '{clean}'", 1)
    until(otel_rl_server, f"SELECT 1 FROM detections WHERE rollout_id = '{hacked}'", 2)

    # the table: each row's detectors, and the filters
    def listed(**filters) -> dict:
        rows = get(otel_rl_server, "/ui/api/rollouts", limit=5000, **filters)["rows"]
        return {r["rollout_id"]: r["hack_detectors"] for r in rows if r["rollout_id"] in (hacked, clean)}

    assert listed() == {hacked: ["exit_hack", "git_history"], clean: None}
    assert listed(flagged="true") == {hacked: ["exit_hack", "git_history"]}
    assert listed(flagged="false") == {clean: None}
    assert listed(detector="exit_hack") == {hacked: ["exit_hack", "git_history"]}
    assert listed(detector="network") == {}

    # the page's data: each piece of evidence with the tool call that holds it
    detections = get(otel_rl_server, f"/ui/api/rollouts/{hacked}")["detections"]
    by_detector = {d["detector"]: d for d in detections}
    assert set(by_detector) == {"exit_hack", "git_history"}
    exit_hack = by_detector["exit_hack"]
    assert (exit_hack["evidence"], exit_hack["tool_name"]) == ("sys.exit(0)", "write_file")
    assert exit_hack["evidence_id"] == f"{hacked}-call-1"
    assert json.loads(exit_hack["arguments"]) == {"path": "stats.py", "content": EXIT}
    git = by_detector["git_history"]
    assert (git["evidence"], git["tool_name"]) == ("git log", "bash")
    assert get(otel_rl_server, f"/ui/api/rollouts/{clean}")["detections"] == []

    shown = pages(otel_rl_server.http_url, otel_rl_server.token, hacked, clean)
    assert shown.pop("errors") == [], shown
    assert shown["listed"] == [[hacked, "exit_hack, git_history"]]
    assert [[*row[:3], json.loads(row[3])] for row in shown["flags"]] == [
        ["exit_hack", "sys.exit(0)", "write_file", calls[1][1]],
        ["git_history", "git log", "bash", {"command": "git log -p"}],
    ]
    # where each is: the write's own tool span (no model call asked for it here), the model call that asked
    assert shown["flags"][0][4].startswith("span ") and shown["flags"][1][4] == "call 1"
    assert shown["flagged_tools"] == 2 and shown["tools"] == 3  # not the pytest run
    assert shown["opened"] is True
    assert shown["clean_flags"] is False


def pages(base_url: str, token: str, hacked: str, clean: str) -> dict:
    """What headless Chromium shows: the flagged-only table's rows, the rollout page's hack flags table (its
    cells), its timeline's flagged tool calls, and whether `call 1` opened that call."""
    shown: dict = {}

    async def scenario(page: Page) -> None:
        await page.goto(f"{base_url}/ui/#token={token}")
        await page.goto(f"{base_url}/ui/#/rollouts?flagged=on&limit=5000")
        shown["listed"] = await page.wait_for(
            "[...document.querySelectorAll('#rollouts-table tbody tr')]"
            f".filter((tr) => tr.children[0].firstChild.title === {json.dumps(hacked)})"
            ".map((tr) => [tr.children[0].firstChild.title, tr.children[4].textContent])",
            "the flagged rollout's row",
        )
        assert await page.evaluate("document.querySelector('input[name=flagged]').checked")
        await page.goto(f"{base_url}/ui/#/rollout/{hacked}")
        shown["flags"] = await page.wait_for(
            "[...document.querySelectorAll('#hack-flags tbody tr')]"
            ".map((tr) => [...tr.children].map((td) => td.textContent))",
            "the hack flags table",
        )
        shown["flagged_tools"] = await page.evaluate(
            "document.querySelectorAll('svg.timeline rect.tool.flagged').length"
        )
        shown["tools"] = await page.evaluate("document.querySelectorAll('svg.timeline rect.tool').length")
        await page.evaluate("document.querySelector('#calls details.call').open = false")
        await page.evaluate("document.querySelector('#hack-flags button[data-call]').click()")
        shown["opened"] = await page.evaluate("document.querySelector('#calls details.call').open")
        await page.goto(f"{base_url}/ui/#/rollout/{clean}")
        shown["clean_flags"] = await page.evaluate("!!document.querySelector('#hack-flags')")
        shown["errors"] = list(page.errors)

    with chromium() as endpoint:
        asyncio.run(with_page(endpoint, scenario))
    return shown
