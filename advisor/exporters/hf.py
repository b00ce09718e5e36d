"""``--to hf``: ``transformers.TrainingArguments`` keyword arguments as JSON, launched by torchrun.

The Trainer's global batch is per_device_train_batch_size × gradient_accumulation_steps × the
ranks torchrun starts, so the launch line is part of the export. TrainingArguments(**kw) and
HfArgumentParser.parse_json_file both reject unknown keys: the header cannot live in the JSON
and goes to ``FILE.advisor.txt`` (and stderr). Written for transformers 5.x (``fsdp=True`` with
an FSDP2 ``fsdp_config``).
"""

from __future__ import annotations

import json
from typing import Any

from advisor.exporters.record import Export
from advisor.exporters.source import (
    TORCHRUN_NODES,
    TRAIN_SCRIPT,
    Source,
    adam_hyperparameters,
    multinode_line,
    stack_blocks,
    torchrun_line,
    torchrun_world_size,
)
from advisor.exporters.text import (
    header_lines,
    selective_checkpointing_unmapped,
    workload_unmapped,
)

FILENAME = "training_args.json"
# With torch_compile, the Trainer's Accelerator compiles the whole model unless this variable
# asks its TorchDynamoPlugin for regional compilation: each repeated block compiled on its own
# (accelerate.utils.compile_regions), as advisor compiles and measured them. The Trainer builds
# the plugin in each rank, which reads the variable there (accelerate >= 1.2 in transformers 5).
REGIONAL_COMPILE_ENV = "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=true"
# The TrainConfig keys this file sets natively; every other key is named by an unmapped line.
MAPPED = frozenset(
    {
        "fsdp_reshard_after_forward",  # FSDP only: fsdp_config.reshard_after_forward
        "compile",  # torch_compile
        "global_batch_size",  # with the launch line's world size
        "micro_batch_size",
        "grad_accum_steps",
        "world_size",  # the launch line
        "precision",
        "activation_checkpointing",
        "parallelism",
        "lr",
        "min_lr",
        "warmup_steps",
        "weight_decay",
        "grad_clip",
        "seed",
        "num_workers",
    }
)


def build(source: Source) -> Export:
    c = source.config
    beta1, beta2, eps = adam_hyperparameters()
    kw: dict[str, Any] = {
        "output_dir": "hf-output",
        "per_device_train_batch_size": c.micro_batch_size,
        "gradient_accumulation_steps": c.grad_accum_steps,
        "max_steps": source.steps,
        "learning_rate": c.lr,
        "lr_scheduler_type": _scheduler_type(c.warmup_steps),
        "lr_scheduler_kwargs": {"min_lr": c.min_lr},
        "warmup_steps": c.warmup_steps,
        "optim": "adamw_torch",
        "adam_beta1": beta1,
        "adam_beta2": beta2,
        "adam_epsilon": eps,
        "weight_decay": c.weight_decay,
        "max_grad_norm": c.grad_clip,  # 0 disables clipping, as in advisor train
        "seed": c.seed,
        "dataloader_num_workers": c.num_workers,
        "bf16": c.precision == "bf16",
        "fp16": c.precision == "fp16",
        "torch_compile": c.compile,
    }
    unmapped = workload_unmapped(source)
    if c.compile:
        # torch_compile turns TF32 matmuls on (TrainingArguments.__post_init__) unless tf32 is
        # set: false keeps advisor's fp32 matmul precision, which the plan measured.
        kw["tf32"] = False
        unmapped.append(
            f"compile true: torch_compile true with {REGIONAL_COMPILE_ENV} in the environment "
            "(the launch line sets it): Accelerate then compiles each repeated block on its own "
            "(regional compilation) and each module beside them (embeddings, final norm, head) "
            "on its own, where advisor compiles only the blocks, with block.compile() before "
            "wrapping, and measured that; without the variable torch_compile compiles the "
            "whole model as one graph. tf32 false: torch_compile would otherwise turn on TF32 "
            "matmuls, which advisor's plan does not use"
        )
    unmapped += selective_checkpointing_unmapped(c, "the HF Trainer")
    full = c.activation_checkpointing == "full"
    if c.parallelism == "fsdp":
        fsdp_config: dict[str, Any] = {
            "version": 2,
            "reshard_after_forward": c.fsdp_reshard_after_forward,
            "activation_checkpointing": full,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        }
        blocks = stack_blocks(c)
        if blocks.classes:
            fsdp_config["transformer_layer_cls_to_wrap"] = blocks.names
            if blocks.note:
                unmapped.append(
                    f"parallelism fsdp: {blocks.note} in fsdp_config.transformer_layer_cls_to_wrap "
                    "(or drop the key: the Trainer then wraps a transformers model's "
                    "_no_split_modules)"
                )
        else:
            unmapped.append(
                f"parallelism fsdp: the repeated block to wrap is unknown ({blocks.unknown}); "
                "the Trainer falls back to the model's _no_split_modules"
            )
        if c.precision != "fp32":
            unmapped.append(
                f"precision {c.precision} under FSDP: the Trainer's FSDP (Accelerate's plugin) "
                f"reduces gradients in {c.precision}, advisor in fp32; no TrainingArguments "
                "key sets the reduce dtype"
            )
        kw["fsdp"] = True
        kw["fsdp_config"] = fsdp_config
    else:
        # transformers 5.x's names (gradient_checkpointing* before; read back either way).
        kw["activation_checkpointing"] = full
        if full:
            kw["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    if not source.on_gpu:
        kw["use_cpu"] = True  # CPU ranks under torchrun: Accelerate picks gloo itself
    unmapped.append(
        f"weight_decay {c.weight_decay:g}: the Trainer exempts biases and norms by name and "
        "nn.LayerNorm by type; advisor exempts every parameter with fewer than 2 dimensions "
        "(the same set for the usual Transformer, but not by the same rule)"
    )
    if c.warmup_steps > 0:
        unmapped.append(
            f"warmup_steps {c.warmup_steps}: written as lr_scheduler_type "
            f"{_scheduler_type(c.warmup_steps)}, whose warm-up is advisor's (lr·(s+1)/"
            f"{c.warmup_steps} at optimizer step s) but whose cosine runs one step ahead of "
            "advisor's (it reaches min_lr at the last step); cosine_with_min_lr would keep "
            "the cosine and start the warm-up at lr 0, one step behind"
        )
    unmapped += multinode_line(source, TORCHRUN_NODES)
    launch = torchrun_line(source, TRAIN_SCRIPT)
    if c.compile:
        launch = f"{REGIONAL_COMPILE_ENV} {launch}"
    header = header_lines(source, "hf", unmapped, launch)
    return Export(
        format="hf",
        settings=kw,
        text=json.dumps(kw, indent=2) + "\n",
        filename=FILENAME,
        unmapped=tuple(unmapped),
        launch=launch,
        sidecar="\n".join(header) + "\n",
    )


def _scheduler_type(warmup_steps: int) -> str:
    """The Trainer's schedule nearest advisor's WarmupCosine (advisor.trainer.schedule): with a
    warm-up, cosine_warmup_with_min_lr, whose warm-up is advisor's (lr·(s+1)/W; the
    cosine_with_min_lr warm-up is lr·s/W: lr 0 at the first step), its cosine one step ahead;
    without one, cosine_with_min_lr, which is advisor's at every step."""
    return "cosine_warmup_with_min_lr" if warmup_steps > 0 else "cosine_with_min_lr"


def read_back(text: str, launch: str | None) -> dict[str, Any]:
    kw = json.loads(text)
    world = torchrun_world_size(launch) if launch else None
    fsdp = bool(kw.get("fsdp"))
    fsdp_config = kw.get("fsdp_config") or {}
    full = any(
        (
            kw.get("activation_checkpointing"),
            kw.get("gradient_checkpointing"),
            fsdp_config.get("activation_checkpointing"),
        )
    )
    if fsdp:
        parallelism: str | None = "fsdp"
    else:
        parallelism = None if world is None else "ddp" if world > 1 else "single"
    per_step = kw["per_device_train_batch_size"] * kw.get("gradient_accumulation_steps", 1)
    return {
        "global_batch_size": per_step * world if world else None,
        "precision": "bf16" if kw.get("bf16") else "fp16" if kw.get("fp16") else "fp32",
        "activation_checkpointing": "full" if full else "none",
        "parallelism": parallelism,
        "world_size": world,
    }
