"""The read-only gate for user SQL: one statement, and only one that reads."""

import duckdb


class ReadOnlyViolation(ValueError):
    """The SQL is not a single read statement (HTTP 400 at the query endpoint)."""


def check_read_only(sql: str) -> None:
    """Raise ReadOnlyViolation unless `sql` is exactly one SELECT (WITH, FROM, DESCRIBE, SHOW, SUMMARIZE).

    EXPLAIN is refused too: `EXPLAIN ANALYZE INSERT ...` would run the insert.
    """
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ReadOnlyViolation(f"the SQL could not be parsed: {exc}") from None
    if len(statements) != 1:
        raise ReadOnlyViolation(f"send exactly one statement (got {len(statements)})")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise ReadOnlyViolation(
            f"only read queries are allowed (SELECT, WITH, DESCRIBE, SHOW); this is a {kind.name} statement"
        )
