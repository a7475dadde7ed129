"""Durability: an acknowledged export survives `kill -9` of the server, and retries are not duplicated."""

import threading

import httpx
from otel_rl_server import ServerProcess
from test_collector_http import PROTOBUF, spans_request

SPANS_PER_REQUEST = 20


def test_kill_9_right_after_acknowledged_exports_loses_nothing(tmp_path) -> None:
    db = tmp_path / "otel_rl.duckdb"
    server = ServerProcess(db, tmp_path).start()
    acked: list[str] = []
    enough = threading.Event()

    def export_until_the_server_dies() -> None:
        with httpx.Client(headers={**PROTOBUF, **server.auth}, timeout=30) as client:
            while True:
                request, trace_id = spans_request(SPANS_PER_REQUEST)
                try:
                    response = client.post(
                        f"{server.http_url}/v1/traces", content=request.SerializeToString()
                    )
                except httpx.TransportError:
                    return
                assert response.status_code == 200, response.text
                acked.append(trace_id)
                if len(acked) >= 40:
                    enough.set()

    clients = [threading.Thread(target=export_until_the_server_dies) for _ in range(4)]
    for client in clients:
        client.start()
    assert enough.wait(60), server.log()
    server.kill()  # SIGKILL while the clients are still exporting: no shutdown code runs
    for client in clients:
        client.join(30)
    acked_before_kill = list(acked)
    assert db.with_name(db.name + ".wal").exists(), (
        "the acknowledged rows are in the WAL, not yet checkpointed"
    )

    restarted = ServerProcess(db, tmp_path).start()
    try:
        rows = restarted.sql("SELECT trace_id, count(*) AS n FROM spans GROUP BY 1").to_pylist()
    finally:
        restarted.stop()
    per_trace = {row["trace_id"]: row["n"] for row in rows}
    assert all(trace_id in per_trace for trace_id in acked_before_kill), "an acknowledged export was lost"
    # Each request is committed whole or not at all.
    assert set(per_trace.values()) == {SPANS_PER_REQUEST}
