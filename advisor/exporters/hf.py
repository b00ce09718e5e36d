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
    TRAIN_SCRIPT,
    Source,
    adam_hyperparameters,
    block_class,
    torchrun_line,
    torchrun_world_size,
)
from advisor.exporters.text import (
    header_lines,
    selective_checkpointing_unmapped,
    workload_unmapped,
)

FILENAME = "training_args.json"
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
        "lr_scheduler_type": "cosine_with_min_lr",
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
        unmapped.append(
            "compile true: torch_compile compiles the whole model (one graph, graph breaks at "
            "the DDP/FSDP wrapper's seams); advisor compiles and measured each repeated block "
            "(block.compile() before wrapping): for the same graphs do that in your model and "
            "leave torch_compile false"
        )
    unmapped += selective_checkpointing_unmapped(c.activation_checkpointing, "the HF Trainer")
    full = c.activation_checkpointing == "full"
    if c.parallelism == "fsdp":
        fsdp_config: dict[str, Any] = {
            "version": 2,
            "reshard_after_forward": c.fsdp_reshard_after_forward,
            "activation_checkpointing": full,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        }
        block = block_class(c)
        if isinstance(block, tuple):
            fsdp_config["transformer_layer_cls_to_wrap"] = [name for _, name in block]
        else:
            unmapped.append(
                f"parallelism fsdp: the repeated block to wrap is unknown ({block}); the Trainer "
                "falls back to the model's _no_split_modules"
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
    launch = torchrun_line(source, TRAIN_SCRIPT)
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
