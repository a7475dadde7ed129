"""Stored calls -> token-aligned training samples (docs/samples.md): the Python API of `otel-rl export`."""

from importlib import import_module
from typing import Any

# Imported on first use: `export` pulls in torch and verl, which CLI start-up should not pay for.
_EXPORTS = {
    "sft_records": "otel_rl.transforms.export",
    "to_dataproto": "otel_rl.transforms.export",
    "write_parquet": "otel_rl.transforms.export",
    "Limits": "otel_rl.transforms.limits",
    "RewardSpec": "otel_rl.transforms.rewards",
    "Report": "otel_rl.transforms.samples",
    "SampleOptions": "otel_rl.transforms.samples",
    "build_samples": "otel_rl.transforms.samples",
    "load_inputs": "otel_rl.transforms.samples",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'otel_rl.transforms' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
