"""The view definitions: the transforms/*.sql files as statements, and which views the store keeps as tables.

The files define every view as a view over the raw tables. The store keeps the views users and training read
(`NORMALIZED`) as tables maintained as data arrives (normalize.py), computed by the same SQL: for them, the
SELECT of the file's `CREATE VIEW` is what fills the table.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb

# The views kept as tables, in the order they are filled (each may read those before it), and which of their
# rows a scope of traces, rollouts and coding-CLI sessions owns (see normalize.py): the rows recomputed when
# data of the scope arrives. The scope's keys are in the tables scope_traces, scope_rollouts, scope_sessions.
IN_TRACES = "trace_id IN (FROM scope_traces)"
NORMALIZED: dict[str, str] = {
    "span_identity": IN_TRACES,
    "llm_call_rows": IN_TRACES,
    "tool_calls": f"{IN_TRACES} OR tool_trace_id IN (FROM scope_traces)",
    "agent_steps": IN_TRACES,
    "rewards": f"{IN_TRACES} OR rollout_id IN (FROM scope_rollouts)",
    "rollout_rows": "rollout_id IN (FROM scope_rollouts)",  # read by the rollouts view, with reward_specs
    "harness_sessions": "session_id IN (FROM scope_sessions)",
}
# Views several normalized views read: in the scratch database of a round they are tables too, computed once
# per round (as a view, each reader would compute them again), but the store does not keep them.
COMPUTED_ONCE = ("llm_call_index", "step_spans", "reward_records")
_CREATE_VIEW = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+(\w+)\s+AS\s+(.*?);?\s*$", re.I | re.S)
_LEADING_COMMENTS = re.compile(r"^(\s*--[^\n]*\n)*", re.S)


@dataclass(frozen=True)
class Statement:
    sql: str
    view: str | None = None  # the view it creates
    definition: str | None = None  # that view's SELECT

    @property
    def normalized(self) -> bool:
        """Whether it defines a view the store keeps as a table."""
        return self.view in NORMALIZED

    @property
    def filled(self) -> bool:
        """Whether it defines a view a round computes into a table of its scratch database."""
        return self.view in NORMALIZED or self.view in COMPUTED_ONCE


@dataclass(frozen=True)
class SqlFile:
    name: str
    sha256: str
    statements: tuple[Statement, ...]


class DefinitionError(ValueError):
    """A transforms file cannot be read as statements, or leaves out a normalized view."""


def read_definitions(transforms_dir: Path) -> list[SqlFile]:
    """The `*.sql` files of `transforms_dir` in file-name order, split into statements."""
    files = sorted(transforms_dir.glob("*.sql")) if transforms_dir.is_dir() else []
    return [_read(file) for file in files]


def _read(file: Path) -> SqlFile:
    text = file.read_text()
    try:
        parsed = duckdb.extract_statements(text)
    except duckdb.Error:
        # kept whole: running it reports DuckDB's error for the file, as a file that fails to bind does
        return SqlFile(file.name, _sha256(text), (Statement(text),))
    statements = []
    for statement in parsed:
        sql = statement.query
        match = _CREATE_VIEW.match(_LEADING_COMMENTS.sub("", sql, count=1))
        if statement.type == duckdb.StatementType.CREATE and match:
            statements.append(Statement(sql, match.group(1).lower(), match.group(2)))
        else:
            statements.append(Statement(sql))
    return SqlFile(file.name, _sha256(text), tuple(statements))


def normalized_fingerprint(files: list[SqlFile]) -> str:
    """What the normalized tables' rows depend on: every statement up to the last normalized view's."""
    statements = [statement for file in files for statement in file.statements]
    last = max((i for i, s in enumerate(statements) if s.normalized), default=-1)
    return _sha256("\n;\n".join(statement.sql for statement in statements[: last + 1]))


def defined_normalized(files: list[SqlFile]) -> list[str]:
    """The normalized views `files` define, in file order (a store whose SQL lacks one has no table of it)."""
    return [statement.view for file in files for statement in file.statements if statement.normalized]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
