"""The archive: `otel-rl archive --before DAY` (and `otel-rl serve --archive-after-days`) move old raw rows
out of the store into daily Parquet files that every query, view and export still reads, exactly once, across
crashes at any step; late data for archived rollouts normalizes as if nothing had been archived. Retention
deletes old days, and their normalized rows."""

import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import httpx
import polars as pl
import pytest
from dated_traffic import days_ago, gauge_request, rows, store_requests, traffic
from from_scratch import ScratchViews, differences
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otel_rl_server import ServerProcess
from test_collector_http import PROTOBUF, post
from typer.testing import CliRunner

from otel_rl.cli import app
from otel_rl.collector.rewards import RewardIn, reward_log_request
from otel_rl.query import query
from otel_rl.store import Store, archiver, normalizer
from otel_rl.store.archive import archive_dir, manifest
from otel_rl.store.connection import connect
from otel_rl.store.definitions import NORMALIZED
from otel_rl.store.retention import ArchivePolicy
from otel_rl.store.schema import default_transforms_dir

RAW = ("spans", "call_tokens", "logs")  # the raw tables the normalized ones are computed from
ALL_RAW = (*RAW, "metric_points")
QUERIES = [
    *(f"SELECT * FROM {table}" for table in ALL_RAW),
    "SELECT * FROM llm_call_spans",  # a view over the raw tables
    *(f"SELECT * FROM {name}" for name in ("rollouts", "llm_calls", "rewards", "span_identity")),
]
TODAY = datetime.now(UTC).date()
BEFORE_TODAY = f"received_at < '{TODAY.isoformat()}T00:00:00+00:00'::TIMESTAMPTZ"


def copy_store(source: Path, target: Path) -> Path:
    """The store file and its archive folder, copied (a closed store)."""
    shutil.copy(source, target)
    if archive_dir(source).is_dir():
        shutil.copytree(archive_dir(source), archive_dir(target))
    return target


@pytest.fixture(scope="module")
def dated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """twin.duckdb: r-0 and r-1 received 3 days ago, r-2 2 days ago, r-3 today; archived.duckdb: the same
    requests, then `otel-rl archive --before <today>` (no server holds it: the command opens it)."""
    root = tmp_path_factory.mktemp("archive")
    requests = traffic([f"r-{i}" for i in range(4)])
    gauge = gauge_request("harness.queue_length", 3.0)
    received = [(("r-0", "r-1"), days_ago(3)), (("r-2",), days_ago(2)), (("r-3",), days_ago(0))]
    for name in ("twin.duckdb", "archived.duckdb"):
        with Store(root / name) as store:
            store_requests(store, [gauge], received[0][1])
            for rollouts, received_at in received:
                store_requests(store, [r for rollout in rollouts for r in requests[rollout]], received_at)
    result = CliRunner().invoke(
        app, ["archive", "--before", TODAY.isoformat(), "--db", str(root / "archived.duckdb")]
    )
    return {"root": root, "twin": root / "twin.duckdb", "archived": root / "archived.duckdb", "cli": result}


def stored_counts(db: Path) -> dict[str, int]:
    """Rows left in the store file's own raw tables (not its archive)."""
    con = connect(db, read_only=True)
    try:
        return {table: con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in ALL_RAW}
    finally:
        con.close()


def counts(db: Path, where: str) -> dict[str, int]:
    """Rows of each raw table matching `where`, as queries read them."""
    return {
        table: query(f"SELECT count(*) AS n FROM {table} WHERE {where}", db=db).item() for table in ALL_RAW
    }


def test_otel_rl_archive_moves_old_rows_into_a_parquet_file_per_table_and_day(dated) -> None:
    old = counts(dated["twin"], BEFORE_TODAY)
    assert dated["cli"].exit_code == 0, dated["cli"].output
    moved = ", ".join(f"{old[table]} {table} rows" for table in ALL_RAW)
    assert f"archived {moved} into 7 files" in dated["cli"].stdout

    db = dated["archived"]
    con = connect(db, read_only=True)
    try:
        listed = manifest(con)
    finally:
        con.close()
    days = {days_ago(3).date().isoformat(), days_ago(2).date().isoformat()}
    found = sorted(
        path.relative_to(db.parent).as_posix() for path in archive_dir(db).rglob("*") if path.is_file()
    )
    assert found == sorted(file.path for file in listed)  # exactly the listed files, none temporary
    by_day = {(t, d) for t in RAW for d in days} | {("metric_points", days_ago(3).date().isoformat())}
    assert {(file.raw_table, file.day.isoformat()) for file in listed} == by_day
    assert all(path.startswith(f"archived.archive/{path.split('/')[1]}/day=") for path in found)
    # Only today's rows (r-3) stay in the store's own tables.
    assert stored_counts(db) == counts(dated["twin"], f"NOT ({BEFORE_TODAY})")


@pytest.mark.parametrize("sql", QUERIES)
def test_every_read_of_a_store_reads_its_archived_rows_in_python_and_the_cli(dated, sql) -> None:
    def cli(db: Path) -> list[str]:
        result = CliRunner().invoke(app, ["sql", sql, "--db", str(db), "--format", "json"])
        assert result.exit_code == 0, result.output
        return rows(pl.read_json(result.stdout.encode()))

    assert rows(query(sql, db=dated["archived"])) == rows(query(sql, db=dated["twin"]))
    assert cli(dated["archived"]) == cli(dated["twin"])


# ---------------------------------------------------------------- through a running server


@pytest.fixture(scope="module")
def server(dated, tmp_path_factory: pytest.TempPathFactory):
    """`otel-rl serve --archive-after-days 1` on a copy of the twin: it archives the days before yesterday at
    start."""
    workdir = tmp_path_factory.mktemp("archive_server")
    db = copy_store(dated["twin"], workdir / "served.duckdb")
    process = ServerProcess(db, workdir, flags=("--archive-after-days", "1")).start()
    try:
        deadline = datetime.now(UTC).timestamp() + 60
        while process.scalar("SELECT count(*) FROM archive_files") == 0:
            assert datetime.now(UTC).timestamp() < deadline, process.log()
        yield process
    finally:
        process.stop()


def assert_normalized_as_from_scratch(server: ServerProcess) -> None:
    """Each normalized table, read through the server, equals the views computed from scratch over the raw
    rows read through it (archived ones included)."""
    scratch = ScratchViews({table: server.sql(f"SELECT * FROM {table}") for table in RAW})
    for name in NORMALIZED:
        maintained = pl.from_arrow(server.sql(f"SELECT * FROM {name}"))
        assert rows(maintained) == rows(scratch.query(f"SELECT * FROM {name}")), name


def test_the_server_archives_at_start_and_reads_archived_rows_as_python_does(
    dated, server, monkeypatch
) -> None:
    assert archived_days(server) == {days_ago(3).date(), days_ago(2).date()}
    monkeypatch.setenv("OTEL_RL_SERVER", server.http_url)
    monkeypatch.setenv("OTEL_RL_TOKEN", server.token)
    for sql in QUERIES:
        expected = rows(query(sql, db=dated["twin"]))
        assert rows(pl.from_arrow(server.sql(sql))) == expected, sql
        assert rows(query(sql, db=server.db)) == expected, sql  # the file is held: asked of the server


def archived_days(server: ServerProcess) -> set:
    return set(server.sql("SELECT day FROM archive_files").column(0).to_pylist())


def late_child_span(trace_id: str, parent_span_id: str) -> ExportTraceServiceRequest:
    """A span of an existing trace, arriving now (a tool call's, under the rollout's root span)."""
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.parent_span_id = bytes.fromhex(trace_id), bytes.fromhex(parent_span_id)
    span.span_id, span.name = os.urandom(8), "execute_tool calc"
    span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
    return request


def test_late_data_for_an_archived_rollout_normalizes_as_if_nothing_was_archived(server) -> None:
    late_reward = reward_log_request(RewardIn(rollout_id="r-0", value=0.25, source="grader"), now_ns=1)
    identity = "spans JOIN span_identity i USING (trace_id, span_id)"  # i: the rollout by inheritance too
    [root] = server.sql(
        f"SELECT trace_id, span_id FROM {identity} WHERE i.rollout_id = 'r-1' AND parent_span_id IS NULL"
    ).to_pylist()

    assert post(server, "/v1/logs", late_reward.SerializeToString(), PROTOBUF).status_code == 200
    late_span = late_child_span(root["trace_id"], root["span_id"]).SerializeToString()
    assert post(server, "/v1/traces", late_span, PROTOBUF).status_code == 200

    rewards = server.sql("SELECT value FROM rewards WHERE rollout_id = 'r-0' ORDER BY value").column(0)
    assert rewards.to_pylist() == [0.25, 1.0]
    placed = server.sql(f"SELECT i.rollout_id FROM {identity} WHERE name = 'execute_tool calc'").column(0)
    assert placed.to_pylist() == ["r-1"]  # placed in its archived trace's rollout
    assert_normalized_as_from_scratch(server)


def test_otel_rl_archive_asks_the_server_holding_the_store_and_retention_drops_normalized_rows(
    server, monkeypatch
) -> None:
    monkeypatch.setenv("OTEL_RL_SERVER", server.http_url)
    monkeypatch.setenv("OTEL_RL_TOKEN", server.token)

    result = CliRunner().invoke(app, ["archive", "--retain-days", "2", "--db", str(server.db)])

    assert result.exit_code == 0, result.output
    assert f"(days {days_ago(3).date()} to {days_ago(3).date()})" in result.stdout
    assert archived_days(server) == {days_ago(2).date()}
    traced = server.sql(
        "SELECT DISTINCT rollout_id FROM span_identity WHERE rollout_id IS NOT NULL ORDER BY 1"
    )
    assert traced.column(0).to_pylist() == ["r-2", "r-3"]  # r-0 and r-1 were received 3 days ago
    assert "r-1" not in server.sql("SELECT rollout_id FROM rollouts").column(0).to_pylist()
    assert_normalized_as_from_scratch(server)


def test_the_archive_endpoint_needs_the_admin_token(server) -> None:
    url = f"{server.http_url}/v1/admin/archive"

    assert httpx.post(url, json={"retain_days": 1}).status_code == 401
    assert httpx.post(url, json={"before": "2999-01-01"}, headers=server.auth).status_code == 400


# ---------------------------------------------------------------- crashes and retention, in-process


@pytest.fixture
def old_store(dated, tmp_path) -> Path:
    """A copy of the twin (nothing archived yet)."""
    return copy_store(dated["twin"], tmp_path / "store.duckdb")


def start_run(db: Path):
    """An archive run's first two steps on a connection of its own (its transaction left open)."""
    con = connect(db)
    con.execute("BEGIN TRANSACTION")
    now = datetime.now(UTC)
    files = archiver.write_files(con, db, TODAY, now)
    archiver.record(con, files, TODAY, now)
    return con, files


def test_a_run_stopped_before_its_commit_leaves_every_row_in_the_store_and_no_file(old_store, dated) -> None:
    con, files = start_run(old_store)
    assert files and all(Path(str(old_store.parent / f.path) + ".tmp").is_file() for f in files)
    con.close()  # the process dies: DuckDB never saw the commit

    with Store(old_store) as store:
        assert store.query_arrow("SELECT count(*) AS n FROM archive_files")["n"][0].as_py() == 0

    assert not any(archive_dir(old_store).rglob("*.parquet*"))
    assert stored_counts(old_store) == stored_counts(dated["twin"])


def test_a_run_stopped_between_its_commit_and_its_renames_is_finished_at_the_next_open(
    old_store, dated
) -> None:
    con, files = start_run(old_store)
    con.execute("COMMIT")
    con.close()  # the process dies before the renames
    # A reader meanwhile finds each listed file under its temporary name.
    assert rows(query("SELECT * FROM spans", db=old_store)) == rows(
        query("SELECT * FROM spans", db=dated["twin"])
    )

    with Store(old_store):
        pass

    assert not any(archive_dir(old_store).rglob("*.tmp"))
    assert all((old_store.parent / file.path).is_file() for file in files)
    for sql in QUERIES:
        assert rows(query(sql, db=old_store)) == rows(query(sql, db=dated["twin"])), sql
    assert differences(old_store) == {name: (0, 0) for name in NORMALIZED}


def test_retention_by_size_deletes_the_oldest_days_first_and_their_normalized_rows(old_store) -> None:
    with Store(old_store) as store:
        store.archive(ArchivePolicy(before=TODAY))
        files = manifest_of(store)
        newest = sum(file["bytes"] for file in files if file["day"] == days_ago(2).date())
        report = store.archive(ArchivePolicy(retain_bytes=newest))
        store.wait_normalized()
        remaining = manifest_of(store)
        rollouts = store.query_arrow("SELECT rollout_id FROM rollouts ORDER BY 1")["rollout_id"].to_pylist()

    assert report.deleted.days == [days_ago(3).date()]
    assert {file["day"] for file in remaining} == {days_ago(2).date()}
    assert rollouts == ["r-2", "r-3"]
    assert differences(old_store) == {name: (0, 0) for name in NORMALIZED}


def test_retention_by_age_deletes_raw_rows_still_in_the_store_and_their_normalized_rows(old_store) -> None:
    yesterday = f"received_at < '{days_ago(1).date().isoformat()}T00:00:00+00:00'::TIMESTAMPTZ"
    old = counts(old_store, yesterday)
    with Store(old_store) as store:
        report = store.archive(ArchivePolicy(retain_days=1))
        store.wait_normalized()
        rollouts = store.query_arrow("SELECT rollout_id FROM rollouts ORDER BY 1")["rollout_id"].to_pylist()

    assert report.deleted.store_rows == sum(old.values())  # r-0, r-1, r-2: their spans, tokens and reward
    assert rollouts == ["r-3"]
    assert differences(old_store) == {name: (0, 0) for name in NORMALIZED}


def test_retention_stopped_before_deleting_its_files_has_them_deleted_at_the_next_open(old_store) -> None:
    with Store(old_store) as store:
        store.archive(ArchivePolicy(before=TODAY))
    oldest = next(archive_dir(old_store).glob(f"spans/day={days_ago(3).date()}/*.parquet"))
    content = oldest.read_bytes()
    with Store(old_store) as store:
        store.archive(ArchivePolicy(retain_days=2))
    oldest.parent.mkdir(exist_ok=True)
    oldest.write_bytes(content)  # as if the process died after the commit, before deleting the file

    with Store(old_store):
        pass

    assert not oldest.exists()
    assert differences(old_store) == {name: (0, 0) for name in NORMALIZED}


def manifest_of(store: Store) -> list[dict]:
    return store.query_arrow("SELECT day, bytes FROM archive_files").to_pylist()


# ---------------------------------------------------------------- what is refused


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--before", "2999-01-01"], "archive finished days"),
        (["--before", "yesterday"], "is not a day"),
        (["--retain-bytes", "5PB"], "is not a size"),
        (["--retain-bytes", "0"], "between 1 byte and 1 PiB"),
        ([], "nothing to do"),
    ],
)
def test_otel_rl_archive_refuses_what_it_cannot_do(args, message, tmp_path) -> None:
    result = CliRunner().invoke(app, ["archive", "--db", str(tmp_path / "none.duckdb"), *args])

    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_otel_rl_serve_refuses_an_archive_flag_it_cannot_use_before_opening_the_store(tmp_path) -> None:
    db = tmp_path / "store.duckdb"

    result = CliRunner().invoke(app, ["serve", "--db", str(db), "--retain-bytes", "lots"])

    assert result.exit_code == 2 and "is not a size" in result.output
    assert not db.exists()


def test_changed_view_definitions_normalize_everything_again_from_the_archive_in_bounded_rounds(
    old_store, tmp_path, monkeypatch
) -> None:
    with Store(old_store) as store:
        store.archive(ArchivePolicy(before=TODAY))
    transforms = tmp_path / "transforms"
    shutil.copytree(default_transforms_dir(), transforms)
    llm_calls = transforms / "20_llm_calls.sql"
    llm_calls.write_text("-- edited\n" + llm_calls.read_text())  # what the normalized tables depend on
    monkeypatch.setattr(normalizer, "ROUND_ROWS", 6)  # a handful of rows a round: several rounds

    with Store(old_store, transforms_dir=transforms) as store:
        store.wait_normalized()
        rounds = store.normalizer.rounds
        rollouts = store.query_arrow("SELECT rollout_id FROM rollouts ORDER BY 1")["rollout_id"].to_pylist()

    assert rollouts == ["r-0", "r-1", "r-2", "r-3"] and rounds > 2
    assert differences(old_store) == {name: (0, 0) for name in NORMALIZED}
