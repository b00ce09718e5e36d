"""Validation: short real runs of the top predicted candidates, on the profiled device.

A :class:`Validator` turns TrainConfigs into :class:`strategies.plan.Measurement`s. The
recommendation routes each config to the first validator that accepts it
(``unsupported_reason`` returns None); a config no validator accepts is recorded
``not_validated`` with the reasons, and :func:`strategies.plan.decide` never lets it beat a
measured one. :class:`LocalValidator` runs single-device configs, :class:`LauncherValidator`
ddp/fsdp ones through torchrun, both implementing the same two methods.

The package: the contract and the validator of last resort (:mod:`.validator`), the local
validator and its isolated child (:mod:`.local`), the launcher validator (:mod:`.launcher`), and
routing with repeated visits of close contenders (:mod:`.rounds`, :func:`validate_rounds`, what
recommend calls). Every name is importable from ``advisor.validation``.
"""

from __future__ import annotations

from advisor.validation.launcher import LauncherValidator
from advisor.validation.local import LocalValidator, measure_configs
from advisor.validation.rounds import (
    REPLACEABLE,
    Replace,
    backfill,
    busy_visits,
    contenders,
    merge_measurements,
    route,
    suspects,
    validate_rounds,
)
from advisor.validation.validator import Unvalidated, Validator
from strategies.budgets import DEFAULT_VALIDATE_ROUNDS, TIE_MARGIN

__all__ = [
    "DEFAULT_VALIDATE_ROUNDS",
    "REPLACEABLE",
    "TIE_MARGIN",
    "LauncherValidator",
    "LocalValidator",
    "Replace",
    "Unvalidated",
    "Validator",
    "backfill",
    "busy_visits",
    "contenders",
    "measure_configs",
    "merge_measurements",
    "route",
    "suspects",
    "validate_rounds",
]
