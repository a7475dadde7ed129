"""`otel-rl rollouts run` and the `controller` config section: both backends, through the real CLI."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from kube_api import KubeApiStandIn
from kube_child import TEMPLATE
from typer.testing import CliRunner

from otel_rl.cli import app
from otel_rl.train.config import ConfigError, config_from_dict
from otel_rl.train.rollouts_cli import rollout_ids


def write_config(tmp_path: Path, server, controller: dict, harness: list[str]) -> Path:
    config = {
        "model": str(tmp_path / "model"),
        "output_dir": str(tmp_path / "out"),
        "server": {"url": server.http_url, "token": server.token},
        "online": {"harness": harness, "timeout_s": 5, "max_attempts": 2},
        "controller": controller,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def write_tasks(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {"id": "t-ok", "behaviour": "ok", "question": "q"},
                {"id": "t-fail", "behaviour": "fail", "question": "q"},
            ]
        )
    )
    return path


def run_cli(*args: str) -> list[dict]:
    result = CliRunner().invoke(app, ["rollouts", "run", *args])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_kubernetes_backend_through_a_kubeconfig(otel_rl_server, tmp_path):
    with KubeApiStandIn() as stand:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "stand-in", "cluster": {"server": stand.url}}],
                    "users": [{"name": "tester", "user": {"token": "not-checked"}}],
                    "contexts": [{"name": "test", "context": {"cluster": "stand-in", "user": "tester"}}],
                    "current-context": "test",
                }
            )
        )
        controller = {
            "backend": "kubernetes",
            "kubernetes": {"template": str(TEMPLATE), "kubeconfig": str(kubeconfig), "pending_timeout_s": 5},
        }
        config = write_config(tmp_path, otel_rl_server, controller, ["harness"])
        lines = run_cli(
            str(write_tasks(tmp_path)), "--config", str(config), "--n", "2", "--run-id", "cli-run"
        )
        assert sorted((line["task_id"], line["status"], line["exit_code"]) for line in lines) == [
            ("t-fail", "error", 1),
            ("t-fail", "error", 1),
            ("t-ok", "ok", 0),
            ("t-ok", "ok", 0),
        ]
        assert {line["rollout_id"] for line in lines} == {
            rollout_ids("cli-run", i, s)[0] for i in (0, 1) for s in (0, 1)
        }
        assert all(line["group_id"].startswith("cli-run-") for line in lines)
        assert stand.invalid == [] and stand.call(stand.of_kind, "Job") == []
        assert stand.call(stand.of_kind, "Secret") == []


def test_local_backend_runs_processes(otel_rl_server, tmp_path):
    harness = [
        sys.executable,
        "-c",
        "import json, os, sys; sys.exit(json.loads(os.environ['OTEL_RL_TASK'])['id'] != 't-ok')",
    ]
    config = write_config(tmp_path, otel_rl_server, {"backend": "local"}, harness)
    lines = run_cli(str(write_tasks(tmp_path)), "--config", str(config))
    assert sorted((line["task_id"], line["status"]) for line in lines) == [
        ("t-fail", "error"),
        ("t-ok", "ok"),
    ]


def test_the_controller_section_is_validated(tmp_path):
    with pytest.raises(ConfigError, match="backend kubernetes needs"):
        config_from_dict({"model": "m", "controller": {"backend": "kubernetes"}})
    with pytest.raises(ConfigError, match="backend is local"):
        config_from_dict({"model": "m", "controller": {"kubernetes": {"template": "t.yaml"}}})
    with pytest.raises(ConfigError, match="namespace"):
        config_from_dict(
            {
                "model": "m",
                "controller": {"backend": "kubernetes", "kubernetes": {"template": "t", "namespace": "A_B"}},
            }
        )
    with pytest.raises(ConfigError, match="jobs_per_second"):
        config_from_dict(
            {
                "model": "m",
                "controller": {
                    "backend": "kubernetes",
                    "kubernetes": {"template": "t", "jobs_per_second": 0},
                },
            }
        )
