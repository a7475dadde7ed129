"""CSV as otel-rl writes it for people: nested values as JSON text, no cell a spreadsheet runs as code."""

from __future__ import annotations

import json

import polars as pl

# OWASP's rule for CSV injection: a cell that starts with one of these is read as a formula by spreadsheets
# (`=HYPERLINK(...)` in a rollout's own service.name); a leading single quote makes it text again.
FORMULA_START = r"^[=+\-@\t\r]"


def csv_text(frame: pl.DataFrame) -> str:
    """`frame` as CSV text: nested columns (lists, structs) as JSON, every text cell and column name that a
    spreadsheet would evaluate prefixed with a single quote; numbers and other typed columns as they are."""
    flat = flat_nested(frame)
    texts = (pl.String, pl.Categorical, pl.Enum)
    text = [name for name, dtype in flat.schema.items() if isinstance(dtype, texts)]
    flat = flat.with_columns(neutralized(pl.col(name).cast(pl.String)).alias(name) for name in text)
    names = {name: "'" + name for name in flat.columns if _formula(name)}
    return flat.rename(names).write_csv()


def neutralized(text: pl.Expr) -> pl.Expr:
    """A text column whose values that start like a formula begin with a single quote."""
    return pl.when(text.str.contains(FORMULA_START)).then(pl.lit("'") + text).otherwise(text)


def flat_nested(frame: pl.DataFrame) -> pl.DataFrame:
    """Nested columns (lists, structs) as JSON text, which CSV can hold."""
    nested = [name for name, dtype in frame.schema.items() if dtype.is_nested()]
    return frame.with_columns(
        pl.Series(
            name, [None if v is None else json.dumps(v) for v in frame[name].to_list()], dtype=pl.String
        )
        for name in nested
    )


def _formula(name: str) -> bool:
    return name[:1] in ("=", "+", "-", "@", "\t", "\r")
