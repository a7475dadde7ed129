"""Several stores read as one (`--db A --db B`, `--db 'parts/*.duckdb'`, `query(db=[...])`): the same traffic
split by rollout over two stores (one of them partly archived) answers as it does from one store holding all
of it, in Python, `otel-rl sql`, `otel-rl export` and offline training's read."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import duckdb
import polars as pl
import pytest
from dated_traffic import days_ago, rows, store_requests, traffic
from otel_rl_server import OTEL_RL
from typer.testing import CliRunner

from otel_rl.cli import app
from otel_rl.collector.rewards import RewardIn, reward_log_request
from otel_rl.query import QueryError, SplitRollouts, query
from otel_rl.store import Store
from otel_rl.store.retention import ArchivePolicy
from otel_rl.train.config import config_from_dict
from otel_rl.train.offline import stored_samples

QUERIES = {
    "rollouts": "SELECT * FROM rollouts",
    "llm_calls": "SELECT * FROM llm_calls",
    "rewards": "SELECT * FROM rewards",
    "span_identity": "SELECT * FROM span_identity",
    "spans": "SELECT * FROM spans",
    "logs": "SELECT * FROM logs",
    "call_tokens": "SELECT * FROM call_tokens",
    "llm_call_spans (a view over the raw tables)": "SELECT * FROM llm_call_spans",
    "a macro": "SELECT ns_time(1700000000000000000) AS t",
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """parts/a.duckdb (r-0, r-2 received two days ago and archived, r-4 today), parts/b.duckdb (r-1 two
    days ago, r-3 today), and all.duckdb with the same requests, none archived."""
    root = tmp_path_factory.mktemp("partitions")
    (root / "parts").mkdir()
    requests = traffic([f"r-{i}" for i in range(5)])
    old, new = days_ago(2), days_ago(0)
    plan = {"parts/a.duckdb": (("r-0", "r-2"), ("r-4",)), "parts/b.duckdb": (("r-1",), ("r-3",))}
    for name, (earlier, today) in plan.items():
        with Store(root / name) as store:
            store_requests(store, [r for rollout in earlier for r in requests[rollout]], old)
            store_requests(store, [r for rollout in today for r in requests[rollout]], new)
            if name == "parts/a.duckdb":
                report = store.archive(ArchivePolicy(before=new.date()))
                assert {file.raw_table for file in report.archived} == {"spans", "call_tokens", "logs"}
    with Store(root / "all.duckdb") as store:
        store_requests(store, [r for rollout in ("r-0", "r-2", "r-1") for r in requests[rollout]], old)
        store_requests(store, [r for rollout in ("r-4", "r-3") for r in requests[rollout]], new)
    return {
        "root": root,
        "a": root / "parts/a.duckdb",
        "b": root / "parts/b.duckdb",
        "all": root / "all.duckdb",
    }


@pytest.mark.parametrize("name", list(QUERIES))
def test_two_partitions_answer_in_python_as_one_store_holding_everything(stores, name) -> None:
    sql = QUERIES[name]

    both = query(sql, db=[stores["a"], stores["b"]])

    assert both.height > 0
    assert rows(both) == rows(query(sql, db=stores["all"]))


def test_otel_rl_sql_reads_a_glob_of_stores_as_one(stores, monkeypatch) -> None:
    monkeypatch.chdir(stores["root"])
    sql = "SELECT rollout_id, n_calls, outcome_reward FROM rollouts ORDER BY rollout_id"

    result = CliRunner().invoke(app, ["sql", sql, "--db", "parts/*.duckdb", "--format", "json"])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == query(sql, db=stores["all"]).to_dicts()
    assert [row["rollout_id"] for row in json.loads(result.stdout)] == [f"r-{i}" for i in range(5)]
    assert "warning" not in result.stderr


def test_export_samples_over_two_partitions_equals_the_export_over_one_store(stores, tmp_path) -> None:
    def export(*dbs: Path) -> pl.DataFrame:
        output = tmp_path / f"{len(dbs)}.parquet"
        flags = [flag for db in dbs for flag in ("--db", str(db))]
        args = ["export", "samples", "-o", str(output), "--trusted-source", "any", *flags]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        return pl.read_parquet(output)

    both = export(stores["a"], stores["b"])

    assert both["rollout_id"].n_unique() == 5
    assert rows(both) == rows(export(stores["all"]))


def test_offline_training_reads_the_samples_of_several_stores(stores) -> None:
    config = config_from_dict({"model": "unused", "reward": {"trusted_sources": ["test"]}})

    samples, calls = stored_samples(config, "true", dbs=[stores["a"], stores["b"]])
    expected_samples, expected_calls = stored_samples(config, "true", dbs=[stores["all"]])

    assert samples["rollout_id"].n_unique() == 5
    assert rows(samples) == rows(expected_samples) and rows(calls) == rows(expected_calls)


def test_otel_rl_train_offline_learns_from_a_glob_of_stores(stores, tiny_model_dir, tmp_path, monkeypatch):
    config = tmp_path / "train.yaml"
    config.write_text(
        f"model: {tiny_model_dir}\noutput_dir: {tmp_path / 'out'}\nsteps: 1\n"
        "reward: {trusted_sources: [test]}\nalgorithm: {groups_per_step: 1}\n"
    )
    monkeypatch.chdir(stores["root"])
    args = ["train", "--config", str(config), "--offline", "--where", "true", "--db", "parts/*.duckdb"]

    result = CliRunner().invoke(app, args)

    assert result.exit_code == 0, result.output
    assert "10 samples from 5 rollouts" in result.stdout
    assert (tmp_path / "out" / "step-1" / "model.safetensors").is_file()


def test_a_rollout_with_records_in_two_stores_is_warned_about_once(stores, tmp_path) -> None:
    stray = tmp_path / "stray.duckdb"  # a reward for r-0 that reached another partition than its spans
    with Store(stray) as store:
        store_requests(
            store, [reward_log_request(RewardIn(rollout_id="r-0", value=0.0), now_ns=1)], days_ago(0)
        )

    with pytest.warns(SplitRollouts, match=r"1 rollout\(s\) have records in more than one .* \(r-0\)"):
        query("SELECT count(*) FROM rollouts", db=[stores["a"], stray])
    result = CliRunner().invoke(
        app,
        [
            "export",
            "samples",
            "-o",
            str(tmp_path / "s.parquet"),
            "--db",
            str(stores["a"]),
            "--db",
            str(stray),
        ],
    )

    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "route the collector by rollout id" in warnings[0], result.stderr


def test_a_store_held_by_a_running_server_is_refused_with_what_to_do(stores, otel_rl_server) -> None:
    with pytest.raises(QueryError, match="held by a running otel-rl server.*stop that server"):
        query("SELECT 1", db=[stores["a"], otel_rl_server.db])

    result = CliRunner().invoke(
        app, ["sql", "SELECT 1", "--db", str(stores["a"]), "--db", str(otel_rl_server.db)]
    )

    assert result.exit_code == 1
    assert f"{otel_rl_server.db} is held by a running otel-rl server" in " ".join(result.stderr.split())


def test_a_glob_that_matches_nothing_and_a_write_are_refused(stores) -> None:
    with pytest.raises(QueryError, match="no file matches"):
        query("SELECT 1", db=str(stores["root"] / "nothing" / "*.duckdb"))
    with pytest.raises(QueryError, match="only read queries are allowed"):
        query("DELETE FROM spans", db=[stores["a"], stores["b"]])
    with pytest.raises(QueryError, match="cannot reach files"):
        query("SELECT * FROM read_text('/etc/hostname')", db=[stores["a"], stores["b"]])


@pytest.mark.parametrize("other", ["a text file", "a DuckDB file of something else"])
def test_a_glob_matching_a_file_that_is_not_a_store_fails_in_one_line_naming_it(
    stores, tmp_path, other
) -> None:
    (tmp_path / "parts").mkdir()
    shutil.copy(stores["b"], tmp_path / "parts" / "b.duckdb")
    if other == "a text file":
        (tmp_path / "parts" / "notes.duckdb").write_text("not a store\n")
    else:
        with duckdb.connect(str(tmp_path / "parts" / "notes.duckdb")) as con:
            con.execute("CREATE TABLE notes AS SELECT 'mine' AS note")

    result = subprocess.run(
        [str(OTEL_RL), "sql", "SELECT count(*) AS n FROM spans", "--db", "parts/*.duckdb"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "300"},
    )

    assert result.returncode == 1
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: parts/notes.duckdb is not an otel-rl store")
    if other != "a text file":  # not made into a store by being read as one
        with duckdb.connect(str(tmp_path / "parts" / "notes.duckdb"), read_only=True) as con:
            assert con.execute("SELECT table_name FROM duckdb_tables()").fetchall() == [("notes",)]


def test_a_store_whose_name_holds_glob_characters_is_opened_as_named(stores, tmp_path) -> None:
    for name in ("run[1].duckdb", "what?.duckdb", "all*.duckdb"):
        shutil.copy(stores["b"], tmp_path / name)  # b: no archive beside it, which a copy would lose
    expected = query("SELECT count(*) AS n FROM spans", db=stores["b"])["n"][0]

    for name in ("run[1].duckdb", "what?.duckdb", "all*.duckdb"):
        result = subprocess.run(
            [str(OTEL_RL), "sql", "SELECT count(*) AS n FROM spans", "--db", name, "--format", "csv"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["n", str(expected)]
