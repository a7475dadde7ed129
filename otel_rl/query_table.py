"""`otel-rl sql`'s table: the columns that fit the terminal, and how many it hid (as DuckDB's shell does)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

# A column squeezed to share the width shows at least this many characters of its values (or its whole name,
# if that is longer): narrower, a value says nothing.
MIN_COLUMN_CHARS = 12
# Up to this many characters of a value count towards a column's natural width: a long JSON value needs no
# more to decide that the column is wide.
MEASURED_CHARS = 1000
BORDER_CHARS = 3  # a rich column's padding and its border on one side
HIDDEN_MARK = "…"


def column_widths(frame: pl.DataFrame, texts: list[list[str]]) -> list[int]:
    """Each column's natural width: its name or its longest shown value (to MEASURED_CHARS)."""
    return [
        max([len(name), *(min(len(row[i]), MEASURED_CHARS) for row in texts)])
        for i, name in enumerate(frame.columns)
    ]


def squeezed_widths(names: list[str], widths: list[int]) -> list[int]:
    """Each column's width when the columns must share the terminal: its name, at least MIN_COLUMN_CHARS."""
    return [min(width, max(MIN_COLUMN_CHARS, len(name))) for name, width in zip(names, widths, strict=True)]


def shown_columns(squeezed: list[int], total: int) -> list[int]:
    """The indices of the columns to show in `total` characters: all if they fit at their `squeezed` widths
    (rich then folds long values across lines), else columns at those widths taken alternately from the left
    and the right end (the first ones usually say which row it is, the last what it holds), leaving room for
    the column that marks the gap."""
    if sum(w + BORDER_CHARS for w in squeezed) + 1 <= total:
        return list(range(len(squeezed)))
    room = total - 1 - (len(HIDDEN_MARK) + BORDER_CHARS)
    left: list[int] = []
    right: list[int] = []
    lo, hi = 0, len(squeezed) - 1
    while lo <= hi:
        index = lo if len(left) <= len(right) else hi
        room -= squeezed[index] + BORDER_CHARS
        if room < 0:
            break
        if index == lo:
            left.append(lo)
            lo += 1
        else:
            right.append(hi)
            hi -= 1
    return left + right[::-1]


def fitting_table(frame: pl.DataFrame, width: int) -> Any:  # rich.table.Table
    """The rows of `frame` as a rich table at most `width` characters wide; its caption counts the rows and,
    when some columns did not fit, says how many were hidden and how to see them."""
    from rich.table import Table
    from rich.text import Text

    texts = [[None if v is None else str(v) for v in row] for row in frame.iter_rows()]
    widths = column_widths(frame, [[t or "NULL" for t in row] for row in texts])
    squeezed = squeezed_widths(frame.columns, widths)
    shown = shown_columns(squeezed, width)
    hidden = frame.width - len(shown)
    caption = f"{frame.height} row(s)"
    if hidden:
        caption += (
            f", {frame.width} columns ({len(shown)} shown, {hidden} hidden: name the columns you want,"
            " widen the terminal, or use --format json)"
        )
    # Where the hidden columns were: between the last left column and the first right one.
    gap = (
        next((p for p in range(1, len(shown)) if shown[p] != shown[p - 1] + 1), len(shown))
        if hidden
        else None
    )
    table = Table(caption=caption)
    for position, index in enumerate(shown):
        if position == gap:
            table.add_column(HIDDEN_MARK, no_wrap=True)
        if hidden:
            table.add_column(
                frame.columns[index], no_wrap=True, overflow="ellipsis", max_width=squeezed[index]
            )
        else:
            table.add_column(frame.columns[index], overflow="fold")
    if gap == len(shown):
        table.add_column(HIDDEN_MARK, no_wrap=True)
    for row in texts:
        # Text, not markup: values such as "[1, 2]" must print as they are.
        cells = [Text("NULL", style="dim") if row[i] is None else Text(row[i]) for i in shown]
        if gap is not None:
            cells.insert(gap, Text(HIDDEN_MARK, style="dim"))
        table.add_row(*cells)
    return table
