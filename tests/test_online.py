"""The online loop: tasks → groups → samples → update → reload, on the tiny model behind the real gateway."""

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from from_scratch import ScratchViews
from otel_rl_server import ServerProcess

from otel_rl import attributes as attr
from otel_rl.gateway.vllm import free_ports
from otel_rl.train.config import ConfigError, TrainConfig, config_from_dict
from otel_rl.train.groups import final_attempts_only, oldest_versions, read_groups, reusable_groups
from otel_rl.train.online import run_online
from otel_rl.train.records import StepRecord
from otel_rl.train.server_client import OnlineTrainingError, ServerClient
from otel_rl.train.tasks import read_tasks, task_for_group
from otel_rl.transforms.samples import SampleOptions, build_samples


def test_tasks_come_once_per_epoch_in_a_seeded_order(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "q": i}) + "\n" for i in range(5)))
    tasks = read_tasks(path)
    first_epoch = [task_for_group(tasks, i, seed=1).task_id for i in range(5)]
    second_epoch = [task_for_group(tasks, i, seed=1).task_id for i in range(5, 10)]
    assert sorted(first_epoch) == sorted(second_epoch) == [f"t{i}" for i in range(5)]
    assert first_epoch != second_epoch  # reshuffled each epoch (fixed by the seed)
    assert first_epoch == [task_for_group(tasks, i, seed=1).task_id for i in range(5)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no tasks"),
        ('{"id": 1}\nnot json\n', ":2: not JSON"),
        ('{"q": 1}\n', ':1: a task is a JSON object with an "id"'),
    ],
)
def test_a_bad_tasks_file_names_the_line(tmp_path, text, message):
    path = tmp_path / "tasks.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_tasks(path)


def test_a_restart_reuses_only_complete_fresh_unused_groups():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = pl.DataFrame(
        [
            {
                "group_id": g,
                "status": status,
                "policy_version_min": version,
                "ended_at": t0 + timedelta(seconds=end),
            }
            for g, status, version, end in [
                ("done", "ok", 4, 2),
                ("done", "crashed", 4, 3),  # a final infrastructure failure: finished, samples leave it out
                ("short", "ok", 4, 1),  # the loop died before its second rollout started
                ("running", "ok", 4, 1),
                ("running", "running", 4, 1),
                ("stale", "ok", 2, 1),
                ("stale", "ok", 3, 1),
                ("used", "ok", 4, 1),
                ("used", "ok", 4, 1),
                ("no_calls", "error", None, 0),
                ("no_calls", "error", None, 0),
            ]
        ]
    )
    found = reusable_groups(rows, consumed={"used"}, group_size=2, trained=4, max_staleness=1)
    assert found == ["no_calls", "done"]


def test_only_the_final_attempts_calls_and_rewards_are_trained_on():
    t = datetime(2026, 1, 1, tzinfo=UTC)
    ns = int(t.timestamp() * 1e9)
    attempts = pl.DataFrame({"rollout_id": ["r"], "final_attempt": ["a2"], "attempt_start_ns": [ns + 10]})
    calls = pl.DataFrame(
        {
            "rollout_id": ["r"] * 4,
            "attempt_id": ["a1", None, "a2", None],
            "start_time_unix_nano": [ns + 1, ns + 2, ns + 11, ns + 12],
            "span_id": ["old", "old_unknown", "new", "new_unknown"],
        }
    )
    # the first attempt's reward dated in the future by its sender: received before the final attempt began
    rewards = pl.DataFrame(
        {
            "rollout_id": ["r", "r"],
            "time": [t + timedelta(days=365), t + timedelta(seconds=1)],
            "received_at": [t, t + timedelta(seconds=1)],
            "value": [0.0, 1.0],
        }
    )
    kept_calls, kept_rewards = final_attempts_only(calls, rewards, attempts)
    assert kept_calls["span_id"].to_list() == ["new", "new_unknown"]
    assert kept_calls.columns == calls.columns
    assert kept_rewards["value"].to_list() == [1.0]


def test_a_groups_age_is_its_oldest_sampled_call():
    calls = pl.DataFrame({"attempt_id": ["a1", "a1", "a2", "b1"], "policy_version": [3, 4, 2, None]})
    groups = {"a1": "g1", "a2": "g1", "b1": "g2", "c1": "g3"}
    assert oldest_versions(calls, groups) == {"g1": 2, "g2": None, "g3": None}


# --- the whole loop on the tiny model ------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, str(ROOT / "examples" / "calc_agent.py")]


@pytest.fixture(scope="module")
def gateway(vllm_server, tmp_path_factory):
    """`otel-rl serve` with its gateway in front of the session's vLLM server (tiny model)."""
    workdir = tmp_path_factory.mktemp("online")
    server = ServerProcess(workdir / "online.duckdb", workdir, flags=("--vllm", vllm_server.url)).start()
    yield server
    server.stop()


def calc_tasks(path: Path, n: int, split: str) -> Path:
    sys.path.insert(0, str(ROOT / "examples"))
    from calc_task import sample_tasks, split_problems, write_tasks

    train, heldout = split_problems()
    return write_tasks(path, sample_tasks(train if split == "train" else heldout, n, split, seed=0))


def calc_config(
    server: ServerProcess, model: Path, out: Path, steps: int, max_staleness: int = 0, **eval_settings
) -> TrainConfig:
    """An online run of the calculator agent, groups of 2, two a step, trusting the agent's own reward."""
    return config_from_dict(
        {
            "model": str(model),
            "output_dir": str(out / "run"),
            "steps": steps,
            "server": {"url": server.http_url, "token": server.token},
            "algorithm": {"group_size": 2, "groups_per_step": 2, "max_staleness": max_staleness},
            "reward": {"trusted_sources": ["harness"]},  # the calculator agent grades itself
            "online": {"tasks": str(calc_tasks(out / "train.jsonl", 8, "train")), "harness": AGENT},
            "eval": eval_settings,
        }
    )


def assert_trained_only_on_the_version_before(
    gateway: ServerProcess, steps: list[StepRecord], max_staleness: int = 0
) -> None:
    """Every call of the groups a step trained on was sampled by one of the `max_staleness + 1` policies
    before it (max_staleness 0: the policy right before it). (Also asserted of the verl backend, in
    test_online_verl.py.)"""
    for step in steps:
        versions = gateway.sql(
            "SELECT DISTINCT c.policy_version FROM llm_calls c "
            "JOIN rollouts r USING (rollout_id, attempt_id) "  # the final attempts, the ones trained on
            f"WHERE c.group_id IN ({', '.join('?' * len(step.group_ids))})",
            step.group_ids,
        ).column(0)
        allowed = set(range(step.policy_version - 1 - max_staleness, step.policy_version))
        assert versions.to_pylist() and set(versions.to_pylist()) <= allowed


def assert_same_samples_as_the_views_from_scratch(
    gateway: ServerProcess, config: TrainConfig, steps: list[StepRecord]
) -> None:
    """Each step's samples, read as the loop reads them from the tables the store maintains, equal those of
    the same reads over the views computed from scratch over the run's raw rows (how the store answered
    before it maintained them): on the same recorded traffic, the same samples."""
    scratch = ScratchViews(
        {table: gateway.sql(f"SELECT * FROM {table}") for table in ("spans", "call_tokens", "logs")}
    )
    for step in steps:
        options = SampleOptions(
            reward=config.reward.spec(),
            estimator=config.algorithm.advantage_estimator,
            current_policy_version=step.policy_version - 1,
            max_staleness=config.algorithm.max_staleness,
        )
        built = [
            build_samples(*read_groups(query, step.group_ids), options=options)[0]
            for query in (gateway.run, scratch.query)
        ]
        maintained, from_scratch = (samples.sort("segment_id") for samples in built)
        differing = [c for c in maintained.columns if not maintained[c].equals(from_scratch[c])]
        assert maintained.height == step.samples and not differing, (differing, maintained, from_scratch)


def recorded_versions(gateway: ServerProcess, run_id: str) -> list[tuple[str, int]]:
    """The run's step and eval spans in the store, in order: (span name, policy version)."""
    recorded = gateway.sql(
        f"SELECT name, attributes ->> '{attr.POLICY_VERSION}' AS version FROM spans "
        f"WHERE scope_name = '{attr.TRAIN_SCOPE}' "
        f"AND name IN ('{attr.TRAIN_STEP_SPAN_NAME}', '{attr.TRAIN_EVAL_SPAN_NAME}') "
        f"AND attributes ->> '{attr.TRAIN_RUN_ID}' = '{run_id}' "
        "ORDER BY start_time_unix_nano"
    ).to_pylist()
    return [(r["name"], int(r["version"])) for r in recorded]


def test_two_online_steps_advance_the_policy_and_use_no_stale_sample(gateway, tiny_model_dir, tmp_path):
    def config(steps: int, **eval_settings) -> TrainConfig:
        return calc_config(gateway, tiny_model_dir, tmp_path, steps, **eval_settings)

    client = ServerClient(gateway.http_url, gateway.token)
    start_version = client.policy()["version"]
    val = calc_tasks(tmp_path / "val.jsonl", 2, "val")
    try:
        first = run_online(config(1, tasks=str(val), harness=[*AGENT, "--temperature", "0"]))
        # A second start on the same output folder resumes after step 1 instead of starting over.
        second = run_online(config(2))
    finally:
        # Other tests expect the session's vLLM server to serve the original weights.
        client.set_policy(tiny_model_dir, client.policy()["version"] + 1)

    steps = first.steps + second.steps
    assert [s.step for s in steps] == [1, 2]
    assert [s.policy_version for s in steps] == [start_version + 2, start_version + 3]
    assert first.run_id == second.run_id and not set(steps[0].group_ids) & set(steps[1].group_ids)
    assert all(s.samples > 0 and s.trainer["mismatch"] < 1e-3 for s in steps)
    assert [e.policy_version for e in first.evals] == [start_version + 1, start_version + 2]

    # Calls of both versions are in the store.
    assert_trained_only_on_the_version_before(gateway, steps)
    assert_same_samples_as_the_views_from_scratch(gateway, config(2), steps)
    v = start_version
    assert recorded_versions(gateway, first.run_id) == [
        (attr.TRAIN_EVAL_SPAN_NAME, v + 1),
        (attr.TRAIN_STEP_SPAN_NAME, v + 2),
        (attr.TRAIN_EVAL_SPAN_NAME, v + 2),
        (attr.TRAIN_STEP_SPAN_NAME, v + 3),
    ]
    # the run reported the reward it trains on: its rollouts show the harness's, as it trusts
    shown = gateway.sql(
        "SELECT DISTINCT outcome_reward_spec AS spec FROM rollouts"
        f" WHERE starts_with(group_id, '{first.run_id}-')"
    ).to_pylist()
    assert shown == [
        {"spec": {"name": "outcome", "rule": "last", "trusted_sources": ["harness"], "run_id": first.run_id}}
    ]


def test_the_next_batch_is_built_while_the_update_runs(gateway, tiny_model_dir, tmp_path):
    """Step k+1's groups are collected and its samples built from the moment step k's update starts: what a
    step waits for its batch is then shorter than collecting and building it by the update, save and reload
    before it (or by all of it, when the batch was ready before the step began). With max_staleness 1 no
    sample is older than one version behind."""
    config = calc_config(gateway, tiny_model_dir, tmp_path, 3, max_staleness=1)
    client = ServerClient(gateway.http_url, gateway.token)
    try:
        steps = run_online(config).steps
    finally:
        client.set_policy(tiny_model_dir, client.policy()["version"] + 1)

    first, *later = steps
    assert first.batch_wait_s >= first.collect_s + first.transform_s  # nothing built it earlier
    for before, step in zip(steps, later, strict=False):
        built = step.collect_s + step.transform_s
        overlapped = built - step.batch_wait_s
        # less the event loop's turn between the update's start and the batch's collection's
        assert overlapped >= min(built, before.train_s + before.save_s + before.reload_s) - 0.25
        assert step.transform_waited_s <= step.transform_s
        assert step.batch_wait_s + step.train_s + step.save_s + step.reload_s <= step.wall_s + 0.05
    assert_trained_only_on_the_version_before(gateway, steps, max_staleness=1)
    assert_same_samples_as_the_views_from_scratch(gateway, config, steps)


def test_an_unreachable_server_is_named_in_the_error():
    client = ServerClient(f"http://127.0.0.1:{free_ports(1)[0]}", "token")
    with pytest.raises(OnlineTrainingError, match="cannot reach the otel-rl server at http://127.0.0.1:"):
        client.policy()
