"""A damaged WAL (a disk fault after `kill -9`): the server says so loudly at start, with how much is lost;
`otel-rl store check` finds it, `otel-rl store recover` salvages what is before the damage."""

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from otel_rl_server import ServerProcess
from test_store_faults import PROTOBUF, SPANS_PER_REQUEST, spans_request

OTEL_RL = Path(sys.executable).parent / "otel-rl"
REQUESTS = 40


def killed_store(tmp_path: Path) -> tuple[Path, list[str]]:
    """A store whose acknowledged exports are only in its WAL (the server was SIGKILLed)."""
    db = tmp_path / "otel_rl.duckdb"
    server = ServerProcess(db, tmp_path).start()
    acked = []
    with httpx.Client(headers={**PROTOBUF, **server.auth}, timeout=30) as client:
        for _ in range(REQUESTS):
            body, trace_id = spans_request()
            assert client.post(f"{server.http_url}/v1/traces", content=body).status_code == 200
            acked.append(trace_id)
    server.kill()
    assert wal_of(db).stat().st_size > 100_000
    return db, acked


def wal_of(db: Path) -> Path:
    return db.with_name(db.name + ".wal")


def store_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(OTEL_RL), "store", *args], capture_output=True, text=True, timeout=120)


def stored_traces(db: Path, workdir: Path) -> dict[str, int]:
    server = ServerProcess(db, workdir).start()
    try:
        rows = server.sql("SELECT trace_id, count(*) AS n FROM spans GROUP BY 1").to_pylist()
    finally:
        server.stop()
    return {row["trace_id"]: row["n"] for row in rows}


def flip(path: Path, offset: int) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))


def test_an_intact_wal_after_kill_9_checks_clean_and_replays_whole(tmp_path: Path) -> None:
    db, acked = killed_store(tmp_path)

    checked = store_command("check", "--db", str(db))

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "the WAL replays" in checked.stdout and "table spans:" in checked.stdout
    assert "views of 20_llm_calls.sql: ok" in checked.stdout
    server = ServerProcess(db, tmp_path).start()
    try:
        in_use = store_command("check", "--db", str(db))  # the server holds the file
        stored = server.sql("SELECT DISTINCT trace_id FROM spans").column(0).to_pylist()
    finally:
        server.stop()
    assert in_use.returncode == 2 and "the store is in use" in in_use.stdout, in_use.stdout
    assert set(stored) >= set(acked)


@pytest.mark.parametrize("damage", ["truncated", "zeroed header"])
def test_a_wal_that_replays_only_in_part_is_reported_loudly_with_its_bytes_and_kept(
    tmp_path: Path, damage: str
) -> None:
    db, acked = killed_store(tmp_path)
    wal = wal_of(db)
    size = wal.stat().st_size
    if damage == "truncated":
        cut = size // 2
        with wal.open("r+b") as file:
            file.truncate(cut)
        expected = f"is {cut} bytes but replay stops at byte"
    else:
        with wal.open("r+b") as file:
            file.write(bytes(64))
        expected = f"({size} bytes) has a damaged header: DuckDB replays none of it"

    checked = store_command("check", "--db", str(db))
    assert checked.returncode == 1 and expected in checked.stdout, checked.stdout + checked.stderr

    server = ServerProcess(db, tmp_path).start()  # it starts, and says what it drops
    try:
        rows = server.sql("SELECT trace_id, count(*) AS n FROM spans GROUP BY 1").to_pylist()
    finally:
        server.stop()
    assert "STORE DAMAGE" in server.log() and expected in server.log()
    kept = list(tmp_path.glob("otel_rl.duckdb.wal.*.unreplayed"))
    assert len(kept) == 1 and kept[0].stat().st_size == (cut if damage == "truncated" else size)
    stored = {row["trace_id"]: row["n"] for row in rows}
    assert len(stored) < len(acked)  # the loss is real, and it was reported
    assert set(stored.values()) <= {SPANS_PER_REQUEST}  # commits replay whole or not at all


def test_a_flipped_byte_stops_the_server_with_what_to_do_and_recover_salvages_the_wal_before_it(
    tmp_path: Path,
) -> None:
    db, acked = killed_store(tmp_path)
    wal = wal_of(db)
    size = wal.stat().st_size
    flip(wal, size // 2)

    with pytest.raises(RuntimeError, match="otel-rl store recover"):
        ServerProcess(db, tmp_path).start()
    checked = store_command("check", "--db", str(db))
    assert checked.returncode == 1 and "is damaged at byte" in checked.stdout, checked.stdout

    recovered = store_command("recover", "--db", str(db))

    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert f"of {size}; dropped the last" in recovered.stdout, recovered.stdout
    kept = sorted(path.name for path in tmp_path.glob("otel_rl.duckdb*.damaged"))
    assert len(kept) == 2 and sum(".wal." in name for name in kept) == 1, kept  # the file and its WAL
    assert store_command("check", "--db", str(db)).returncode == 0
    stored = stored_traces(db, tmp_path)
    salvaged = [trace for trace in acked if trace in stored]
    # About the first half of the commits are before the damage; each comes back whole.
    assert REQUESTS // 4 < len(salvaged) < REQUESTS and salvaged == acked[: len(salvaged)]
    assert {stored[trace] for trace in salvaged} == {SPANS_PER_REQUEST}
