"""The validators' contract, the validator of last resort, and the timeouts both real ones use."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from strategies.config import TrainConfig
from strategies.cost import Prediction
from strategies.plan import Measurement
from strategies.prediction import MiB

# Seconds per validated config beyond its predicted steps: child start-up and import of torch
# (~3-5 s on this 2-vCPU host), building the model, the profiler's memory pass.
STARTUP_S = 60.0
SAFETY = 5.0  # timeout = SAFETY × the predicted work: predictions can be off by a few ×


class Validator(Protocol):
    """Measures candidate configs for real. Contract:

    * ``unsupported_reason(config)``: None if this validator can run ``config``, else why not
      (one line, e.g. "ddp×8 needs 8 GPUs; this machine has 2"). Cheap and side-effect free.
    * ``validate(configs, predictions)``: one :class:`Measurement` per config, in order; never
      raises for a config's failure (status ``oom``/``timeout``/``error`` with the reason).
      ``predictions`` (same order) size timeouts and decide what may run side by side.
    """

    @property
    def name(self) -> str: ...

    def unsupported_reason(self, config: TrainConfig) -> str | None: ...

    def validate(
        self, configs: Sequence[TrainConfig], predictions: Sequence[Prediction]
    ) -> list[Measurement]: ...


@dataclass(frozen=True, kw_only=True)
class Unvalidated:
    """The validator of last resort: records why nobody could measure a config."""

    reason: str
    name: str = "none"

    def unsupported_reason(self, config: TrainConfig) -> str | None:
        return None

    def validate(
        self, configs: Sequence[TrainConfig], predictions: Sequence[Prediction]
    ) -> list[Measurement]:
        return [Measurement(status="not_validated", reason=self.reason) for _ in configs]


def over_budget(measured: Measurement, total: int, what: str, budget_bytes: int) -> Measurement:
    """``measured`` as the plan must read it when ``total`` (what the run held, in the terms
    the budget holds, ``what`` says how it was counted) exceeds the budget: out of memory. The
    user's budget leaves headroom the device may have, and a run that needs it does not fit."""
    if total <= budget_bytes:
        return measured
    return dataclasses.replace(
        measured,
        status="oom",
        reason=f"{what}, over the {budget_bytes / MiB:,.0f} MiB budget",
    )
