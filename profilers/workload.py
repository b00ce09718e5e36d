"""The seam between the probes and the code that trains: what a probe is allowed to measure.

Probes never import :mod:`advisor`. They measure a *workload*: an object satisfying
:class:`Workload`, handed to them by the caller. ``advisor`` implements it with the very step
code its trainer runs, so a probe times and traces the real training step and no step logic
exists twice.

Contract (read once, relied on everywhere):

* ``Workload`` is immutable and picklable (a frozen dataclass of strings and numbers), so a probe
  isolated in a child process receives it whole and rebuilds the model there.
* ``Workload.build_step(spec, device)`` builds a fresh model, optimizer and (for fp16) grad scaler
  for ``spec`` and returns a :class:`TrainStep`. With ``from_meta=True`` the model is built on the
  ``meta`` device and materialised with ``to_empty(device=device)``, then shared weights are
  re-tied: call it inside ``FakeTensorMode`` to trace memory without allocating. Parameter
  values are then uninitialised (garbage): only shapes, dtypes and storages are meaningful.
  The meta module must be built *outside* the caller's fake mode (under
  ``torch._subclasses.fake_tensor.unset_fake_temporarily()``): parameters created inside it are
  FakeTensors that ``to_empty`` cannot swap ("Couldn't swap Embedding.weight").
* ``TrainStep.forward_backward(batches)`` runs ``len(batches)`` micro-batches (the gradient
  accumulation of one optimizer step), the loss of each divided by their number, and returns the
  mean loss as a detached tensor (no host sync). ``TrainStep.optimizer_step()`` unscales, clips,
  steps the optimizer (and scaler), zeroes grads with ``set_to_none`` and returns
  :class:`StepStats`. ``TrainStep.step(batches)`` is both.
* ``TrainStep.synthetic_batches(generator)`` returns ``grad_accum_steps`` micro-batches of random
  tokens with the right shapes and objective on the step's device, for probes that need no data.
* Nothing here synchronises the device; callers that time must synchronise themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from profilers.checkpointing import WHOLE_MODEL, check_for_layers, parse_checkpointing, selectable

if TYPE_CHECKING:
    import torch

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
# The whole-model settings; the selective ones (``ops``, ``blocks:K``) are read by
# profilers.checkpointing, which owns the vocabulary of activation_checkpointing.
CHECKPOINTING: tuple[str, ...] = WHOLE_MODEL
PARALLELISMS: tuple[str, ...] = ("single", "ddp", "fsdp")
OBJECTIVES: tuple[str, ...] = ("causal_lm", "mlm")


class ModelContractError(Exception):
    """The model breaks the workload's contract (what its forward returns cannot be trained
    on: a loss, a pooled output): every probe of it would fail the same way, so a profile
    stops at the first with this message instead of recording one error per probe and
    ending as if it had profiled something."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepSpec:
    """The knobs one training step depends on (a slice of strategies' TrainConfig)."""

    seq_len: int
    micro_batch_size: int = 1
    grad_accum_steps: int = 1
    precision: str = "fp32"
    activation_checkpointing: str = "none"
    parallelism: str = "single"
    world_size: int = 1
    lr: float = 3e-4
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # The language-model loss over this many chunks of a micro-batch's tokens, each chunk's
    # logits recomputed in backward (advisor.models.objectives.chunked_lm_loss); 1: the plain
    # loss over the whole logits.
    loss_chunks: int = 1
    # FSDP: free each block's gathered parameters after its forward and all-gather them again in
    # backward (True: ZeRO-3-like), or keep them gathered until backward (False: ZeRO-2-like,
    # no backward all-gather, whole-model compute-dtype parameters held per rank).
    fsdp_reshard_after_forward: bool = True
    # torch.compile the repeated blocks (advisor.trainer.compile); False: eager.
    compile: bool = False

    def __post_init__(self) -> None:
        for name in (
            "seq_len",
            "micro_batch_size",
            "grad_accum_steps",
            "world_size",
            "loss_chunks",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        _check_choice("precision", self.precision, PRECISIONS)
        parse_checkpointing(self.activation_checkpointing)  # ValueError naming the forms
        _check_choice("parallelism", self.parallelism, PARALLELISMS)
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be true or false, got {self.compile!r}")
        if not isinstance(self.fsdp_reshard_after_forward, bool):
            raise ValueError(
                "fsdp_reshard_after_forward must be true or false, got "
                f"{self.fsdp_reshard_after_forward!r}"
            )
        if not self.fsdp_reshard_after_forward and self.parallelism != "fsdp":
            raise ValueError(
                "fsdp_reshard_after_forward false keeps FSDP's gathered parameters, but "
                f"parallelism is {self.parallelism!r}: use --parallelism fsdp, or drop "
                "--no-fsdp-reshard-after-forward"
            )
        if self.parallelism == "single" and self.world_size != 1:
            raise ValueError(
                f"parallelism 'single' runs on one device but world_size is {self.world_size}: "
                "use --parallelism ddp or fsdp, or --world-size 1"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}: choose one of {', '.join(choices)}")


# Why the knobs that need a model's repeated blocks are unavailable without them.
NO_REPEATED_BLOCKS = (
    "the model has no repeated blocks (an nn.ModuleList of layers, none sharing parameters "
    "with another), so there is no block to recompute"
)


# Why a chunked loss (``loss_chunks`` > 1) is unavailable without an output head.
NO_OUTPUT_HEAD = (
    "the model exposes no output head (get_output_embeddings() returning the nn.Linear whose "
    "output is its forward's logits), so its loss cannot be computed chunk by chunk"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelFacts:
    """Shape facts of a model, the same for every model family.

    ``repeated_blocks``: whether the model keeps its layers as repeated blocks (an
    ``nn.ModuleList``). Without them (one layer, an ``nn.Sequential`` ...) ``num_layers`` is 0,
    activation checkpointing per block is unavailable (:meth:`checkpointing_modes`) and FSDP
    shards the whole model as one unit (the root).
    """

    name: str
    family: str
    objective: str
    num_params: int
    num_trainable_params: int
    num_embedding_params: int
    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    max_seq_len: int
    block_class: str  # the blocks' class names, "+"-joined when they mix classes (Jamba)
    ffn_hidden_size: int | None = None
    num_kv_heads: int | None = None
    tied_embeddings: bool = False
    repeated_blocks: bool = True
    # Whether the loss can be chunked (``loss_chunks`` > 1): the model exposes its output head.
    # Off for records written before chunking existed; ``output_head_reason`` says why not.
    output_head: bool = False
    output_head_reason: str = ""
    # The index of the first repeated block from which the blocks repeat (class, parameter
    # names and shapes) with ``block_period``: 0 and 1 when all are alike, P when the first P
    # differ (DeepSeek-V3's 3 dense layers before its MoE layers), period 2 when dense and MoE
    # layers alternate (Llama 4 Maverick), the last index when no pattern holds. The shallow
    # copies a deep model is counted and traced from keep the P first blocks and whole periods
    # (profilers.memory_blocks.depth_scaling). Both written only when not 0 and 1.
    uniform_blocks_from: int = 0
    block_period: int = 1
    # The parameters of the largest block when the blocks differ in size (Jamba's MoE layers
    # against its dense ones); 0 when they are all the same size. Written only when not 0.
    largest_block_params: int = 0
    # The CUDA kernels the model's state-space (Mamba) layers call where they are installed
    # (``mamba_ssm.selective_scan_fn`` ...): a CUDA target's trace holds their memory, not the
    # PyTorch fallback's (profilers.ssm_kernels). Written only when not empty.
    state_space_kernels: tuple[str, ...] = ()
    # The attention heads' width where it is not ``hidden_size // num_heads`` (Qwen3-4B's 128
    # against 80, Gemma 3's 256; DeepSeek-V3's multi-head latent attention: the mean of its
    # query/key and value widths, which gives its score and output FLOPs); 0 otherwise. Written
    # only when not 0.
    head_dim: int = 0

    @property
    def attention_head_dim(self) -> int:
        """The attention heads' width: :attr:`head_dim`, else ``hidden_size // num_heads`` (0
        without heads)."""
        if self.head_dim:
            return self.head_dim
        return self.hidden_size // self.num_heads if self.num_heads > 0 else 0

    def checkpointing_modes(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the activation-checkpointing modes this model can run, why the others cannot)."""
        if self.repeated_blocks:
            return selectable(self.num_layers), ()
        kept = tuple(c for c in CHECKPOINTING if c == "none")
        # One reason for every setting that recomputes blocks (full, ops, blocks:K).
        return kept, tuple(
            f"{c} checkpointing: {NO_REPEATED_BLOCKS}" for c in CHECKPOINTING if c not in kept
        )

    def checkpointing_problem(self, value: str) -> str | None:
        """Why this model cannot run activation checkpointing ``value`` (one line), or None."""
        try:
            parsed = check_for_layers(value, self.num_layers)
        except ValueError as exc:
            return str(exc)
        if parsed.recomputes and not self.repeated_blocks:
            return f"{value} checkpointing: {NO_REPEATED_BLOCKS}"
        return None

    def loss_chunking_unavailable(self) -> str:
        """Why ``loss_chunks`` > 1 cannot run on this model; empty when it can."""
        if self.output_head:
            return ""
        why = self.output_head_reason or (
            "this profile predates chunked losses: re-run 'advisor profile' to measure it"
        )
        return f"chunked loss: {why}"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not data["uniform_blocks_from"]:  # written only when some blocks differ
            del data["uniform_blocks_from"]
        if data["block_period"] == 1:
            del data["block_period"]
        if not data["largest_block_params"]:
            del data["largest_block_params"]
        if data["state_space_kernels"]:
            data["state_space_kernels"] = list(data["state_space_kernels"])
        else:
            del data["state_space_kernels"]
        if not data["head_dim"]:
            del data["head_dim"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelFacts:
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        if "state_space_kernels" in known:
            known["state_space_kernels"] = tuple(known["state_space_kernels"])
        return cls(**known)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepStats:
    """What one optimizer step reports back (tensors stay on the device: no sync)."""

    grad_norm: torch.Tensor
    skipped: torch.Tensor | None = None  # fp16: bool tensor, True if GradScaler skipped the step
    loss_scale: torch.Tensor | None = None  # fp16: GradScaler's scale after this step's update


Batch = Mapping[str, "torch.Tensor"]


@runtime_checkable
class TrainStep(Protocol):
    """One configured training step: model, optimizer and the step logic."""

    spec: StepSpec
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device

    def synthetic_batches(self, generator: torch.Generator | None = None) -> Sequence[Batch]: ...

    def forward_backward(self, batches: Sequence[Batch]) -> torch.Tensor: ...

    def optimizer_step(self) -> StepStats: ...

    def step(self, batches: Sequence[Batch]) -> tuple[torch.Tensor, StepStats]: ...


class PrimableStep(Protocol):
    """A :class:`TrainStep` that can create its optimizer's state without a forward and
    backward (optional; the memory tracers use it for the iteration they do not measure)."""

    def prime_optimizer_state(self) -> None:
        """One optimizer step on zero gradients: afterwards the optimizer's (and any loss
        scaler's) state exists and no gradient is held, as after a real first step."""
        ...


def optimizer_primer(step: TrainStep) -> Callable[[], None] | None:
    """The step's ``prime_optimizer_state`` (:class:`PrimableStep`), or None if it has none.
    Looked up on the step, not by ``isinstance``: a runtime protocol check is cached per class."""
    prime = getattr(step, "prime_optimizer_state", None)
    return prime if callable(prime) else None


@runtime_checkable
class Workload(Protocol):
    """A model (and optionally its data) that probes can build steps of."""

    def facts(self) -> ModelFacts: ...

    def build_step(
        self, spec: StepSpec, device: str | torch.device, *, from_meta: bool = False
    ) -> TrainStep: ...


@runtime_checkable
class DataWorkload(Workload, Protocol):
    """A workload whose real input pipeline can be measured (the input probe)."""

    def data_batches(
        self, spec: StepSpec, num_workers: int, num_batches: int
    ) -> Iterable[Batch]: ...


@runtime_checkable
class BlockScalableWorkload(Workload, Protocol):
    """A workload whose repeated blocks are identical and can be cut, so a deep model's memory
    is traced from shallow copies of it (:mod:`profilers.memory_blocks`)."""

    def with_blocks(self, keep: int) -> Workload:
        """The same workload with only the first ``keep`` repeated blocks (embedding, head,
        loss and optimizer unchanged)."""
        ...

    def step_blocks(self, step: TrainStep) -> Sequence[torch.nn.Module]:
        """The repeated blocks of a step this workload built, in forward order (as wrapped
        for the step, e.g. by activation checkpointing)."""
        ...
