"""An online step with `otel-rl serve --colocated` in front of the real (CPU) vLLM server: the server sleeps
while the trainer updates and wakes with its weights, and the step reports how long calls were held.
vLLM's CPU build serves /sleep, /wake_up and /is_sleeping in dev mode, pausing its scheduler, but frees no
memory (its worker ignores sleep); tests/test_gateway_colocated.py shows the gate against the stand-in."""

import httpx
import pytest
from otel_rl_server import ServerProcess
from test_online import assert_trained_only_on_the_version_before, calc_config

from otel_rl.train.online import run_online
from otel_rl.train.server_client import ServerClient


@pytest.fixture(scope="module")
def colocated(vllm_server, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("colocated")
    flags = ("--vllm", vllm_server.url, "--colocated")
    server = ServerProcess(workdir / "colocated.duckdb", workdir, flags=flags).start()
    yield server
    server.stop()


def test_an_online_step_sleeps_the_server_for_the_update(colocated, vllm_server, tiny_model_dir, tmp_path):
    config = calc_config(colocated, tiny_model_dir, tmp_path, 1)
    client = ServerClient(colocated.http_url, colocated.token)
    assert client.policy()["colocated"] is True
    try:
        [step] = run_online(config).steps
    finally:  # other tests expect the session's vLLM server to serve the original weights
        client.set_policy(tiny_model_dir, client.policy()["version"] + 1)
    # The calls were held from before the update to after the reload: the pause spans the training.
    assert step.colocated_pause_s is not None
    assert step.colocated_pause_s >= step.train_s + step.save_s
    assert step.colocated_pause_s == pytest.approx(step.paused_s)
    assert_trained_only_on_the_version_before(colocated, [step])
    assert httpx.get(vllm_server.url.removesuffix("/v1") + "/is_sleeping").json() == {"is_sleeping": False}
    [reload] = colocated.sql(
        "SELECT attributes->>'otel_rl.reload.colocated' AS how,"
        " attributes->>'otel_rl.reload.sleep_ms' AS sleep"
        " FROM spans WHERE name = 'otel_rl.reload' AND attributes->>'otel_rl.reload.colocated' IS NOT NULL"
    ).to_pylist()
    assert reload["how"] == "woken" and float(reload["sleep"]) > 0
    [recorded] = colocated.sql(
        "SELECT attributes->>'otel_rl.train.colocated_pause_s' AS pause FROM spans"
        " WHERE name = 'otel_rl.train.step'"
    ).to_pylist()
    assert float(recorded["pause"]) == pytest.approx(step.colocated_pause_s)
