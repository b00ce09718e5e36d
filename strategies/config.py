"""TrainConfig: the plan record. The search produces it, the trainer runs it, the report shows it.

The global batch (sequences per optimizer step) is the user's training semantics and is held
fixed: ``micro_batch_size * grad_accum_steps * data_parallel_size == global_batch_size``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profilers.workload import StepSpec

# The defaults of a run with no arguments (the CPU demo: gpt-tiny on Python's own sources,
# about three minutes of ``advisor run`` on two cores); every command and the report use these.
DEFAULT_MODEL = "gpt-tiny"
DEFAULT_DATA = "stdlib"
DEFAULT_SEQ_LEN = 128
DEFAULT_GLOBAL_BATCH_SIZE = 8
DEFAULT_STEPS = 300  # the run length when neither --steps nor --tokens is given


class ConfigError(ValueError):
    """A TrainConfig that cannot be run; the message names the fix."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: str = DEFAULT_MODEL
    model_args: Mapping[str, Any] = field(default_factory=dict)
    data: str = DEFAULT_DATA
    tokenizer: str | None = None  # local HF tokenizer dir for text data; None: byte-level
    seq_len: int = DEFAULT_SEQ_LEN
    global_batch_size: int = DEFAULT_GLOBAL_BATCH_SIZE
    micro_batch_size: int = DEFAULT_GLOBAL_BATCH_SIZE
    grad_accum_steps: int = 1
    precision: str = "fp32"
    activation_checkpointing: str = "none"
    parallelism: str = "single"
    world_size: int = 1
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1337
    num_workers: int = 0
    # The LM loss over this many chunks of each micro-batch's tokens, their logits recomputed in
    # backward (advisor.models.objectives.chunked_lm_loss); 1: the plain loss (old plans).
    loss_chunks: int = 1
    # FSDP only: reshard each block's parameters after forward (all-gathered again in backward)
    # or keep them gathered until backward; True (and old plans): reshard.
    fsdp_reshard_after_forward: bool = True
    # torch.compile each repeated block (advisor.trainer.compile); False (and old plans): eager.
    compile: bool = False
    # Initial weights (advisor.trainer.checkpoint.resolve_init_from): a weights file or a
    # checkpoint directory. None: the model's own (hf:DIR: DIR's weights when it has any).
    init_from: str | None = None

    def __post_init__(self) -> None:
        try:
            self.step_spec()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for name in ("global_batch_size",):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        produced = self.micro_batch_size * self.grad_accum_steps * self.data_parallel_size
        if produced != self.global_batch_size:
            raise ConfigError(
                f"micro_batch_size {self.micro_batch_size} x grad_accum_steps "
                f"{self.grad_accum_steps} x data-parallel size {self.data_parallel_size} = "
                f"{produced}, not the global batch size {self.global_batch_size}: change one of "
                "them so the product matches"
            )
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                # lr="a" failed as "'>' not supported between instances of 'str' and 'int'"
                raise ConfigError(f"{name} must be a number, got {value!r}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be positive, got {self.lr}")
        if self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(
                f"min_lr must be between 0 and lr ({self.lr:g}), got {self.min_lr:g}: the cosine "
                "decays from lr to min_lr (--min-lr below --lr)"
            )
        for name in ("warmup_steps", "num_workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.grad_clip < 0:
            raise ConfigError(f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")
        if not self.model:
            raise ConfigError("model must name a model spec, e.g. gpt-tiny")
        if self.init_from is not None and (
            not isinstance(self.init_from, str) or not self.init_from.strip()
        ):
            raise ConfigError(
                f"init_from must be the path of a weights file or checkpoint directory, got "
                f"{self.init_from!r}"
            )

    @property
    def data_parallel_size(self) -> int:
        """Ranks that each see distinct data (every rank, for both DDP and FSDP)."""
        return self.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def step_spec(self) -> StepSpec:
        return StepSpec(
            seq_len=self.seq_len,
            micro_batch_size=self.micro_batch_size,
            grad_accum_steps=self.grad_accum_steps,
            precision=self.precision,
            activation_checkpointing=self.activation_checkpointing,
            parallelism=self.parallelism,
            world_size=self.world_size,
            lr=self.lr,
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
            loss_chunks=self.loss_chunks,
            fsdp_reshard_after_forward=self.fsdp_reshard_after_forward,
            compile=self.compile,
        )

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["model_args"] = dict(self.model_args)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        if not isinstance(data, Mapping):
            raise ConfigError("a TrainConfig must be a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"unknown TrainConfig key(s) {', '.join(unknown)}; known keys: "
                + ", ".join(sorted(names))
            )
        try:
            return cls(**dict(data))
        except TypeError as exc:
            raise ConfigError(f"invalid TrainConfig: {exc}") from None


def load_plan_config(path: str | Path) -> TrainConfig:
    """Read the TrainConfig of a plan.json (its ``config`` object) or of a bare config file."""
    path = Path(path)
    if path.is_dir():
        # A run directory: its plan.json, as 'advisor export' and 'advisor tune' take it (it
        # was "plan file RUN does not exist", of a directory that exists).
        from profilers.rundir import RunDir

        if not RunDir(path).plan.is_file():
            raise ConfigError(
                f"{path} is a directory without a plan.json: pass the plan.json that 'advisor "
                "recommend' wrote, or the run directory holding it"
            )
        path = RunDir(path).plan
    if not path.is_file():
        raise ConfigError(
            f"plan file {path} does not exist: pass the plan.json that 'advisor recommend' wrote"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"plan file {path} is not valid JSON ({exc}): regenerate it with 'advisor recommend'"
        ) from None
    if isinstance(data, dict) and "config" in data:
        data = data["config"]
    return TrainConfig.from_dict(data)


# TrainConfig keys by role. What a profile measured (a plan keeps them); the hyper-parameters
# and initial weights a plan carries unchanged (the search never turns them); the keys written
# as one ``--flag VALUE`` each by the CLI's config options (model, model args, data and the
# tokenizer have options of their own), in the order the flags are written.
WORKLOAD_KEYS: tuple[str, ...] = ("model", "model_args", "data", "tokenizer", "seq_len")
HYPERPARAMETER_KEYS: tuple[str, ...] = (
    "lr",
    "min_lr",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "seed",
    "init_from",
)
CONFIG_FLAG_KEYS: tuple[str, ...] = tuple(
    f.name
    for f in dataclasses.fields(TrainConfig)
    if f.name not in ("model", "model_args", "data", "tokenizer")
)
BATCH_KEYS = frozenset({"global_batch_size", "micro_batch_size", "grad_accum_steps", "world_size"})


def compose_config(base: TrainConfig, overrides: Mapping[str, Any]) -> TrainConfig:
    """``base`` with ``overrides`` applied, keeping micro x accum x world = global consistent.

    Without an explicit global batch it follows from the other three; with one (and no explicit
    accumulation) the accumulation follows from it.
    """
    changes = dict(overrides)
    if changes.keys() & BATCH_KEYS:
        micro = changes.get("micro_batch_size", base.micro_batch_size)
        world = changes.get("world_size", base.world_size)
        if "global_batch_size" not in changes:
            accum = changes.get("grad_accum_steps", base.grad_accum_steps)
            changes["global_batch_size"] = micro * accum * world
        elif "grad_accum_steps" not in changes:
            per_step = micro * world
            gbs = changes["global_batch_size"]
            if gbs % per_step:
                # A micro-batch fixes it only where the world size divides the global batch.
                fix = (
                    "pick a micro-batch size that divides it"
                    if gbs % world == 0
                    else f"pick a multiple of {world} for --global-batch-size or a world size "
                    "that divides it"
                )

                # The flags' names, and where a value the user did not give came from
                # (--global-batch-size 7 alone read "not a multiple of micro_batch_size 8").
                def given(key: str, flag: str, value: int) -> str:
                    return f"{flag} {value}" + ("" if key in changes else " (not given)")

                raise ConfigError(
                    f"--global-batch-size {gbs} is not a multiple of "
                    f"{given('micro_batch_size', '--micro-batch-size', micro)} x "
                    f"{given('world_size', '--world-size', world)}: {fix}"
                )
            changes["grad_accum_steps"] = changes["global_batch_size"] // per_step
    try:
        return dataclasses.replace(base, **changes)
    except TypeError as exc:
        raise ConfigError(f"invalid TrainConfig override: {exc}") from None
