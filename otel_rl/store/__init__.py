"""The durable DuckDB store of raw OTLP tables and normalized views."""

from otel_rl.store.sandbox import ReadOnlyViolation
from otel_rl.store.store import IngestResult, Store
from otel_rl.store.writer import Saturated, StoreClosed, StoreUnavailable

__all__ = ["IngestResult", "ReadOnlyViolation", "Saturated", "Store", "StoreClosed", "StoreUnavailable"]
