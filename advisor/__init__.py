"""transformer-advisor: profile a Transformer, pick the fastest config that fits, train it.

The Python API (``__all__`` is the public surface; everything else is internal)::

    import advisor
    profile = advisor.profile(model="gpt-tiny", seq_len=128, out="runs/p")
    plan = advisor.recommend(profile, global_batch_size=8)
    cost = advisor.predict(profile, micro_batch_size=4, precision="bf16")
    result = advisor.train(plan, steps=50, out="runs/x")

Importing this package stays cheap and imports no torch (``advisor --help`` relies on it):
each name below is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from advisor.version import __version__

if TYPE_CHECKING:
    from advisor.api import (
        export,
        load_plan,
        load_profile,
        model_spec,
        predict,
        profile,
        recommend,
        train,
        tune,
    )
    from advisor.errors import AdvisorError, TrainingDiverged, UsageProblem
    from advisor.exporters import Export
    from advisor.training import TrainSummary
    from advisor.tuning import TuneResult
    from profilers.profile_record import Profile
    from strategies.config import ConfigError, TrainConfig
    from strategies.errors import NothingFits, StrategyError, Unpredictable
    from strategies.plan_records import Plan

# Public name -> the module that owns it (imported on first access).
_OWNERS = {
    "profile": "advisor.api",
    "recommend": "advisor.api",
    "predict": "advisor.api",
    "train": "advisor.api",
    "tune": "advisor.api",
    "export": "advisor.api",
    "load_profile": "advisor.api",
    "load_plan": "advisor.api",
    "model_spec": "advisor.api",
    "Profile": "profilers.profile_record",
    "Plan": "strategies.plan_records",
    "TrainConfig": "strategies.config",
    "TrainSummary": "advisor.training",
    "TuneResult": "advisor.tuning",
    "Export": "advisor.exporters",
    "AdvisorError": "advisor.errors",
    "UsageProblem": "advisor.errors",
    "TrainingDiverged": "advisor.errors",
    "ConfigError": "strategies.config",
    "StrategyError": "strategies.errors",
    "NothingFits": "strategies.errors",
    "Unpredictable": "strategies.errors",
}

__all__ = [
    "AdvisorError",
    "ConfigError",
    "Export",
    "NothingFits",
    "Plan",
    "Profile",
    "StrategyError",
    "TrainConfig",
    "TrainSummary",
    "TrainingDiverged",
    "TuneResult",
    "Unpredictable",
    "UsageProblem",
    "__version__",
    "export",
    "load_plan",
    "load_profile",
    "model_spec",
    "predict",
    "profile",
    "recommend",
    "train",
    "tune",
]


def __getattr__(name: str) -> Any:
    owner = _OWNERS.get(name)
    if owner is None:
        raise AttributeError(f"module 'advisor' has no attribute {name!r}")
    value = getattr(importlib.import_module(owner), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_OWNERS})
