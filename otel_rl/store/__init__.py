"""The durable DuckDB store of raw OTLP tables and normalized views."""

from otel_rl.store.readonly import ReadOnlyViolation
from otel_rl.store.store import IngestResult, Store
from otel_rl.store.writer import Saturated, StoreClosed

__all__ = ["IngestResult", "ReadOnlyViolation", "Saturated", "Store", "StoreClosed"]
