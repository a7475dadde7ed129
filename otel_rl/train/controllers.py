"""The online loop's rollout controllers, opened through the configured controller backend (`controller`)."""

from __future__ import annotations

from pathlib import Path

from otel_rl.controller import ControllerSettings
from otel_rl.controller.backends import RolloutRunner, open_controller
from otel_rl.train.config import TrainConfig
from otel_rl.train.server_client import ServerClient


def train_settings(config: TrainConfig, log_dir: Path | None = None) -> ControllerSettings:
    """How the training rollouts run: `online`'s harness, limits and retries; logs in `log_dir` (default:
    output_dir/rollouts)."""
    online = config.online
    return ControllerSettings(
        command=online.harness,
        concurrency=online.concurrency,
        timeout_s=online.timeout_s,
        max_attempts=online.max_attempts,
        log_dir=log_dir or config.output_dir / "rollouts",
        env=online.env,
        preload=online.preload,
        nice=online.nice,
    )


def eval_settings(config: TrainConfig, command: str | list[str], log_dir: Path) -> ControllerSettings:
    """An eval command's rollouts: the training rollouts' limits, with eval.env over online.env."""
    changes = {"command": command, "env": {**config.online.env, **config.eval.env}}
    # validated again: the eval command must suit `preload` too
    return ControllerSettings.model_validate(train_settings(config, log_dir).model_dump() | changes)


def open_runner(
    config: TrainConfig, client: ServerClient, settings: ControllerSettings, run_id: str
) -> RolloutRunner:
    """A controller whose harnesses export to, and call the model through, the server `client` talks to."""
    return open_controller(
        config.controller,
        settings,
        otlp_endpoint=client.url,
        openai_base_url=f"{client.url}/v1",
        token=client.token,
        issue_key=client.issue_rollout_key,
        revoke_key=client.revoke_rollout_key,
        run_id=run_id,
        post_reward=client.post_reward,
    )
