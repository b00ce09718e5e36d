"""``--to torchtitan``: a torchtitan job config (TOML) for ``-m torchtitan.train``.

torchtitan holds the whole batch arithmetic (local and global batch: it derives the
accumulation), the layout as data-parallel degrees (replicate = DDP, shard = FSDP2), the
checkpointing mode, AdamW and a warm-up + cosine schedule with a floor (``min_lr_factor``).
Its mixed precision is bfloat16 or float32 only: an fp16 plan is refused (one line naming the
fix), since a float32 file would need far more memory and time than the fp16 plan's prediction
that its header would show.
"""

from __future__ import annotations

import math
from typing import Any

from advisor.errors import UsageProblem
from advisor.exporters.record import Export
from advisor.exporters.source import (
    TORCHRUN_NODES,
    Source,
    adam_hyperparameters,
    multinode_line,
    num_layers,
    torchrun_line,
)
from advisor.exporters.text import (
    advisor_blocks,
    comment_block,
    header_lines,
    index_list,
    ordinal,
    plural,
    toml_text,
    workload_unmapped,
)
from strategies.config import TrainConfig

FILENAME = "torchtitan.toml"
MIXED_PRECISION = {"fp32": "float32", "bf16": "bfloat16"}
# The TrainConfig keys this file sets natively; every other key is named by an unmapped line.
MAPPED = frozenset(
    {
        "fsdp_reshard_after_forward",  # FSDP only: parallelism.fsdp_reshard_after_forward
        "compile",  # compile.enable with components ["model"]: each block, as advisor does
        "global_batch_size",
        "micro_batch_size",
        "grad_accum_steps",  # torchtitan derives it from the two batch sizes
        "world_size",
        "precision",
        "activation_checkpointing",
        "parallelism",
        "seq_len",
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
    unmapped = workload_unmapped(source, seq_len_mapped=True)
    precision = MIXED_PRECISION.get(c.precision)
    if precision is None:
        raise UsageProblem(
            f"torchtitan has no {c.precision} mixed precision (bfloat16 or float32 only, no loss "
            "scaling), and the plan's predictions hold for fp16 alone: plan again with "
            "'advisor recommend --only precision=bf16' (or fp32; in Python "
            "only={'precision': ['bf16']}) and export that plan, or export this one to hf, "
            "accelerate, lightning or deepspeed"
        )
    unmapped.append(
        f"model {c.model}: torchtitan trains the model its [model] section names (name and "
        "flavor of a registered TrainSpec; without one, its own llama3 debugmodel): register "
        "your model with torchtitan and set [model] name and flavor in this file"
    )
    if not source.on_gpu:
        unmapped.append(
            f"parallelism {c.parallelism} on CPU: torchtitan trains on GPUs only (its device "
            "falls back to cuda), so this plan's machine cannot run the file: re-plan for the "
            "GPUs with 'advisor recommend --target ...'"
        )
    world = c.world_size
    degrees = {
        "single": (1, 1),
        "ddp": (world, 1),
        "fsdp": (1, world),
    }[c.parallelism]
    settings: dict[str, Any] = {
        "job": {"description": f"advisor plan {source.origin}"},
        "training": {
            "local_batch_size": c.micro_batch_size,
            "global_batch_size": c.global_batch_size,
            "seq_len": c.seq_len,
            "steps": source.steps,
            # torchtitan always clips; an infinite norm never does (advisor's grad_clip 0).
            "max_norm": c.grad_clip if c.grad_clip > 0 else math.inf,
            "mixed_precision_param": precision,
            "mixed_precision_reduce": "float32",
            "dataloader": {"num_workers": c.num_workers},
        },
        "optimizer": {
            "name": "AdamW",
            "lr": c.lr,
            "beta1": beta1,
            "beta2": beta2,
            "eps": eps,
            "weight_decay": c.weight_decay,
        },
        "lr_scheduler": {
            "warmup_steps": c.warmup_steps,
            "decay_type": "cosine",
            "min_lr_factor": c.min_lr / c.lr,
        },
        "activation_checkpoint": _activation_checkpoint(c, unmapped),
        "parallelism": {
            "data_parallel_replicate_degree": degrees[0],
            "data_parallel_shard_degree": degrees[1],
            # always: every block resharded after forward (advisor's FSDP); never: kept.
            **(
                {
                    "fsdp_reshard_after_forward": "always"
                    if c.fsdp_reshard_after_forward
                    else "never"
                }
                if c.parallelism == "fsdp"
                else {}
            ),
        },
        "compile": _compile(c.compile, unmapped),
        "debug": {"seed": c.seed},
    }
    unmapped.append(
        f"weight_decay {c.weight_decay:g}: torchtitan decays every parameter; advisor exempts "
        "biases and norms"
    )
    unmapped += multinode_line(source, TORCHRUN_NODES)
    launch = torchrun_line(source, "-m", "torchtitan.train", "--job.config_file", FILENAME)
    header = header_lines(source, "torchtitan", unmapped, launch)
    return Export(
        format="torchtitan",
        settings=settings,
        text=comment_block(header) + toml_text(settings),
        filename=FILENAME,
        unmapped=tuple(unmapped),
        launch=launch,
    )


def _compile(compiled: bool, unmapped: list[str]) -> dict[str, Any]:
    """torchtitan's ``compile``: ``enable``, and ``components``, whose default ["model",
    "loss"] also compiles the loss (torchtitan 0.2's components.loss): advisor compiles the
    repeated blocks only (the model's parallelize_fn compiles each TransformerBlock under
    "model") and keeps the head and loss eager, as measured."""
    if not compiled:
        return {"enable": False}
    unmapped.append(
        'compile true: written as compile.components ["model"]: torchtitan\'s llama3 '
        "parallelize_fn then compiles each TransformerBlock, as advisor compiles each repeated "
        "block (your model's parallelize_fn must do the same); torchtitan's default "
        '["model", "loss"] would compile the loss too, which advisor keeps eager'
    )
    return {"enable": True, "components": ["model"]}


def _activation_checkpoint(c: TrainConfig, unmapped: list[str]) -> dict[str, Any]:
    """torchtitan's ``activation_checkpoint``: mode none | full | selective, and for selective
    ``selective_ac_option`` "op" (per op) or N (every N-th layer, torchtitan's layers N-1,
    2N-1, ...)."""
    from profilers.checkpointing import parse_checkpointing

    parsed = parse_checkpointing(c.activation_checkpointing)
    if parsed.kind in ("none", "full"):
        return {"mode": parsed.kind}
    if parsed.kind == "ops":
        unmapped.append(
            "activation_checkpointing ops: written as torchtitan's selective_ac_option 'op', "
            "whose policy saves attention but only every other matmul output (advisor's saves "
            "every one; advisor's ops-half is torchtitan's): more recompute, less memory than "
            "advisor predicted"
        )
        return {"mode": "selective", "selective_ac_option": "op"}
    if parsed.kind == "ops-half":  # the same policy (profilers.checkpointing)
        return {"mode": "selective", "selective_ac_option": "op"}
    k, layers = parsed.blocks, num_layers(c)
    if layers is None or k >= layers:
        unmapped.append(
            f"activation_checkpointing {c.activation_checkpointing}: the model's number of "
            "layers L could not be read here; written as full checkpointing (more recompute "
            f"than planned): set selective_ac_option to N = L // {k} yourself (torchtitan then "
            "checkpoints every N-th layer: layers N-1, 2N-1, ... counted from 0); advisor "
            f"checkpoints {advisor_blocks(c)}"
        )
        return {"mode": "full"}
    every = layers // k  # at least K layers checkpointed (torchtitan's include the last)
    theirs = [n * every - 1 for n in range(1, layers // every + 1)]
    which = (
        f"all {layers} layers, as full checkpointing does"
        if every == 1
        else f"every {ordinal(every)} of its {layers} layers: {plural(len(theirs), 'layer')} "
        f"{index_list(theirs)} "
        "(counted from 0 in forward order)"
    )
    # every layer (N = 1): more recompute than planned, never more memory; else torchtitan's
    # set includes the last layer, whose recompute saves nothing at the peak
    consequence = (
        ": more recompute than planned, never more memory"
        if every == 1
        else ". torchtitan's layers include the last, whose recompute saves nothing at the peak"
        + (f", and number {len(theirs)}, not {k}" if len(theirs) != k else "")
        + ": torchtitan's peak can sit above advisor's prediction"
    )
    unmapped.append(
        f"activation_checkpointing {c.activation_checkpointing}: written as torchtitan's "
        f"selective_ac_option {every}, which checkpoints {which}; advisor checkpoints "
        f"{advisor_blocks(c)}{consequence}"
    )
    return {"mode": "selective", "selective_ac_option": str(every)}


def read_back(text: str, launch: str | None) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    data = tomllib.loads(text)
    training, parallel = data["training"], data.get("parallelism", {})
    replicate = int(parallel.get("data_parallel_replicate_degree", 1))
    shard = int(parallel.get("data_parallel_shard_degree", 1))
    param = training.get("mixed_precision_param", "bfloat16")
    return {
        "global_batch_size": training["global_batch_size"],
        "precision": "bf16" if param == "bfloat16" else "fp32",
        "activation_checkpointing": _checkpointing_back(data.get("activation_checkpoint", {})),
        "parallelism": "fsdp" if shard > 1 else "ddp" if replicate > 1 else "single",
        "world_size": replicate * max(shard, 1),
    }


def _checkpointing_back(section: dict[str, Any]) -> str:
    """advisor's name for a torchtitan setting: ops-half for option "op" (the same policy);
    "selective:N" for every N-th layer (which blocks:K it is depends on the model's depth)."""
    mode = section.get("mode", "selective")
    if mode != "selective":
        return str(mode)
    option = str(section.get("selective_ac_option", "2"))
    return "ops-half" if option == "op" else f"selective:{option}"
