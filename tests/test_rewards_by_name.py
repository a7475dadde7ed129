"""The reward the user sees is the reward training uses, on a real `otel-rl serve` over loopback: a harness
holding its rollout key reports `outcome` 1.0 and its framework's standard evaluation under its own name, a
grader posts `outcome` 0.0; the rollouts view, its web page and training all give the grader's 0.0, with
every other source and name beside it."""

import asyncio
import json
import time
import uuid

import httpx
from test_forged_records import one_span
from test_rollout_isolation import export, kv, post_reward, reward_logs, rollout_key
from test_ui_pages import Page, chromium, with_page

from otel_rl import attributes as attr
from otel_rl.store import reads
from otel_rl.train.config import RewardSettings
from otel_rl.transforms.rewards import RewardSpec, outcome_rewards

FRAMEWORK_NAME = "eval.accuracy"  # a framework's standard evaluation (lm-eval, inspect...) under its name


def evaluation(name: str, value: float, rollout_id: str) -> list:
    """A gen_ai.evaluation.result's attributes as a harness's SDK sends them (no source: the server's)."""
    return [
        kv(attr.EVALUATION_NAME, name),
        kv(attr.EVALUATION_SCORE_VALUE, value),
        kv(attr.ROLLOUT_ID, rollout_id),
    ]


def test_the_trusted_outcome_shows_with_every_other_source_and_name_beside_it(otel_rl_server) -> None:
    rollout_id = "by-name-" + uuid.uuid4().hex[:8]
    key = rollout_key(otel_rl_server, rollout_id)
    export(otel_rl_server, "traces", one_span("harness", "work", [], time.time_ns()), key, "protobuf")
    harness = reward_logs(
        {"attributes": evaluation("outcome", 1.0, rollout_id)},
        {"attributes": evaluation(FRAMEWORK_NAME, 0.5, rollout_id)},
    )
    export(otel_rl_server, "logs", harness, key, "protobuf")
    assert post_reward(otel_rl_server, {"rollout_id": rollout_id, "value": 0.0}).status_code == 200

    (rollout,) = otel_rl_server.sql(
        "SELECT outcome_reward, outcome_rewards_by_source AS by_source, outcome_rewards_by_name AS by_name,"
        f" outcome_rewards_by_name['{FRAMEWORK_NAME}'].sources[1].value AS framework"
        f" FROM rollouts WHERE rollout_id = '{rollout_id}'"
    ).to_pylist()
    assert rollout["outcome_reward"] == 0.0
    assert rollout["by_source"] == [("grader", 0.0), ("harness", 1.0)]
    assert rollout["framework"] == 0.5
    grader = {"source": "grader", "value": 0.0, "vouched": True}
    claim = {"source": "harness", "value": 1.0, "vouched": False}
    framework_claim = {"source": "harness", "value": 0.5, "vouched": False}
    assert rollout["by_name"] == [
        (FRAMEWORK_NAME, {"trusted": None, "sources": [framework_claim]}),
        ("outcome", {"trusted": 0.0, "sources": [grader, claim]}),
    ]

    # training reads the same records: its default reward is the grader's 0.0; configured with the
    # framework's name (and trusting the harness that sent it), the value shown under that name
    records = reads.rollout_rewards(otel_rl_server.run, [rollout_id])
    assert outcome_rewards(records, RewardSettings().spec())["reward"].to_list() == [0.0]
    framework = RewardSpec(FRAMEWORK_NAME, trusted_sources=(attr.REWARD_SOURCE_HARNESS,))
    assert outcome_rewards(records, framework)["reward"].to_list() == [0.5]

    # the web view's rollout page: the trusted 0.0 as its reward, both others beside it
    page_data = httpx.get(
        f"{otel_rl_server.http_url}/ui/api/rollouts/{rollout_id}", headers=otel_rl_server.auth, timeout=30
    ).json()
    assert page_data["rollout"]["outcome_reward"] == 0.0
    assert set(page_data["rollout"]["outcome_rewards_by_name"]) == {"outcome", FRAMEWORK_NAME}
    shown = page_rewards(otel_rl_server.http_url, otel_rl_server.token, rollout_id)
    assert shown["reward"] == "0"
    assert shown["by_name"] == [
        [FRAMEWORK_NAME, "–", "harness", "0.5", "false"],
        ["outcome", "0", "grader", "0", "true"],
        ["outcome", "0", "harness", "1", "false"],
    ]


def test_the_view_names_the_reward_training_uses_by_default(otel_rl_server) -> None:
    assert otel_rl_server.scalar("SELECT outcome_reward_name()") == RewardSettings().name == RewardSpec().name


def page_rewards(base_url: str, token: str, rollout_id: str) -> dict:
    """What the rollout page shows in headless Chromium: its reward and its rewards-by-name table's cells."""
    shown: dict = {}

    async def scenario(page: Page) -> None:
        await page.goto(f"{base_url}/ui/#token={token}")
        await page.goto(f"{base_url}/ui/#/rollout/{rollout_id}")
        rows = await page.wait_for(
            "[...document.querySelectorAll('#rewards-by-name tbody tr')]"
            ".map((tr) => [...tr.children].map((td) => td.textContent))",
            "the rewards by name",
        )
        reward = await page.evaluate(
            "[...document.querySelectorAll('dl.facts dt')].find((dt) => dt.textContent === 'reward')"
            ".nextElementSibling.textContent"
        )
        shown.update(reward=reward, by_name=rows, errors=list(page.errors))

    with chromium() as endpoint:
        asyncio.run(with_page(endpoint, scenario))
    assert shown.pop("errors") == [], json.dumps(shown)
    return shown
