"""Stored calls -> token-aligned training samples (docs/samples.md): the Python API of `otel-rl export`."""

from otel_rl.lazy_exports import lazy_exports

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

__getattr__ = lazy_exports(__name__, _EXPORTS)
