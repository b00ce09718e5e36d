"""AdvisorWorkload: advisor's implementation of the probes' Workload protocol.

Probes receive this picklable record (model spec, overrides, data spec) and build the very
:class:`AdvisorStep` the trainer runs, in their own (possibly child) process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from advisor.models import ModelAdapter, build_model
from advisor.trainer.step import AdvisorStep, ParallelOptions
from profilers.workload import Batch, ModelFacts, StepSpec


@dataclass(frozen=True)
class AdvisorWorkload:
    model: str
    model_args: Mapping[str, Any] = field(default_factory=dict)
    data: str = "synthetic"
    tokenizer: str | None = None
    parallel: ParallelOptions = field(default_factory=ParallelOptions)

    def describe(self) -> dict[str, Any]:
        """What profile.json records about the workload (enough to rebuild it)."""
        return {
            "model": self.model,
            "model_args": dict(self.model_args),
            "data": self.data,
            "tokenizer": self.tokenizer,
        }

    def build_adapter(self, *, meta: bool = False) -> ModelAdapter:
        return build_model(self.model, self.model_args, meta=meta)

    def facts(self) -> ModelFacts:
        return self.build_adapter(meta=True).facts()

    def build_step(
        self, spec: StepSpec, device: str | torch.device, *, from_meta: bool = False
    ) -> AdvisorStep:
        device = torch.device(device)
        if from_meta:
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            # Build real meta tensors (not fakes of meta tensors, which to_empty cannot swap);
            # then materialise under the caller's FakeTensorMode: nothing is allocated and
            # the values are garbage, by contract.
            with unset_fake_temporarily():
                adapter = self.build_adapter(meta=True)
            adapter.module.to_empty(device=device)
            adapter.retie()
        else:
            adapter = self.build_adapter()
            adapter.module.to(device)
        return AdvisorStep(adapter, spec, device, self.parallel)

    def data_batches(self, spec: StepSpec, num_workers: int, num_batches: int) -> Iterable[Batch]:
        """The trainer's own loader over the real data (CPU tensors), for the input probe."""
        from advisor.data import StepSampler, WindowDataset, make_loader, resolve_data

        adapter = self.build_adapter(meta=True)
        source = resolve_data(
            self.data,
            tokenizer=self.tokenizer,
            model_vocab=adapter.vocab_size,
            min_tokens=spec.seq_len + 1,
        )
        dataset = WindowDataset(
            source, "train", spec.seq_len, 0, adapter.make_objective(source.vocab_size)
        )
        sampler = StepSampler(
            start_step=0, num_steps=num_batches, micro_batch=spec.micro_batch_size, accum=1
        )
        return make_loader(
            dataset,
            sampler,
            micro_batch=spec.micro_batch_size,
            num_workers=num_workers,
            pin_memory=False,
        )
