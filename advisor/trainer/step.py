"""The one training step, shared by ``advisor train`` and every probe (via AdvisorWorkload).

Wrapping order lives in :func:`prepare_module` (as in torchtitan): activation checkpointing of
the repeated blocks, then torch.compile of each block (:mod:`advisor.trainer.compile`), then
data parallelism (DDP, or FSDP2 per block then the root), then the optimizer over the (possibly
sharded) parameters.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from advisor.models.adapter import ModelAdapter, extract_logits
from advisor.models.objectives import chunked_lm_loss, lm_loss
from advisor.trainer.autocast_ops import enable_grouped_mm_autocast
from profilers.checkpointing import checkpointed_blocks, parse_checkpointing
from profilers.workload import Batch, StepSpec, StepStats

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ADAM_BETAS = (0.9, 0.95)  # GPT-3 (Brown et al. 2020, App. B), as in nanoGPT
ADAM_EPS = 1e-8


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelOptions:
    """Knobs of the data-parallel wrappers that are not part of the plan's identity."""

    ddp_bucket_cap_mb: float = 25.0


def apply_activation_checkpointing(adapter: ModelAdapter, setting: str = "full") -> None:
    """Wrap the repeated blocks ``setting`` names in non-reentrant ``torch.utils.checkpoint``.

    ``full`` and ``blocks:K`` (profilers.checkpointing.checkpointed_blocks says which K) save
    only each wrapped block's input; ``ops`` wraps every block with the selective policy of
    :func:`save_matmuls_policy`, ``ops-half`` with :func:`alternate_matmuls_contexts`'s. The
    wrapper's state-dict hooks strip its prefix, so
    checkpoints load with or without it.
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    blocks = adapter.blocks()
    kwargs: dict[str, Any] = {}
    kind = parse_checkpointing(setting).kind
    if kind == "ops":
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        kwargs["context_fn"] = functools.partial(
            create_selective_checkpoint_contexts, save_matmuls_policy
        )
    elif kind == "ops-half":
        kwargs["context_fn"] = alternate_matmuls_contexts
    for i in checkpointed_blocks(setting, len(blocks)):
        blocks[i] = checkpoint_wrapper(
            blocks[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs
        )


@functools.cache
def _saved_ops() -> frozenset[Any]:
    """The ops whose outputs ``ops`` checkpointing keeps: matmuls and attention (every SDPA
    kernel: CPU flash, CUDA flash / memory-efficient / cuDNN), the expensive part to recompute;
    everything else in a block (norms, activations, element-wise, views) is recomputed."""
    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
    )
    return frozenset(getattr(aten, n).default for n in names if hasattr(aten, n))


@functools.cache
def _expert_matmuls() -> frozenset[Any]:
    """A mixture-of-experts layer's grouped GEMMs (Hugging Face's experts run one per
    projection): matmuls ``ops`` saves too. ``ops-half`` does not: torchtitan's ``op`` policy,
    which it mirrors, has no grouped GEMM in its save list, so it recomputes the experts."""
    op = getattr(torch.ops.aten, "_grouped_mm", None)
    return frozenset() if op is None else frozenset({op.default})


def save_matmuls_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """Selective-checkpoint policy of ``ops``: must save matmul (mixture-of-experts grouped
    GEMMs included) and attention outputs, prefer recomputing the rest
    (torch.utils.checkpoint.CheckpointPolicy)."""
    from torch.utils.checkpoint import CheckpointPolicy

    if op in _saved_ops() or op in _expert_matmuls():
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


# The linear layers' matmuls ``ops-half`` counts (torchtitan's ``op`` policy counts aten.mm:
# its Llama has no biases; a linear layer with a bias runs addmm instead).
_COUNTED_MATMULS = ("mm", "addmm")


@functools.cache
def _counted_matmuls() -> frozenset[Any]:
    return frozenset(getattr(torch.ops.aten, n).default for n in _COUNTED_MATMULS)


def alternate_matmuls_contexts() -> Any:
    """The (forward, recompute) contexts of one ``ops-half`` checkpoint call: attention and
    the odd-numbered linear-layer matmuls of the block are saved, the even-numbered ones and
    everything else recomputed (torchtitan's ``op`` policy). The count starts afresh for each
    call (a block's forward) and separately in its recompute, so both passes agree on which
    outputs were saved."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    counts = {False: 0, True: 0}  # is_recompute -> matmuls seen

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        if op in _counted_matmuls():
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        if op in _saved_ops():
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def prepare_module(
    adapter: ModelAdapter, spec: StepSpec, device: torch.device, options: ParallelOptions
) -> nn.Module:
    """Checkpointing, then compile, then parallelism; returns the module the step calls."""
    if spec.activation_checkpointing != "none":
        apply_activation_checkpointing(adapter, spec.activation_checkpointing)
    if spec.compile:  # per block, before DDP/FSDP: advisor.trainer.compile says why
        from advisor.trainer.compile import apply_compile

        apply_compile(adapter)
    module = adapter.module
    if spec.parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            # Gradients live in the communication buckets: saves one gradient copy.
            gradient_as_bucket_view=True,
            bucket_cap_mb=options.ddp_bucket_cap_mb,
        )
    if spec.parallelism == "fsdp":
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # The mesh is bookkeeping on real tensors, also when a probe traces under FakeTensorMode.
        with unset_fake_temporarily():
            mesh = init_device_mesh(device.type, (spec.world_size,))
        dtype = AUTOCAST_DTYPES.get(spec.precision)
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for block in adapter.blocks():
            fully_shard(
                block,
                mesh=mesh,
                mp_policy=policy,
                # False: kept gathered from forward to backward (no all-gather in backward).
                reshard_after_forward=spec.fsdp_reshard_after_forward,
            )
        # The root keeps its parameters gathered after forward: backward needs them at once.
        fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return module


def build_optimizer(module: nn.Module, spec: StepSpec, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms and biases), fused where possible."""
    params = [p for p in module.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": spec.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # Not with FSDP: ShardedGradScaler's 1-element found_inf does not broadcast in fused AdamW
    # over DTensors ("output with shape [] doesn't match the broadcast shape [1]").
    fused = (
        device.type in ("cuda", "cpu")
        and spec.parallelism != "fsdp"
        and all(p.is_floating_point() for p in params)
    )
    return torch.optim.AdamW(groups, lr=spec.lr, betas=ADAM_BETAS, eps=ADAM_EPS, fused=fused)


_FOUND_INF_REPLICATED = "Found a non-scalar tensor with numel=1 and ndim!=0"


def make_grad_scaler(spec: StepSpec, device: torch.device) -> Any:
    """Dynamic loss scaling for fp16 only (bf16 has fp32's exponent range)."""
    enabled = spec.precision == "fp16"
    if enabled and spec.parallelism == "fsdp":
        # Sharded gradients: found-inf must be agreed across ranks.
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type, enabled=enabled)


class AdvisorStep:
    """A :class:`profilers.workload.TrainStep`: the real training step of ``advisor train``."""

    def __init__(
        self,
        adapter: ModelAdapter,
        spec: StepSpec,
        device: torch.device,
        options: ParallelOptions | None = None,
    ) -> None:
        self.adapter, self.spec, self.device = adapter, spec, device
        # loss_chunks > 1: the model returns its final hidden states, the loss applies the head.
        self.head = adapter.defer_output_head() if spec.loss_chunks > 1 else None
        self.model = prepare_module(adapter, spec, device, options or ParallelOptions())
        self.optimizer: torch.optim.Optimizer = build_optimizer(self.model, spec, device)
        self.scaler = make_grad_scaler(spec, device)
        self.autocast_dtype = AUTOCAST_DTYPES.get(spec.precision)
        if self.autocast_dtype is not None:
            # MoE experts' grouped GEMMs in the autocast dtype too (they ran in fp32).
            enable_grouped_mm_autocast()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def synthetic_batches(self, generator: torch.Generator | None = None) -> list[Batch]:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        objective = self.adapter.make_objective(min(self.adapter.vocab_size, 256))
        shape = (self.spec.micro_batch_size, self.spec.seq_len + 1)
        batches: list[Batch] = []
        for _ in range(self.spec.grad_accum_steps):
            # Real tokens even under FakeTensorMode: MLM masking is data-dependent.
            with unset_fake_temporarily():
                window = torch.randint(objective.data_vocab_size, shape, generator=gen)
                example = objective.example(window, gen)
            batches.append({k: v.to(self.device) for k, v in example.items()})
        return batches

    def loss(self, batch: Batch) -> torch.Tensor:
        with self.autocast():
            ids = batch["input_ids"]
            logits = extract_logits(self.model(ids), ids)
            if self.head is not None:  # not logits: the final hidden states
                return chunked_lm_loss(logits, self.head, batch["labels"], self.spec.loss_chunks)
            return lm_loss(logits, batch["labels"])

    def forward_backward(self, batches: Sequence[Batch]) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        last = len(batches) - 1
        for i, batch in enumerate(batches):
            with self._sync_gradients(i == last):
                # Equal tokens per micro-batch: the mean of the means is the global-batch mean.
                loss = self.loss(batch) / len(batches)
                self.scaler.scale(loss).backward()
            total += loss.detach()
        return total

    def _sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager[Any]:
        # DDP: all-reduce only on the last micro-batch of an accumulation.
        no_sync = getattr(self.model, "no_sync", None)
        if not sync and self.spec.parallelism == "ddp" and no_sync is not None:
            return no_sync()
        return contextlib.nullcontext()

    def optimizer_step(self) -> StepStats:
        fp16 = self.scaler.is_enabled()
        if fp16:
            with warnings.catch_warnings():
                # FSDP: torch's ShardedGradScaler keeps found-inf as a 1-element tensor, which
                # DTensor warns it replicates (every step's first unscale; nothing to act on).
                warnings.filterwarnings("ignore", message=_FOUND_INF_REPLICATED)
                self.scaler.unscale_(self.optimizer)
            # The scale tensor (no host sync): update() backs it off exactly when it skips.
            scale_before = self.scaler._scale.clone()
        max_norm = self.spec.grad_clip if self.spec.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor norm
            grad_norm = grad_norm.full_tensor()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if fp16:
            scale = self.scaler._scale
            return StepStats(grad_norm=grad_norm, skipped=scale < scale_before, loss_scale=scale)
        return StepStats(grad_norm=grad_norm)

    def step(self, batches: Sequence[Batch]) -> tuple[torch.Tensor, StepStats]:
        loss = self.forward_backward(batches)
        return loss, self.optimizer_step()

    def prime_optimizer_state(self) -> None:
        """A :class:`profilers.workload.PrimableStep`: one optimizer step on zero gradients
        (the loss scaler's scale created as its first ``scale()`` creates it), leaving the
        optimizer the same state tensors a real first step leaves it, and no gradient held."""
        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        if self.scaler.is_enabled():
            self.scaler.scale(torch.zeros((), device=self.device))
        self.optimizer_step()
