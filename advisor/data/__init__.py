"""Data for ``--data``: token sources and deterministic, resumable batches."""

from advisor.data.loader import StepSampler, WindowDataset, make_loader
from advisor.data.sources import TokenSource, resolve_data

__all__ = ["StepSampler", "TokenSource", "WindowDataset", "make_loader", "resolve_data"]
