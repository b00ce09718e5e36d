"""Data for ``--data``: token sources and deterministic, resumable batches."""

from advisor.data.loader import (
    DataUse,
    StepSampler,
    WindowDataset,
    data_use,
    make_loader,
    repetition_notice,
)
from advisor.data.sources import TokenSource, resolve_data

__all__ = [
    "DataUse",
    "StepSampler",
    "TokenSource",
    "WindowDataset",
    "data_use",
    "make_loader",
    "repetition_notice",
    "resolve_data",
]
