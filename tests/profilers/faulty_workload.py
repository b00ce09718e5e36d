"""A ToyWorkload whose real steps crash or hang for chosen precisions (profiler isolation tests).

Only real steps misbehave: a step built ``from_meta`` (the memory probe's fake-tensor trace,
which runs in the profiler's own process) behaves, so the memory fits exist for every group and
the faults show up where isolation must catch them, in the child processes that run real steps.
A module of its own so spawned children can import the class by reference.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from profilers.workload import Batch, StepSpec
from tests.profilers.toy_workload import ToyStep, ToyWorkload

CRASH_MESSAGE = "injected crash in forward_backward"


class FaultyStep(ToyStep):
    def __init__(
        self, workload: FaultyWorkload, spec: StepSpec, device: torch.device, from_meta: bool
    ) -> None:
        super().__init__(workload, spec, device, from_meta)
        self.faulty = workload
        self.real = not from_meta

    def forward_backward(self, batches: Sequence[Batch]) -> torch.Tensor:
        precision = self.spec.precision
        if self.real and precision in self.faulty.crash:
            raise RuntimeError(f"{CRASH_MESSAGE} ({precision})")
        if self.real and precision in self.faulty.hang:
            time.sleep(3600)  # the isolation's timeout must end this
        return super().forward_backward(batches)


@dataclass(frozen=True)
class FaultyWorkload(ToyWorkload):
    crash: tuple[str, ...] = ("bf16",)
    hang: tuple[str, ...] = ("fp16",)

    def build_step(
        self, spec: StepSpec, device: str | torch.device, *, from_meta: bool = False
    ) -> FaultyStep:
        return FaultyStep(self, spec, torch.device(device), from_meta)
