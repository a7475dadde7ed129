"""Producers' rows as the Arrow tables the store inserts: each column built in its layout's type, and the
columns every row of one batch shares (when and from whom it was received) filled once."""

from datetime import datetime

import pyarrow as pa

from otel_rl.store.layout import JSON, PER_BATCH, RECEIVED_AT, Layout, Sender


def rows_table(layout: Layout, rows: list[tuple], received_at: datetime, sender: Sender) -> pa.Table:
    """The Arrow table of `rows` (each a `layout.row`), all received at `received_at` from `sender`."""
    schema = layout.schema
    columns = zip(*rows, strict=True) if rows else [()] * (len(schema) - len(PER_BATCH))
    arrays = [_array(values, field.type) for values, field in zip(columns, schema, strict=False)]
    arrays += per_batch_arrays(received_at, sender, len(rows))
    return pa.Table.from_arrays(arrays, schema=schema)


def per_batch_arrays(received_at: datetime, sender: Sender, n: int) -> list[pa.Array]:
    """The received_at and sender columns of n rows received together."""
    return [pa.repeat(pa.scalar(received_at, type=RECEIVED_AT), n), pa.repeat(pa.scalar(sender), n)]


def _array(values: object, type_: pa.DataType) -> pa.Array:
    if type_ != JSON:
        return pa.array(values, type=type_)
    # orjson's bytes are valid UTF-8: viewed as strings as they are, 2x faster than pyarrow's JSON conversion.
    return pa.ExtensionArray.from_storage(JSON, pa.array(values, type=pa.binary()).view(pa.string()))
