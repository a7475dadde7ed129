"""Rewards as harnesses send them: a `gen_ai.evaluation.result` from an untrusted source, or with no
`otel_rl.reward.source` at all, is reported as untrusted (not missing) with the option that trusts it, by
`otel-rl export` and by the online loop; `--trusted-source any` (`trusted_sources: [any]`) trusts them all.

Rewards go out with the OTel SDK's OTLP exporters to a real `otel-rl serve`, calls through its gateway."""

import io
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import polars as pl
import pytest
from fake_vllm import FakeVLLM
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from otel_rl_server import ServerProcess
from pydantic import ValidationError
from rich.console import Console
from typer.testing import CliRunner

from otel_rl import attributes as attr
from otel_rl.cli import app
from otel_rl.train.config import ConfigError, config_from_dict
from otel_rl.train.online import run_online
from otel_rl.train.server_client import OnlineTrainingError
from otel_rl.transforms.rewards import RewardSpec

ROOT = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, str(ROOT / "examples" / "calc_agent.py")]
OTEL_RL = str(Path(sys.executable).parent / "otel-rl")
WIDE = {"COLUMNS": "400"}  # the report table on one line per row, as a wide terminal shows it


def evaluation(rollout_id: str, value: float, source: str | None) -> dict:
    """A GenAI evaluation event's attributes, as any harness or grader writes them; `source` None: none."""
    found = {attr.EVALUATION_NAME: "outcome", attr.EVALUATION_SCORE_VALUE: value, attr.ROLLOUT_ID: rollout_id}
    return found | ({attr.REWARD_SOURCE: source} if source is not None else {})


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    """A server in front of a fake vLLM, one call per rollout through its gateway, and each rollout's reward:
    none_log and none_event without a source (a log record, a span event), harness's and grader's with
    theirs, and missing with no reward at all. Yields the server and the rollout ids by name."""
    workdir = tmp_path_factory.mktemp("trust")
    with FakeVLLM() as fake:
        server = ServerProcess(workdir / "trust.duckdb", workdir, flags=("--vllm", fake.base_url)).start()
        ids = {name: uuid.uuid4().hex for name in ("none_log", "none_event", "harness", "grader", "missing")}
        try:
            for rollout_id in ids.values():
                headers = server.auth | {attr.IDENTITY_HEADERS[attr.ROLLOUT_ID]: rollout_id}
                headers |= {attr.IDENTITY_HEADERS[attr.GROUP_ID]: "trust"}
                body = {"model": fake.model, "messages": [{"role": "user", "content": "What is 2+3?"}]}
                response = httpx.post(f"{server.http_url}/v1/chat/completions", json=body, headers=headers)
                assert response.status_code == 200, response.text
            send_rewards(server, ids)
            # this server's store holds these rollouts only (all in group "trust")
            wait_for(server, "SELECT count(*) FROM rewards", 4)
            wait_for(server, "SELECT count(*) FROM llm_calls", 5)
            yield server, ids
        finally:
            server.stop()


def send_rewards(server: ServerProcess, ids: dict[str, str]) -> None:
    logs = LoggerProvider()
    logs.add_log_record_processor(
        SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{server.http_url}/v1/logs", headers=server.auth))
    )
    logger = logs.get_logger("a-grader")
    for name, source in (("none_log", None), ("harness", attr.REWARD_SOURCE_HARNESS), ("grader", "grader")):
        logger.emit(event_name=attr.EVALUATION_EVENT, attributes=evaluation(ids[name], 1.0, source))
    logs.shutdown()
    spans = TracerProvider()
    spans.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{server.http_url}/v1/traces", headers=server.auth))
    )
    with spans.get_tracer("a-harness").start_as_current_span(
        "task", attributes={attr.ROLLOUT_ID: ids["none_event"]}
    ) as span:
        span.add_event(attr.EVALUATION_EVENT, evaluation(ids["none_event"], 1.0, None))
    spans.shutdown()


def wait_for(server: ServerProcess, sql: str, expected: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (found := server.scalar(sql)) != expected:
        assert time.monotonic() < deadline, f"{sql}: {found}, not {expected}"
        time.sleep(0.2)


def export(server: ServerProcess, ids: dict[str, str], out: Path, *flags: str):
    where = "group_id = 'trust'"
    args = ["export", "samples", "--server", server.http_url, "--token", server.token, "--where", where]
    result = CliRunner().invoke(app, [*args, "-o", str(out), *flags], env=WIDE)
    assert result.exit_code == 0, result.output
    return result.output, {rollout for rollout in pl.read_parquet(out)["rollout_id"]}


def test_export_reports_rewards_without_a_trusted_source_as_untrusted_and_names_the_option(
    rollouts, tmp_path
):
    server, ids = rollouts
    output, exported = export(server, ids, tmp_path / "samples.parquet")
    assert exported == {ids["grader"]}
    assert "missing_reward: 1, untrusted_reward: 3" in output
    untrusted = "no source (2), source 'harness' (1)"
    assert f"{untrusted}; trust them with --trusted-source harness or --trusted-source any" in output


def test_trusted_source_any_trusts_every_source_and_rewards_without_one(rollouts, tmp_path):
    server, ids = rollouts
    output, exported = export(server, ids, tmp_path / "samples.parquet", "--trusted-source", "any")
    assert exported == {ids[name] for name in ("none_log", "none_event", "harness", "grader")}
    assert "missing_reward: 1" in output and "untrusted" not in output


def test_only_any_trusts_a_reward_sent_without_a_source(rollouts, tmp_path):
    server, ids = rollouts
    trust = ["--trusted-source", "harness", "--trusted-source", "grader"]
    output, exported = export(server, ids, tmp_path / "samples.parquet", *trust)
    assert exported == {ids["harness"], ids["grader"]}
    assert "untrusted_reward: 2" in output and "no source (2); trust them with --trusted-source any" in output


def test_a_fill_value_still_reports_the_rewards_it_replaced(rollouts, tmp_path):
    server, ids = rollouts
    output, exported = export(server, ids, tmp_path / "samples.parquet", "--missing-reward", "0")
    assert exported == set(ids.values())
    assert "dropped rollouts" not in output
    assert "no source (2), source 'harness' (1); trust them with --trusted-source harness" in output


def test_the_sft_export_reports_untrusted_rewards_too(rollouts, tmp_path):
    server, ids = rollouts
    where = "group_id = 'trust'"
    args = ["export", "sft", "--server", server.http_url, "--token", server.token, "--where", where]
    result = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "sft.jsonl")], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "untrusted_reward: 3" in result.output and "--trusted-source any" in result.output


def test_a_training_config_trusts_any_source_and_needs_at_least_one():
    config = config_from_dict({"model": "m", "reward": {"trusted_sources": ["any"]}})
    assert config.reward.spec().trusted_sources == ("any",)
    with pytest.raises(ConfigError, match="reward.trusted_sources"):
        config_from_dict({"model": "m", "reward": {"trusted_sources": []}})


def test_an_unknown_reward_rule_is_refused_naming_the_option_and_the_rules():
    result = CliRunner().invoke(
        app, ["export", "samples", "--where", "true", "--reward-rule", "median"], env=WIDE
    )
    assert result.exit_code == 2 and "--reward-rule" in result.output
    assert "'median' is not one of 'last', 'mean', 'max', 'sum'" in " ".join(
        result.output.replace("│", " ").split()
    )
    with pytest.raises(ValidationError, match="rule"):
        RewardSpec(rule="median")


# --- the online loop, on the tiny model behind the real gateway ----------------------------------------


@pytest.fixture(scope="module")
def gateway(vllm_server, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("trust_online")
    server = ServerProcess(workdir / "online.duckdb", workdir, flags=("--vllm", vllm_server.url)).start()
    yield server
    server.stop()


def test_the_online_loop_names_untrusted_harness_rewards_and_the_setting_that_trusts_them(
    gateway, tiny_model_dir, tmp_path
):
    sys.path.insert(0, str(ROOT / "examples"))
    from calc_task import sample_tasks, split_problems, write_tasks

    tasks = write_tasks(tmp_path / "train.jsonl", sample_tasks(split_problems()[0], 4, "train", seed=0))
    config = config_from_dict(
        {
            "model": str(tiny_model_dir),
            "output_dir": str(tmp_path / "run"),
            "steps": 1,
            "server": {"url": gateway.http_url, "token": gateway.token},
            "algorithm": {"group_size": 1, "groups_per_step": 1},
            # the default trust: the calculator agent grades itself, so its rewards are the harness's
            "online": {"tasks": str(tasks), "harness": AGENT},
        }
    )
    printed = io.StringIO()
    with pytest.raises(OnlineTrainingError) as stopped:
        run_online(config, Console(file=printed, width=400))
    because = (
        "untrusted_reward: 1 (untrusted rewards: source 'harness' (1); trust them with "
        'reward.trusted_sources: ["harness"] or reward.trusted_sources: ["any"])'
    )
    assert f"three batches of groups in a row gave no samples ({because})" in str(stopped.value)
    assert printed.getvalue().count(f"1 groups gave 0 samples: {because}") == 3


@pytest.mark.parametrize(("kind", "output"), [("samples", "samples.parquet"), ("sft", "sft.jsonl")])
def test_an_export_that_keeps_no_rollout_exits_1_and_names_the_option_that_would_keep_it(
    rollouts, tmp_path, kind, output
):
    server, ids = rollouts
    out = tmp_path / output
    args = ["export", kind, "--server", server.http_url, "--token", server.token, "-o", str(out)]
    result = subprocess.run(
        [OTEL_RL, *args, "--where", f"rollout_id = '{ids['harness']}'"],
        capture_output=True,
        text=True,
        env=os.environ | WIDE,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith(
        f"error: no {'samples' if kind == 'samples' else 'conversations'} written: of 1 rollouts"
    )
    assert "untrusted_reward: 1" in error and "trust them with --trusted-source harness" in error
    assert not out.exists()


def test_an_export_whose_where_matches_no_rollout_says_so(rollouts, tmp_path):
    server, _ = rollouts
    args = ["export", "samples", "--server", server.http_url, "--token", server.token]
    result = subprocess.run(
        [OTEL_RL, *args, "--where", "rollout_id = 'no-such-rollout'", "-o", str(tmp_path / "s.parquet")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "error: no samples written: no rollout matches --where" in result.stderr


def test_offline_training_that_keeps_no_rollout_exits_1_naming_the_setting_that_would(
    rollouts, tmp_path, tiny_model_dir
):
    server, ids = rollouts
    config = tmp_path / "train.yaml"
    config.write_text(
        f"model: {tiny_model_dir}\noutput_dir: {tmp_path / 'run'}\nsteps: 1\n"
        f"server: {{url: {server.http_url}, token: {server.token}}}\n"
    )
    result = subprocess.run(
        [
            OTEL_RL,
            "train",
            "--config",
            str(config),
            "--offline",
            "--where",
            f"rollout_id = '{ids['harness']}'",
        ],
        capture_output=True,
        text=True,
        env=os.environ | WIDE,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    output = " ".join((result.stdout + result.stderr).split())
    assert "error: no usable samples among the rollouts where" in output
    assert "untrusted_reward: 1" in output and 'trust them with reward.trusted_sources: ["harness"]' in output
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").glob("step-*"))
