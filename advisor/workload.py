"""AdvisorWorkload: advisor's implementation of the probes' Workload protocol.

Probes receive this picklable record (model spec, overrides, data spec) and build the very
:class:`AdvisorStep` the trainer runs, in their own (possibly child) process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from advisor.models import ModelAdapter, build_model
from advisor.trainer.step import AdvisorStep, ParallelOptions
from profilers.workload import Batch, ModelFacts, StepSpec, TrainStep


@dataclass(frozen=True)
class AdvisorWorkload:
    model: str
    model_args: Mapping[str, Any] = field(default_factory=dict)
    data: str = "synthetic"
    tokenizer: str | None = None
    parallel: ParallelOptions = field(default_factory=ParallelOptions)
    # Only the first N repeated blocks (None: all): the shallow copies a deep model's memory is
    # traced from (profilers.memory_blocks). Never used to train.
    keep_blocks: int | None = None

    def describe(self) -> dict[str, Any]:
        """What profile.json records about the workload (enough to rebuild it)."""
        return {
            "model": self.model,
            "model_args": dict(self.model_args),
            "data": self.data,
            "tokenizer": self.tokenizer,
        }

    def build_adapter(self, *, meta: bool = False) -> ModelAdapter:
        adapter = build_model(self.model, self.model_args, meta=meta)
        if self.keep_blocks is not None:
            del adapter.blocks()[self.keep_blocks :]
        return adapter

    def with_blocks(self, keep: int) -> AdvisorWorkload:
        """This workload with only its first ``keep`` repeated blocks (for memory tracing)."""
        return dataclasses.replace(self, keep_blocks=keep)

    def step_blocks(self, step: TrainStep) -> Sequence[torch.nn.Module]:
        """The repeated blocks of a step built here, as wrapped for it (checkpointing)."""
        assert isinstance(step, AdvisorStep)
        return list(step.adapter.blocks())

    def facts(self) -> ModelFacts:
        return self.build_adapter(meta=True).facts()

    def build_step(
        self,
        spec: StepSpec,
        device: str | torch.device,
        *,
        from_meta: bool = False,
        before_wrap: Callable[[ModelAdapter], None] | None = None,
    ) -> AdvisorStep:
        """``before_wrap``: called with the placed model before any wrapper (checkpointing,
        DDP, FSDP), e.g. to load initial weights on every rank."""
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
        if before_wrap is not None:
            before_wrap(adapter)
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
            model=self.model,
            need_val=False,  # the input probe reads the train split
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
