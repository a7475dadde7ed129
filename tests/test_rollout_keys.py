"""A rollout key acts for one attempt, until its attempt ends, it expires or the admin revokes it; the server
never prints the admin token. Each attack as a client sends it, against `otel-rl serve` on loopback."""

import os
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from fake_vllm import MODEL, FakeVLLM
from otel_rl_server import OTEL_RL, ServerProcess
from test_collector_http import PROTOBUF, spans_request

from otel_rl.controller import Controller, ControllerSettings, Rollout
from otel_rl.controller.rollouts import RolloutStatus, new_id
from otel_rl.gateway.vllm import free_ports
from otel_rl.train.server_client import ServerClient

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLM]:
    with FakeVLLM() as server:
        yield server


@pytest.fixture(scope="module")
def served(fake: FakeVLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("rollout_keys")
    server = ServerProcess(workdir / "otel_rl.duckdb", workdir, flags=("--vllm", fake.base_url)).start()
    yield server
    server.stop()


def issue(server: ServerProcess, rollout_id: str, attempt_id: str) -> str:
    body = {"attempt_id": attempt_id, "group_id": "g", "task_id": "t", "split": "train"}
    response = httpx.post(
        f"{server.http_url}/v1/admin/rollouts/{rollout_id}/key", json=body, headers=server.auth, timeout=10
    )
    assert response.status_code == 200, response.text
    return response.json()["key"]


def chat(server: ServerProcess, key: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{server.http_url}/v1/chat/completions", json=CHAT, headers=headers, timeout=10)


def export_spans(server: ServerProcess, key: str, rollout_id: str) -> httpx.Response:
    request, _ = spans_request(1, rollout_ids=[rollout_id])
    headers = {**PROTOBUF, "authorization": f"Bearer {key}"}
    return httpx.post(
        f"{server.http_url}/v1/traces", content=request.SerializeToString(), headers=headers, timeout=10
    )


def gateway_attempts(server: ServerProcess, rollout_id: str, expected: int, timeout_s: float = 10) -> list:
    """The attempt id of each gateway call recorded for the rollout, in call order (`expected` of them)."""
    sql = f"""SELECT attributes->>'otel_rl.attempt.id' FROM spans WHERE scope_name = 'otel_rl.gateway'
              AND attributes->>'otel_rl.rollout.id' = '{rollout_id}' ORDER BY start_time_unix_nano"""
    deadline = time.monotonic() + timeout_s
    while len(rows := server.sql(sql).column(0).to_pylist()) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return rows


def test_a_retried_attempts_key_is_refused_and_its_calls_stay_in_its_own_attempt(served) -> None:
    rollout = f"retried-{uuid.uuid4().hex[:12]}"
    old_key = issue(served, rollout, "attempt-1")
    assert chat(served, old_key).status_code == 200  # the first attempt, before its retry

    new_key = issue(served, rollout, "attempt-2")  # the controller retries the rollout
    stale = chat(served, old_key)
    assert stale.status_code == 401
    assert "attempt attempt-1 is no longer valid" in stale.text
    assert "superseded by attempt attempt-2" in stale.text
    assert export_spans(served, old_key, rollout).status_code == 401  # nor report spans or rewards
    assert chat(served, new_key).status_code == 200

    # the first attempt's call is in the first attempt, and nothing of it is in the one training uses
    assert gateway_attempts(served, rollout, expected=2) == ["attempt-1", "attempt-2"]


def test_the_admin_revokes_a_rollouts_key_for_good_and_a_rollout_key_cannot(served) -> None:
    rollout, other = f"revoked-{uuid.uuid4().hex[:12]}", f"kept-{uuid.uuid4().hex[:12]}"
    key, other_key = issue(served, rollout, "a"), issue(served, other, "a")
    url = f"{served.http_url}/v1/admin/rollouts/{rollout}/key"

    refused = httpx.delete(url, headers={"authorization": f"Bearer {other_key}"}, timeout=10)
    assert refused.status_code == 403 and export_spans(served, key, rollout).status_code == 200
    revoked = httpx.delete(url, headers=served.auth, timeout=10)
    assert revoked.status_code == 200 and revoked.json()["revoked"] == 1

    for response in (chat(served, key), export_spans(served, key, rollout)):
        assert response.status_code == 401 and "revoked by the admin" in response.text
    assert export_spans(served, other_key, other).status_code == 200  # another rollout's key works on
    assert httpx.delete(url, headers=served.auth, timeout=10).json()["revoked"] == 0


def test_otel_rl_rollouts_revoke_key_revokes_one_attempts_key(served) -> None:
    rollout = f"cli-{uuid.uuid4().hex[:12]}"
    key = issue(served, rollout, "attempt-1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {"OTEL_RL_TOKEN": served.token}
    command = [str(OTEL_RL), "rollouts", "revoke-key", rollout, "--attempt-id", "attempt-1"]
    done = subprocess.run(
        [*command, "--server", served.http_url], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"revoked 1 key(s) of attempt attempt-1 of rollout {rollout}"
    assert "revoked by the admin" in export_spans(served, key, rollout).text


def test_revocations_and_attempts_survive_a_restart(tmp_path) -> None:
    server = ServerProcess(tmp_path / "otel_rl.duckdb", tmp_path).start()
    try:
        old_key = issue(server, "rollout-r", "attempt-1")
        new_key = issue(server, "rollout-r", "attempt-2")
        gone_key = issue(server, "rollout-g", "attempt-1")
        url = f"{server.http_url}/v1/admin/rollouts/rollout-g/key"
        assert (
            httpx.delete(url, params={"attempt_id": "attempt-1"}, headers=server.auth).json()["revoked"] == 1
        )
    finally:
        server.stop()
    server.start()
    try:
        assert "superseded by attempt attempt-2" in export_spans(server, old_key, "rollout-r").text
        assert "revoked by the admin" in export_spans(server, gone_key, "rollout-g").text
        assert export_spans(server, new_key, "rollout-r").status_code == 200
        attributed = server.sql("SELECT DISTINCT attempt_id FROM spans WHERE rollout_id = 'rollout-r'")
        assert attributed.column(0).to_pylist() == ["attempt-2"]  # the key's attempt, restored from the store
    finally:
        server.stop()


def test_a_rollout_key_expires_after_the_servers_lifetime(tmp_path) -> None:
    lifetime_s = 3  # long enough for the first export to arrive in time on a loaded machine
    server = ServerProcess(
        tmp_path / "otel_rl.duckdb", tmp_path, flags=("--rollout-key-lifetime", str(lifetime_s))
    ).start()
    try:
        asked = time.time()
        key = issue(server, "rollout-e", "attempt-1")
        issued = time.time()  # the server stamped the key between `asked` and `issued`
        assert export_spans(server, key, "rollout-e").status_code == 200
        # The key's lifetime passing is what is tested: nothing to wait on but the clock.
        time.sleep(max(0.0, issued + lifetime_s - time.time()) + 0.1)
        expired = export_spans(server, key, "rollout-e")
        assert expired.status_code == 401, expired.text
        # the time the refusal names is the issue time plus the lifetime (to the second it prints)
        named = {
            datetime.fromtimestamp(int(t), UTC).isoformat()
            for t in range(int(asked + lifetime_s), int(issued + lifetime_s) + 1)
        }
        assert any(f"it expired at {when} (--rollout-key-lifetime)" in expired.text for when in named), (
            named,
            expired.text,
        )
    finally:
        server.stop()


def test_the_controller_revokes_each_attempts_key_when_the_attempt_ends(served, tmp_path) -> None:
    # The first attempt saves its key and runs past the timeout (retried); the second saves its key and ends.
    harness = (
        'if [ -e "$OUT/first" ]; then echo "$OPENAI_API_KEY" > "$OUT/key-2";'
        ' else touch "$OUT/first"; echo "$OPENAI_API_KEY" > "$OUT/key-1"; sleep 30; fi'
    )
    settings = ControllerSettings(
        command=harness, timeout_s=1.5, kill_grace_s=0.5, max_attempts=2, log_dir=tmp_path / "logs",
        env={"OUT": str(tmp_path)},
    )  # fmt: skip
    client = ServerClient(served.http_url, served.token)
    controller = Controller(
        settings,
        otlp_endpoint=served.http_url,
        openai_base_url=f"{served.http_url}/v1",
        token=served.token,
        issue_key=client.issue_rollout_key,
        revoke_key=client.revoke_rollout_key,
    )
    rollout = Rollout(new_id(), new_id(), "task", {})
    try:
        [result] = controller.run([rollout])
    finally:
        controller.close()
    assert [a.status for a in result.attempts] == [RolloutStatus.TIMEOUT, RolloutStatus.OK]
    first, second = ((tmp_path / f"key-{n}").read_text().strip() for n in (1, 2))
    for key, attempt in zip((first, second), result.attempts, strict=True):
        refused = chat(served, key)
        assert refused.status_code == 401 and f"attempt {attempt.attempt_id} ended" in refused.text


def start_serve(
    workdir: Path, *flags: str, env: dict[str, str], until: str = "web view"
) -> tuple[subprocess.Popen, list[str]]:
    """`otel-rl serve` as a user starts it; returns it and its output up to the line starting with `until`."""
    port, grpc_port = free_ports(2)
    args = [str(OTEL_RL), "serve", "--db", str(workdir / "s.duckdb"), "--http-port", str(port)]
    process = subprocess.Popen(
        [*args, "--grpc-port", str(grpc_port), *flags],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | env,
    )
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:  # the banner is printed before the server serves
        lines.append(line)
        if line.startswith(until):
            break
    return process, lines


def stop(process: subprocess.Popen) -> str:
    process.terminate()
    rest, _ = process.communicate(timeout=30)
    return rest


@pytest.mark.parametrize("source", ["OTEL_RL_TOKEN", "--token-file"])
def test_the_banner_names_where_the_admin_token_is_never_the_token(tmp_path, source) -> None:
    token = f"admin-{uuid.uuid4().hex}"
    (tmp_path / "token").write_text(token + "\n")
    flags = ("--token-file", str(tmp_path / "token")) if source == "--token-file" else ()
    env = {"OTEL_RL_TOKEN": token} if source == "OTEL_RL_TOKEN" else {}
    process, banner = start_serve(tmp_path, *flags, env=env)
    output = " ".join(("".join(banner) + stop(process)).split())  # the banner wraps at the terminal's width

    assert token not in output, output
    assert f"admin token from {source}" in output
    link_file = tmp_path / "s.duckdb.ui-link"
    assert f"its link with the admin token: {link_file}, mode 600" in output
    assert stat.S_IMODE(link_file.stat().st_mode) == 0o600
    assert link_file.read_text().strip().endswith(f"/ui#token={token}")


def test_the_web_views_link_is_printed_when_asked_for(tmp_path) -> None:
    token = f"admin-{uuid.uuid4().hex}"
    process, banner = start_serve(tmp_path, "--print-ui-link", env={"OTEL_RL_TOKEN": token}, until="http")
    output = "".join(banner) + stop(process)
    assert f"/ui#token={token}" in output
