"""The training backend switch in the configuration: validated before anything starts, errors name the key."""

import pytest
from typer.testing import CliRunner

from otel_rl.cli import app
from otel_rl.train.config import ConfigError, config_from_dict


def test_the_backend_is_local_unless_the_config_says_verl():
    assert config_from_dict({"model": "m"}).backend == "local"
    with pytest.raises(ConfigError, match="backend: Input should be 'local' or 'verl'"):
        config_from_dict({"model": "m", "backend": "tpu"})


def test_a_verl_section_without_the_verl_backend_is_an_error_not_ignored():
    with pytest.raises(ConfigError, match="verl: settings for verl's engine need `backend: verl`"):
        config_from_dict({"model": "m", "verl": {"trainer": {"nnodes": 2}}})


def test_verls_own_keys_are_checked_and_a_bad_one_is_named(tmp_path):
    accepted = config_from_dict({"model": "m", "backend": "verl", "verl": {"trainer": {"nnodes": 1}}})
    assert accepted.verl == {"trainer": {"nnodes": 1}}

    with pytest.raises(ConfigError, match=r"verl\.trainer\.nnodez"):
        config_from_dict({"model": "m", "backend": "verl", "verl": {"trainer": {"nnodez": 1}}})

    # From the command line, before anything starts: no output folder, no run id.
    path = tmp_path / "train.yaml"
    output = tmp_path / "out"
    path.write_text(
        f"model: m\noutput_dir: {output}\nbackend: verl\n"
        "verl: {actor_rollout_ref: {actor: {ppo_epochz: 2}}}\n"
        f"online: {{tasks: {path}, harness: [echo]}}\n"
    )
    result = CliRunner().invoke(app, ["train", "--config", str(path)])
    assert result.exit_code == 1 and "verl.actor_rollout_ref.actor.ppo_epochz" in result.output
    assert not output.exists()


def test_sft_with_the_verl_backend_is_refused_before_anything_starts(tmp_path):
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    path = tmp_path / "sft.yaml"
    path.write_text(f"model: m\noutput_dir: {tmp_path / 'out'}\nbackend: verl\n")
    result = CliRunner().invoke(app, ["train", "--config", str(path), "--sft", "--chats", str(chats)])
    assert result.exit_code == 1 and "SFT needs `backend: local`" in result.output
    assert not (tmp_path / "out").exists()


def test_a_harness_env_that_sets_a_contract_variable_is_refused_when_the_config_loads():
    for section in ("online", "eval"):
        with pytest.raises(ConfigError, match=rf"{section}\.env: harness env may not set OPENAI_API_KEY"):
            config_from_dict(
                {"model": "m", section: {"env": {"OPENAI_API_KEY": "k", "OTEL_SERVICE_NAME": "a"}}}
            )
    assert config_from_dict({"model": "m", "online": {"env": {"OTEL_SERVICE_NAME": "a"}}}).online.env == {
        "OTEL_SERVICE_NAME": "a"
    }
