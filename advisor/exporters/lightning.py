"""``--to lightning``: Trainer keyword arguments with the strategy, as a LightningCLI config.

The file is the YAML that ``LightningCLI`` reads (``python train.py fit --config
lightning.yaml``): ``seed_everything`` and a ``trainer`` section whose ``strategy`` is a
``class_path``/``init_args`` pair. Without the CLI, :func:`trainer_kwargs` turns the same
settings into ``lightning.Trainer(**kw)`` arguments (the strategy instantiated).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from advisor.exporters.record import Export
from advisor.exporters.source import (
    TORCHRUN_NODES,
    TRAIN_SCRIPT,
    Source,
    multinode_line,
    stack_blocks,
    torchrun_line,
)
from advisor.exporters.text import (
    comment_block,
    compile_unmapped,
    header_lines,
    schedule_code,
    selective_checkpointing_unmapped,
    workload_unmapped,
    yaml_text,
)

FILENAME = "lightning.yaml"
PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
PRECISIONS = {v: k for k, v in PRECISION.items()}
DDP = "lightning.pytorch.strategies.DDPStrategy"
FSDP = "lightning.pytorch.strategies.FSDPStrategy"
# The TrainConfig keys this file sets natively; every other key is named by an unmapped line.
MAPPED = frozenset(
    {
        "fsdp_reshard_after_forward",  # FSDP only: FULL_SHARD or SHARD_GRAD_OP
        "precision",
        "parallelism",
        "world_size",
        "activation_checkpointing",
        "grad_accum_steps",
        "grad_clip",
        "seed",
    }
)


def _strategy(source: Source, unmapped: list[str]) -> Any:
    c = source.config
    if c.parallelism == "ddp":
        return {"class_path": DDP, "init_args": {"gradient_as_bucket_view": True}}
    if c.parallelism == "fsdp":
        # FULL_SHARD reshards after forward; SHARD_GRAD_OP keeps the parameters gathered from
        # forward to backward (fsdp_reshard_after_forward False).
        init: dict[str, Any] = {
            "sharding_strategy": "FULL_SHARD" if c.fsdp_reshard_after_forward else "SHARD_GRAD_OP"
        }
        blocks = stack_blocks(c)
        if blocks.classes:
            init["auto_wrap_policy"] = blocks.paths
            if c.activation_checkpointing == "full":
                init["activation_checkpointing_policy"] = blocks.paths
            if blocks.note:
                unmapped.append(
                    f"parallelism fsdp: {blocks.note}, as its import path (module.Class), in "
                    "FSDPStrategy's auto_wrap_policy"
                    + (
                        " and activation_checkpointing_policy"
                        if c.activation_checkpointing == "full"
                        else ""
                    )
                    + ": a class your model lacks wraps and checkpoints nothing, with no error"
                )
        else:
            unmapped.append(
                f"parallelism fsdp: the repeated block is unknown ({blocks.unknown}): pass your "
                "block class as FSDPStrategy's auto_wrap_policy"
            )
            if c.activation_checkpointing == "full":
                unmapped.append(
                    "activation_checkpointing full: pass your block class as FSDPStrategy's "
                    "activation_checkpointing_policy"
                )
        unmapped.append(
            "parallelism fsdp: Lightning's FSDPStrategy is FSDP1 (FullyShardedDataParallel, "
            "flat parameters); advisor planned and measured FSDP2 (fully_shard), so memory and "
            "step time can differ from the prediction; Lightning's FSDP2 is ModelParallelStrategy "
            "with fully_shard applied in configure_model"
        )
        if c.precision != "fp32":
            dtype = "bfloat16" if c.precision == "bf16" else "float16"
            unmapped.append(
                f"precision {c.precision} under FSDPStrategy: Lightning reduces gradients in "
                f"{c.precision}, advisor in fp32; for advisor's, construct the strategy in code "
                f"with mixed_precision=MixedPrecision(param_dtype=torch.{dtype}, "
                f"reduce_dtype=torch.float32, buffer_dtype=torch.{dtype}) "
                "(torch.distributed.fsdp.MixedPrecision; a YAML file cannot hold a torch dtype)"
            )
        if not source.on_gpu:
            unmapped.append(
                "parallelism fsdp on CPU: Lightning's FSDPStrategy runs on GPUs only (the "
                "Trainer refuses accelerator 'cpu' with it)"
            )
        return {"class_path": FSDP, "init_args": init}
    return "auto"


def _clipping(source: Source, unmapped: list[str]) -> dict[str, Any]:
    """The Trainer's clipping: gradient_clip_val with algorithm "norm", but not under
    FSDPStrategy, whose precision plugin (FSDPPrecision.clip_grad_by_norm) raises at the first
    optimizer step for "norm": there the user's LightningModule clips through the FSDP root
    module (lightning 2.6: configure_gradient_clipping is called every step, with
    gradient_clip_val None when the Trainer has none)."""
    c = source.config
    if c.grad_clip <= 0:
        return {"gradient_clip_val": None}
    if c.parallelism != "fsdp":
        return {"gradient_clip_val": c.grad_clip, "gradient_clip_algorithm": "norm"}
    unmapped.append(
        f"grad_clip {c.grad_clip:g}: Lightning's FSDPStrategy refuses gradient_clip_algorithm "
        "'norm' (FSDPPrecision raises at the first optimizer step), so gradient_clip_val is "
        "null here; clip in your LightningModule: def configure_gradient_clipping(self, "
        "optimizer, gradient_clip_val=None, gradient_clip_algorithm=None): "
        f"self.trainer.strategy.model.clip_grad_norm_({c.grad_clip:g})"
    )
    return {"gradient_clip_val": None}


def build(source: Source) -> Export:
    c = source.config
    unmapped = workload_unmapped(source)
    unmapped += compile_unmapped(
        c.compile,
        "Lightning's Trainer",
        "call block.compile() on each repeated block in configure_model (or torch.compile(model) "
        "before trainer.fit, the whole model)",
    )
    unmapped += selective_checkpointing_unmapped(c, "Lightning")
    strategy = _strategy(source, unmapped)
    trainer: dict[str, Any] = {
        "accelerator": "gpu" if source.on_gpu else "cpu",
        "devices": source.procs_per_node,
        "num_nodes": source.nodes,
        "strategy": strategy,
        "precision": PRECISION[c.precision],
        "accumulate_grad_batches": c.grad_accum_steps,
        **_clipping(source, unmapped),
        "max_steps": source.steps,
    }
    settings = {"seed_everything": c.seed, "trainer": trainer}
    if c.activation_checkpointing == "full" and c.parallelism != "fsdp":
        unmapped.append(
            "activation_checkpointing full: only FSDPStrategy takes a checkpointing policy; wrap "
            "each repeated block in torch.utils.checkpoint.checkpoint(use_reentrant=False) in "
            "your LightningModule"
        )
    unmapped += [
        f"micro_batch_size {c.micro_batch_size}: DataLoader(batch_size={c.micro_batch_size}) "
        f"per device, so that global_batch_size {c.global_batch_size} = {c.micro_batch_size} × "
        f"{c.grad_accum_steps} × {c.world_size}",
        f"lr {c.lr:g}, min_lr {c.min_lr:g}, warmup_steps {c.warmup_steps}, weight_decay "
        f"{c.weight_decay:g}: configure_optimizers returns {schedule_code(source)} "
        "(scheduler interval 'step')",
        f"num_workers {c.num_workers}: DataLoader(num_workers={c.num_workers})",
    ]
    unmapped += multinode_line(
        source,
        TORCHRUN_NODES + "; Lightning takes the ranks from torchrun's environment and checks "
        "them against devices and num_nodes",
    )
    launch = (
        torchrun_line(source, TRAIN_SCRIPT, "fit", "--config", FILENAME)
        if source.nodes > 1
        else f"python {TRAIN_SCRIPT} fit --config {FILENAME}"
    )
    header = header_lines(source, "lightning", unmapped, launch)
    return Export(
        format="lightning",
        settings=settings,
        text=comment_block(header) + yaml_text(settings),
        filename=FILENAME,
        unmapped=tuple(unmapped),
        launch=launch,
    )


def _resolve(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def trainer_kwargs(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``lightning.Trainer(**kw)`` arguments from the exported settings: the strategy's
    class_path instantiated with its init_args (class paths in policies resolved to classes),
    as LightningCLI does."""
    kw = dict(settings["trainer"])
    strategy = kw.get("strategy")
    if isinstance(strategy, Mapping):
        init = dict(strategy.get("init_args") or {})
        for key in ("auto_wrap_policy", "activation_checkpointing_policy"):
            if key in init:
                init[key] = {_resolve(p) for p in init[key]}
        kw["strategy"] = _resolve(strategy["class_path"])(**init)
    return kw


def read_back(text: str, launch: str | None) -> dict[str, Any]:
    import yaml

    trainer = yaml.safe_load(text)["trainer"]
    strategy = trainer.get("strategy")
    path = strategy.get("class_path", "") if isinstance(strategy, Mapping) else ""
    init = strategy.get("init_args") or {} if isinstance(strategy, Mapping) else {}
    world = int(trainer.get("devices", 1)) * int(trainer.get("num_nodes", 1))
    checkpointing = "full" if init.get("activation_checkpointing_policy") else "none"
    parallelism = "fsdp" if path == FSDP else "ddp" if path == DDP or world > 1 else "single"
    return {
        # The per-device batch is the DataLoader's, not the Trainer's.
        "global_batch_size": None,
        "precision": PRECISIONS[str(trainer.get("precision", "32-true"))],
        "activation_checkpointing": checkpointing,
        "parallelism": parallelism,
        "world_size": world,
    }
