"""Rollout keys as the store keeps them: hash, attempt, identity, expiry, and their revocations."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import duckdb
import orjson
import pyarrow as pa

from otel_rl.store.layout import JSON, RECEIVED_AT


@dataclass(frozen=True)
class StoredKey:
    """One rollout key: what it acts for, until when, and why it is refused (None while it is valid)."""

    key_hash: str
    rollout_id: str
    attempt_id: str | None
    identity: Mapping[str, str]
    expires_at: float  # Unix seconds
    revoked: str | None = None


def key_row(key: StoredKey, created_at: datetime) -> pa.Table:
    """The `rollout_keys` row of `key`."""
    return pa.table(
        {
            "key_hash": [key.key_hash],
            "rollout_id": [key.rollout_id],
            "created_at": pa.array([created_at], RECEIVED_AT),
            "attempt_id": pa.array([key.attempt_id], pa.string()),
            "identity": pa.ExtensionArray.from_storage(JSON, pa.array([orjson.dumps(key.identity).decode()])),
            "expires_at": pa.array([datetime.fromtimestamp(key.expires_at, UTC)], RECEIVED_AT),
        }
    )


def revocation_rows(key_hashes: Iterable[str], reason: str, revoked_at: datetime) -> pa.Table:
    """The `rollout_key_revocations` rows of keys revoked together, for one reason."""
    hashes = list(key_hashes)
    return pa.table(
        {
            "key_hash": pa.array(hashes, pa.string()),
            "reason": pa.array([reason] * len(hashes), pa.string()),
            "revoked_at": pa.array([revoked_at] * len(hashes), RECEIVED_AT),
        }
    )


def read_keys(con: duckdb.DuckDBPyConnection, lifetime_s: float) -> dict[str, StoredKey]:
    """Every stored key by hash, with its first revocation's reason (None: not revoked); a key stored
    without an expiry (by an older version) expires `lifetime_s` after it was issued."""
    rows = con.execute(
        "SELECT k.key_hash, k.rollout_id, k.attempt_id, k.identity,"
        " coalesce(epoch(k.expires_at), epoch(k.created_at) + ?),"
        " CASE WHEN r.key_hash IS NOT NULL THEN coalesce(r.reason, 'revoked') END"
        " FROM rollout_keys k LEFT JOIN rollout_key_revocations r USING (key_hash)",
        [lifetime_s],
    ).fetchall()
    return {
        row[0]: StoredKey(row[0], row[1], row[2], orjson.loads(row[3]) if row[3] else {}, row[4], row[5])
        for row in rows
    }
