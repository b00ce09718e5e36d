"""``--to deepspeed``: a DeepSpeed JSON config (``ds_config.json``).

``train_batch_size`` is the global batch; DeepSpeed itself checks it equals micro-batch ×
accumulation × data-parallel ranks. The layout maps to a ZeRO stage: DDP replicates everything
(stage 0); our FSDP shards parameters, gradients and optimizer state and reshards after forward,
which is ZeRO stage 3 (with the blocks kept gathered, stage 2 is the nearest). JSON holds no
comments, but DeepSpeed's parser ignores unknown top-level keys (checked by the tests against
``deepspeed.runtime.config.DeepSpeedConfig``), so the header is the ``"_advisor"`` key.
"""

from __future__ import annotations

import json
from typing import Any

from advisor.exporters.record import Export
from advisor.exporters.source import (
    MASTER_ENDPOINT,
    NODE_RANK,
    TRAIN_SCRIPT,
    Source,
    adam_hyperparameters,
    multinode_line,
)
from advisor.exporters.text import (
    compile_unmapped,
    header_lines,
    selective_checkpointing_unmapped,
    workload_unmapped,
)

FILENAME = "ds_config.json"
HEADER_KEY = "_advisor"
ZERO_STAGE = {"single": 0, "ddp": 0, "fsdp": 3}


def _zero_stage(c: Any, unmapped: list[str]) -> int:
    """ZeRO stage 3 for FSDP; 2 with the blocks kept gathered (fsdp_reshard_after_forward
    False), the nearest: no parameter all-gather in backward, but unlike FSDP stage 2 keeps
    every parameter whole on each rank between steps too, so it holds more than predicted."""
    if c.parallelism != "fsdp" or c.fsdp_reshard_after_forward:
        return ZERO_STAGE[c.parallelism]
    unmapped.append(
        "fsdp_reshard_after_forward false: ZeRO stage 2, the nearest (no parameter all-gather "
        "in backward); it keeps every parameter whole on each rank between steps as well, so "
        "a rank holds more than advisor predicted for FSDP with the blocks kept gathered"
    )
    return 2


# The TrainConfig keys this file sets natively; every other key is named by an unmapped line.
MAPPED = frozenset(
    {
        "fsdp_reshard_after_forward",  # FSDP only: ZeRO stage 3, or 2 when kept gathered
        "global_batch_size",
        "micro_batch_size",
        "grad_accum_steps",
        "world_size",  # train_batch_size / (micro × accumulation), checked by DeepSpeed
        "precision",
        "activation_checkpointing",
        "parallelism",
        "lr",
        "min_lr",
        "warmup_steps",
        "weight_decay",
        "grad_clip",
    }
)
# advisor's bf16/fp16 is torch.autocast over fp32 weights, gradients reduced in fp32, fp16 with
# torch.amp.GradScaler's defaults. DeepSpeed's "bf16"/"fp16" sections instead cast every
# parameter to 16 bits (engine._configure_distributed_model); its "torch_autocast" section
# (DeepSpeed >= 0.16.5; read back by 0.19.8) is advisor's mode: the engine runs forward under
# torch.autocast and, for fp16, creates a torch.amp.GradScaler with its defaults (ZeRO stage 0
# in the engine, stages 1-3 in their optimizers). "lower_precision_safe_modules" lists the
# modules whose parameters DeepSpeed communicates in the 16-bit dtype (default: nn.Linear and
# nn.Conv*): empty, every gradient is reduced in fp32, as advisor reduces them.
AUTOCAST_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


def build(source: Source) -> Export:
    c = source.config
    beta1, beta2, eps = adam_hyperparameters()
    kept: list[str] = []  # the ZeRO stage's line, when it is only the nearest
    config: dict[str, Any] = {
        "train_batch_size": c.global_batch_size,
        "train_micro_batch_size_per_gpu": c.micro_batch_size,
        "gradient_accumulation_steps": c.grad_accum_steps,
        "gradient_clipping": c.grad_clip,  # 0 disables clipping in both
        "zero_optimization": {"stage": _zero_stage(c, kept)},
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": c.lr,
                "betas": [beta1, beta2],
                "eps": eps,
                "weight_decay": c.weight_decay,
            },
        },
        "scheduler": {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": source.steps,
                # WarmupCosineLR refuses 0 and warms up over at least 2 steps.
                "warmup_num_steps": max(2, c.warmup_steps),
                "warmup_type": "linear",
                # Its first step() gives warmup_min_ratio: advisor's lr at step 0 (1/W), so
                # that after DeepSpeed's step at lr 0 the warm-up runs one step behind, not two.
                "warmup_min_ratio": 1.0 / max(1, c.warmup_steps),
                "cos_min_ratio": c.min_lr / c.lr,
            },
        },
    }
    unmapped = workload_unmapped(source) + kept
    if c.precision in AUTOCAST_DTYPE:
        config["torch_autocast"] = {
            "enabled": True,
            "dtype": AUTOCAST_DTYPE[c.precision],
            "lower_precision_safe_modules": [],
        }
        if c.parallelism == "fsdp":
            unmapped.append(
                f"precision {c.precision} under ZeRO-{config['zero_optimization']['stage']}: "
                "torch_autocast keeps the weights in fp32 and reduces gradients in fp32, as "
                "advisor does, so DeepSpeed also all-gathers the fp32 weights (advisor's FSDP "
                f"gathers them in {c.precision}: half the bytes); listing "
                "'torch.nn.modules.linear.Linear' in lower_precision_safe_modules gathers "
                f"and reduces the Linear weights in {c.precision} instead"
            )
    unmapped += compile_unmapped(
        c.compile,
        "DeepSpeed's config",
        "call block.compile() on each repeated block before deepspeed.initialize",
    )
    unmapped += selective_checkpointing_unmapped(c, "DeepSpeed")
    if c.activation_checkpointing == "full":
        # DeepSpeed's section configures deepspeed.checkpointing; the model must call it.
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
        unmapped.append(
            "activation_checkpointing full: the config only sets up deepspeed.checkpointing; "
            "call deepspeed.checkpointing.checkpoint (or torch.utils.checkpoint, non-reentrant) "
            "around each repeated block in your model"
        )
    unmapped += [
        f"weight_decay {c.weight_decay:g}: DeepSpeed's AdamW decays every parameter it is "
        "given; pass param groups with weight_decay 0 for biases and norms to match advisor",
        f"seed {c.seed}: deepspeed.runtime.utils.set_random_seed({c.seed}) in your script",
        f"num_workers {c.num_workers}: DataLoader(num_workers={c.num_workers}) (DeepSpeed's "
        "config has no loader workers)",
    ]
    unmapped.append(_warmup_line(c.warmup_steps))
    launch = _launch(source)
    host = MASTER_ENDPOINT.split(":")[0]
    unmapped += multinode_line(
        source,
        f"write the file hostfile with one line per node, 'HOSTNAME slots={source.procs_per_node}'"
        f" (node 0 first), and run the launch line once, on node 0: DeepSpeed's launcher starts "
        "every node over passwordless ssh (pdsh); without ssh run "
        f"'{_launch(source, no_ssh=True)}' on each node, NODE_RANK set to its index and {host} "
        "replaced by node 0's address",
    )
    header = header_lines(source, "deepspeed", unmapped, launch)
    # ASCII (× as \u00d7): DeepSpeed opens the file in the locale's encoding.
    text = json.dumps({HEADER_KEY: header, **config}, indent=2) + "\n"
    return Export(
        format="deepspeed",
        settings=config,
        text=text,
        filename=FILENAME,
        unmapped=tuple(unmapped),
        launch=launch,
    )


def _warmup_line(warmup: int) -> str:
    """How DeepSpeed's WarmupCosineLR, as written, differs from advisor's WarmupCosine: it sets
    lr 0 before its first step() (the first optimizer step) and takes warmup_num_steps >= 2."""
    if warmup < 2:
        return (
            f"warmup_steps {warmup}: WarmupCosineLR warms up over at least 2 steps (written as "
            "2, starting at the full lr) and trains the first optimizer step at lr 0; its "
            "cosine then runs a step or two behind advisor's"
        )
    # Step s >= 1 trains at DeepSpeed's ratio for iteration s - 1: 1/W + (1 - 1/W)(s - 1)/W.
    last = 1 / warmup + (1 - 1 / warmup) * (warmup - 1) / warmup
    return (
        f"warmup_steps {warmup}: WarmupCosineLR trains the first optimizer step at lr 0 "
        f"(advisor: lr/{warmup}; DeepSpeed sets lr 0 before its first step()), then warms up "
        f"linearly from lr/{warmup} at step 1 to {last:.3g} of lr at step {warmup}, about a "
        f"step behind advisor's lr*(s+1)/{warmup}; from step {warmup + 1} on the two "
        "schedules are equal. For advisor's exact schedule pass "
        "lr_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / "
        f"{warmup} if s < {warmup} else the cosine) to deepspeed.initialize and drop "
        "'scheduler'"
    )


def _launch(source: Source, *, no_ssh: bool = False) -> str:
    """DeepSpeed's launcher line (deepspeed.launcher.runner's flags): on several nodes from
    node 0 over ssh, or with ``no_ssh`` the line each node runs itself (its rank and node 0's
    address given, as the ssh-less launch requires)."""
    tail = f"{TRAIN_SCRIPT} --deepspeed --deepspeed_config {FILENAME}"
    if source.nodes > 1:
        host, port = MASTER_ENDPOINT.split(":")
        ssh_less = (
            f"--no_ssh --node_rank {NODE_RANK} --master_addr {host} --master_port {port} "
            if no_ssh
            else ""
        )
        return (
            f"deepspeed --hostfile hostfile {ssh_less}--num_nodes {source.nodes} "
            f"--num_gpus {source.procs_per_node} {tail}"
        )
    return f"deepspeed --num_gpus {source.procs_per_node} {tail}"


def read_back(text: str, launch: str | None) -> dict[str, Any]:
    config = json.loads(text)
    micro = config["train_micro_batch_size_per_gpu"]
    accum = config.get("gradient_accumulation_steps", 1)
    total = config["train_batch_size"]
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    world = total // (micro * accum)
    autocast = config.get("torch_autocast") or {}
    precision = (
        "bf16"
        if (config.get("bf16") or {}).get("enabled")
        else "fp16"
        if (config.get("fp16") or {}).get("enabled")
        else {v: k for k, v in AUTOCAST_DTYPE.items()}.get(str(autocast.get("dtype")), "bf16")
        if autocast.get("enabled")
        else "fp32"
    )
    return {
        "global_batch_size": total,
        "precision": precision,
        "activation_checkpointing": "full" if "activation_checkpointing" in config else "none",
        "parallelism": "fsdp" if stage >= 2 else "ddp" if world > 1 else "single",
        "world_size": world,
    }
