"""The reward the user sees is the reward training uses, on a real `otel-rl serve` over loopback: a harness
holding its rollout key reports `outcome` 1.0 and its framework's standard evaluation under its own name, a
grader posts `outcome` 0.0; the rollouts view, its web page and training all give the grader's 0.0, with
every other source and name beside it."""

import asyncio
import json
import time
import uuid

import httpx
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue
from test_forged_records import one_span, wait_for
from test_rollout_isolation import export, kv, post_reward, reward_logs, rollout_key
from test_ui_pages import Page, chromium, with_page

from otel_rl import attributes as attr
from otel_rl.store import reads
from otel_rl.train.config import RewardSettings
from otel_rl.train.records import RunRecorder, reward_attributes
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


def test_the_view_names_the_reward_training_uses_by_default_name(otel_rl_server) -> None:
    assert otel_rl_server.scalar("SELECT outcome_reward_name()") == RewardSettings().name == RewardSpec().name


def test_the_view_follows_the_reward_a_run_trains_on_and_no_rollout_key_can_change_it(otel_rl_server) -> None:
    run_id = "spec-" + uuid.uuid4().hex[:8]
    rollout_id = f"{run_id}-rollout"
    key = rollout_key(otel_rl_server, rollout_id, group_id=f"{run_id}-group")
    export(otel_rl_server, "traces", one_span("harness", "work", [], time.time_ns()), key, "protobuf")
    harness = reward_logs(
        {"attributes": evaluation("outcome", 1.0, rollout_id)},
        {"attributes": evaluation(FRAMEWORK_NAME, 0.25, rollout_id)},
        {"attributes": evaluation(FRAMEWORK_NAME, 0.75, rollout_id)},
    )
    export(otel_rl_server, "logs", harness, key, "protobuf")
    assert post_reward(otel_rl_server, {"rollout_id": rollout_id, "value": 0.0}).status_code == 200
    settings = RewardSettings(name=FRAMEWORK_NAME, trusted_sources=[attr.REWARD_SOURCE_HARNESS])
    view = (
        "SELECT outcome_reward, outcome_reward_spec AS spec, outcome_rewards_by_source AS by_source"
        f" FROM rollouts WHERE rollout_id = '{rollout_id}'"
    )
    default = {"name": "outcome", "rule": "last", "trusted_sources": ["grader"], "run_id": None}

    # the harness, holding its rollout key, reports the same reward spec as a trainer would: nothing changes
    forged = [kv(attr.TRAIN_RUN_ID, run_id)] + [
        kv(name, AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in value])))
        if isinstance(value, list)
        else kv(name, value)
        for name, value in reward_attributes(settings.spec()).items()
    ]
    claim = one_span(attr.TRAIN_SCOPE, attr.TRAIN_RUN_SPAN_NAME, forged, time.time_ns())
    export(otel_rl_server, "traces", claim, key, "protobuf")
    wait_for(
        otel_rl_server,
        f"SELECT count(*) FROM spans WHERE attributes ->> '{attr.TRAIN_RUN_ID}' = '{run_id}'",
        1,
    )
    (rollout,) = otel_rl_server.sql(view).to_pylist()
    assert rollout == {
        "outcome_reward": 0.0,
        "spec": default,
        "by_source": [("grader", 0.0), ("harness", 1.0)],
    }

    # its trainer reports it (the admin token): the view shows what training computes from the same records
    recorder = RunRecorder(otel_rl_server.http_url, otel_rl_server.token, run_id, settings.spec())
    recorder.start()
    recorder.close()
    reported = f"SELECT outcome_reward_spec.run_id FROM rollouts WHERE rollout_id = '{rollout_id}'"
    wait_for(otel_rl_server, reported, run_id)
    (rollout,) = otel_rl_server.sql(view).to_pylist()
    records = reads.rollout_rewards(otel_rl_server.run, [rollout_id])
    assert outcome_rewards(records, settings.spec())["reward"].to_list() == [0.75]
    assert rollout == {
        "outcome_reward": 0.75,
        "spec": {"name": FRAMEWORK_NAME, "rule": "last", "trusted_sources": ["harness"], "run_id": run_id},
        "by_source": [("harness", 0.75)],
    }
    shown = page_rewards(otel_rl_server.http_url, otel_rl_server.token, rollout_id)
    assert shown["reward"] == "0.75"
    assert shown["spec"] == f"{FRAMEWORK_NAME} from harness, rule last (run {run_id})"


RULES = [
    ("last", ["grader"]),
    ("mean", ["grader", "harness"]),
    ("max", ["any"]),
    ("sum", ["harness"]),
    ("mean", ["nobody"]),
]


def test_the_view_and_training_combine_rewards_by_one_rule(otel_rl_server) -> None:
    """Training's Python (outcome_rewards) and the view's SQL, over the same records, for every rule."""
    tag = uuid.uuid4().hex[:8]
    expected, rollout_ids = {}, []
    for i, (rule, sources) in enumerate(RULES):
        run_id, rollout_id = f"rule{i}-{tag}", f"rule{i}-{tag}-rollout"
        key = rollout_key(otel_rl_server, rollout_id, group_id=f"{run_id}-group")
        export(otel_rl_server, "traces", one_span("harness", "work", [], time.time_ns()), key, "protobuf")
        harness = reward_logs(
            *({"attributes": evaluation(FRAMEWORK_NAME, v, rollout_id)} for v in (0.5, 0.25))
        )
        export(otel_rl_server, "logs", harness, key, "protobuf")
        for value in (0.125, 1.0):
            body = {"rollout_id": rollout_id, "value": value, "name": FRAMEWORK_NAME}
            assert post_reward(otel_rl_server, body).status_code == 200
        # with the admin token and no source: only `any` trusts it
        unsourced = reward_logs({"attributes": evaluation(FRAMEWORK_NAME, 2.0, rollout_id)})
        export(otel_rl_server, "logs", unsourced, otel_rl_server.token, "protobuf")
        spec = RewardSettings(name=FRAMEWORK_NAME, rule=rule, trusted_sources=sources).spec()
        recorder = RunRecorder(otel_rl_server.http_url, otel_rl_server.token, run_id, spec)
        recorder.start()
        recorder.close()
        records = reads.rollout_rewards(otel_rl_server.run, [rollout_id])
        assert records.height == 5
        given = outcome_rewards(records, spec)["reward"].to_list()
        expected[rollout_id] = given[0] if given else None
        rollout_ids.append(rollout_id)
    assert list(expected.values()) == [1.0, 0.46875, 2.0, 0.75, None]
    ids = ", ".join(f"'{rollout_id}'" for rollout_id in rollout_ids)
    reported = f"SELECT count(outcome_reward_spec.run_id) FROM rollouts WHERE rollout_id IN ({ids})"
    wait_for(otel_rl_server, reported, len(RULES))
    shown = otel_rl_server.sql(f"SELECT rollout_id, outcome_reward FROM rollouts WHERE rollout_id IN ({ids})")
    assert dict(zip(*shown.to_pydict().values(), strict=True)) == expected


def test_the_view_names_the_reward_training_uses_by_default(otel_rl_server) -> None:
    spec = RewardSpec()
    assert otel_rl_server.sql("SELECT default_reward_spec() AS spec").to_pylist() == [
        {"spec": {"name": spec.name, "rule": spec.rule, "trusted_sources": list(spec.trusted_sources)}}
    ]


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
        facts = await page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('dl.facts dt')]"
            ".map((dt) => [dt.textContent, dt.nextElementSibling.textContent]))"
        )
        shown.update(
            reward=facts["reward"], spec=facts["reward spec"], by_name=rows, errors=list(page.errors)
        )

    with chromium() as endpoint:
        asyncio.run(with_page(endpoint, scenario))
    assert shown.pop("errors") == [], json.dumps(shown)
    return shown
