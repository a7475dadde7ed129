"""A record's rollout identity, resolved once: the rule the collector fills the raw tables' identity columns
by, and the same rule filling them in the rows of a store made before those columns existed."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import duckdb
import orjson
import pyarrow as pa

from otel_rl.attributes import IDENTITY_KEYS, ROLLOUT_ID

log = logging.getLogger(__name__)

# The raw tables' identity columns, in IDENTITY_KEYS order (store/layout.py).
IDENTITY_COLUMNS = ("rollout_id", "attempt_id", "group_id", "task_id", "split")
Identity = tuple[str | None, ...]  # one value per IDENTITY_KEYS entry
NO_IDENTITY: Identity = (None,) * len(IDENTITY_KEYS)
IDENTIFIED_TABLES = ("spans", "logs", "metric_points")
_BACKFILL_ROWS = 50_000  # rows read and updated at a time when an older store gets the columns


def identity_of(attributes: Mapping[str, object]) -> Identity:
    """The identity keys `attributes` give, in IDENTITY_KEYS order (a value that is not text gives none: the
    collector refuses such values from every sender, input_rules.py)."""
    return tuple(value if isinstance(value, str) else None for value in map(attributes.get, IDENTITY_KEYS))


def rollout_key_identity(rollout_id: str | None, identity: Mapping[str, str]) -> Identity:
    """What a rollout key's records are attributed to whatever they say: its rollout and the identity it was
    issued with (NO_IDENTITY for the admin and the server, whose records speak for themselves)."""
    if rollout_id is None:
        return NO_IDENTITY
    return identity_of({**identity, ROLLOUT_ID: rollout_id})


def resolve(first: Identity, then: Identity) -> Identity:
    """Each part from `first`, else from `then`: a rollout key's identity before the record's own attributes,
    and those before its resource's."""
    return tuple(a if a is not None else b for a, b in zip(first, then, strict=True))


# ---------------------------------------------------------------- stores made before the columns


def fill_identity_columns(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """Fill the identity columns just added to an older store's `table` by the collector's rule (the record's
    attribute, else its resource's: a rollout key's resources were stamped with its identity, and its records
    naming another rollout refused, when they were stored). Archived rows keep NULL: the views place such a
    span by its trace's rollout, as they did every span before."""
    (count,) = con.execute(
        f"SELECT count(*) FROM {table} WHERE contains(attributes::VARCHAR, '\"otel_rl.')"
        " OR contains(resource_attributes::VARCHAR, '\"otel_rl.')"
    ).fetchone()
    if not count:
        return
    log.warning("filling the identity columns of %d %s rows stored before they existed", count, table)
    cursor = con.execute(
        f"SELECT rowid, attributes::VARCHAR, resource_attributes::VARCHAR FROM {table}"
        " WHERE contains(attributes::VARCHAR, '\"otel_rl.')"
        " OR contains(resource_attributes::VARCHAR, '\"otel_rl.')"
    )
    batches = []
    while rows := cursor.fetchmany(_BACKFILL_ROWS):
        batches.append(_identities(rows))
    assignments = ", ".join(f"{c} = f.{c}" for c in IDENTITY_COLUMNS)
    for batch in batches:
        con.register("filled_identity", batch)
        try:
            con.execute(
                f"UPDATE {table} SET {assignments} FROM filled_identity f WHERE {table}.rowid = f.row"
            )
        finally:
            con.unregister("filled_identity")


def _identities(rows: list[tuple[int, str | None, str | None]]) -> pa.Table:
    """(rowid, attributes, resource attributes) rows -> their resolved identity columns."""
    resolved = [resolve(_parsed(attributes), _parsed(resource)) for _, attributes, resource in rows]
    columns = {"row": pa.array([row[0] for row in rows], type=pa.int64())}
    for i, name in enumerate(IDENTITY_COLUMNS):
        columns[name] = pa.array([identity[i] for identity in resolved], type=pa.string())
    return pa.table(columns)


def _parsed(document: str | None) -> Identity:
    if not document or '"otel_rl.' not in document:
        return NO_IDENTITY
    value = orjson.loads(document)
    return identity_of(value) if isinstance(value, dict) else NO_IDENTITY
