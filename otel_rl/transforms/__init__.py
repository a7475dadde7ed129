"""Stored calls -> token-aligned training samples (docs/samples.md): the Python API of `otel-rl export`."""

from otel_rl.transforms.export import sft_records, to_dataproto, write_parquet
from otel_rl.transforms.limits import Limits
from otel_rl.transforms.rewards import RewardSpec
from otel_rl.transforms.samples import Report, SampleOptions, build_samples, load_inputs

__all__ = [
    "Limits",
    "Report",
    "RewardSpec",
    "SampleOptions",
    "build_samples",
    "load_inputs",
    "sft_records",
    "to_dataproto",
    "write_parquet",
]
