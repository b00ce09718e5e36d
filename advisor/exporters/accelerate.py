"""``--to accelerate``: an Accelerate config file (YAML) for ``accelerate launch --config_file``.

The file holds the launch-time choices (processes and machines, mixed precision, the
distributed type, the FSDP plugin). The batch, the accumulation, the optimizer and schedule,
clipping and the seed are arguments in the user's own script (DataLoader, Accelerator,
``accelerator.clip_grad_norm_``): each is a header line with the exact value to use.
"""

from __future__ import annotations

from typing import Any

from advisor.exporters.record import Export
from advisor.exporters.source import (
    MASTER_ENDPOINT,
    NODE_RANK,
    TRAIN_SCRIPT,
    Source,
    multinode_line,
    stack_blocks,
)
from advisor.exporters.text import (
    comment_block,
    header_lines,
    schedule_code,
    selective_checkpointing_unmapped,
    workload_unmapped,
    yaml_text,
)

FILENAME = "accelerate_config.yaml"
MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
PRECISIONS = {v: k for k, v in MIXED_PRECISION.items()}
# The TrainConfig keys this file sets natively; every other key is named by an unmapped line.
MAPPED = frozenset(
    {
        "precision",
        "parallelism",
        "world_size",
        "activation_checkpointing",
        "fsdp_reshard_after_forward",  # FSDP only: fsdp_reshard_after_forward
        "compile",  # dynamo_config (regional: the repeated blocks, as advisor compiles them)
    }
)


# CPU ranks: `accelerate launch` starts MULTI_CPU with its one-process launcher unless under
# mpirun, so a CPU plan of several ranks takes the multi-process (torchrun) launcher that
# MULTI_GPU and FSDP select, with use_cpu false (true forces the one-process launcher) and
# ACCELERATE_USE_CPU=true in the environment, which makes each process a CPU rank on gloo
# (Accelerate's MULTI_CPU). Checked with accelerate 1.16: 2 processes, num_processes 2.
CPU_RANKS_ENV = "ACCELERATE_USE_CPU=true"


def _distributed_type(source: Source) -> str:
    c = source.config
    if c.parallelism == "fsdp":
        return "FSDP"
    return "MULTI_GPU" if c.world_size > 1 else "NO"


def _cpu_ranks(source: Source) -> bool:
    """Several ranks on CPU: the launch line sets ACCELERATE_USE_CPU (see CPU_RANKS_ENV)."""
    return not source.on_gpu and source.config.world_size > 1


def build(source: Source) -> Export:
    c = source.config
    settings: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": _distributed_type(source),
        "mixed_precision": MIXED_PRECISION[c.precision],
        "num_processes": c.world_size,  # every process over every machine
        "num_machines": source.nodes,
        "machine_rank": 0,
        "use_cpu": not source.on_gpu and not _cpu_ranks(source),
        "debug": False,
    }
    unmapped = workload_unmapped(source)
    if source.nodes > 1:
        host, port = MASTER_ENDPOINT.split(":")
        settings.update(main_process_ip=host, main_process_port=int(port), rdzv_backend="static")
        unmapped += multinode_line(
            source,
            f"run the launch line on each machine with NODE_RANK set to its index (0 on "
            f"machine 0; --machine_rank overrides the file's machine_rank 0) and main_process_ip "
            f"{host} replaced by machine 0's address (Accelerate's static rendezvous at port "
            f"{port} there)",
        )
    if c.compile:
        # Regional compilation compiles the model's repeated blocks, not the whole model.
        settings["dynamo_config"] = {
            "dynamo_backend": "INDUCTOR",
            "dynamo_use_regional_compilation": True,
        }
    full = c.activation_checkpointing == "full"
    unmapped += selective_checkpointing_unmapped(c, "Accelerate")
    if c.parallelism == "fsdp":
        fsdp: dict[str, Any] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": c.fsdp_reshard_after_forward,
            "fsdp_activation_checkpointing": full,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_offload_params": False,
            "fsdp_cpu_ram_efficient_loading": False,
        }
        blocks = stack_blocks(c)
        if blocks.classes:
            fsdp["fsdp_transformer_layer_cls_to_wrap"] = ",".join(blocks.names)
            if blocks.note:
                unmapped.append(
                    f"parallelism fsdp: {blocks.note} in fsdp_transformer_layer_cls_to_wrap "
                    "(Accelerate raises 'Could not find the transformer layer class' until then)"
                )
        else:
            unmapped.append(
                f"parallelism fsdp: the repeated block to wrap is unknown ({blocks.unknown})"
            )
        settings["fsdp_config"] = fsdp
        if c.precision != "fp32":
            unmapped.append(
                f"precision {c.precision} under FSDP: Accelerate's FSDP plugin reduces gradients "
                f"in {c.precision}, advisor in fp32, and its config file has no key for it: pass "
                "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2, "
                "mixed_precision_policy=MixedPrecisionPolicy(param_dtype="
                f"torch.{_TORCH_DTYPE[c.precision]}, reduce_dtype=torch.float32))) for advisor's"
            )
        if not source.on_gpu:
            unmapped.append(
                "parallelism fsdp on CPU: Accelerate applies its FSDP plugin on GPUs only; on "
                "CPU its ranks run as DDP (MULTI_CPU), every rank holding the whole model: "
                "shard it yourself with torch.distributed.fsdp.fully_shard on each repeated "
                "block and then the model"
            )
    elif full:
        unmapped.append(
            "activation_checkpointing full: Accelerate's config checkpoints only under FSDP; "
            "wrap each repeated block in torch.utils.checkpoint.checkpoint(use_reentrant=False) "
            "in your model"
        )
    unmapped += [
        f"micro_batch_size {c.micro_batch_size}: DataLoader(batch_size={c.micro_batch_size}) "
        f"per process, so that global_batch_size {c.global_batch_size} = {c.micro_batch_size} × "
        f"{c.grad_accum_steps} × {c.world_size}",
        f"grad_accum_steps {c.grad_accum_steps}: "
        f"Accelerator(gradient_accumulation_steps={c.grad_accum_steps}) and "
        "accelerator.accumulate(model) around each micro-batch",
        f"lr {c.lr:g}, min_lr {c.min_lr:g}, warmup_steps {c.warmup_steps}, weight_decay "
        f"{c.weight_decay:g}: in your script, {schedule_code(source)}",
        f"grad_clip {c.grad_clip:g}: "
        + (
            f"accelerator.clip_grad_norm_(model.parameters(), {c.grad_clip:g}) before each "
            "optimizer step"
            if c.grad_clip > 0
            else "no clipping (nothing to call)"
        ),
        f"seed {c.seed}: accelerate.utils.set_seed({c.seed})",
        f"num_workers {c.num_workers}: DataLoader(num_workers={c.num_workers})",
    ]
    rank = f" --machine_rank {NODE_RANK}" if source.nodes > 1 else ""
    launch = f"accelerate launch --config_file {FILENAME}{rank} {TRAIN_SCRIPT}"
    if _cpu_ranks(source):
        launch = f"{CPU_RANKS_ENV} {launch}"
        unmapped.append(
            f"world_size {c.world_size} on CPU: Accelerate's MULTI_CPU starts one process "
            "unless under mpirun, so the file asks for its multi-process launcher "
            f"(distributed_type {settings['distributed_type']}, use_cpu false) and the launch "
            f"line sets {CPU_RANKS_ENV}, which makes each of the {c.world_size} processes a CPU "
            "rank on gloo; keep it in the environment"
        )
    header = header_lines(source, "accelerate", unmapped, launch)
    return Export(
        format="accelerate",
        settings=settings,
        text=comment_block(header) + yaml_text(settings),
        filename=FILENAME,
        unmapped=tuple(unmapped),
        launch=launch,
    )


def read_back(text: str, launch: str | None) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(text)
    kind = data["distributed_type"]
    fsdp = data.get("fsdp_config") or {}
    return {
        # The config holds neither the per-process batch nor the accumulation.
        "global_batch_size": None,
        "precision": PRECISIONS[data.get("mixed_precision", "no")],
        "activation_checkpointing": "full" if fsdp.get("fsdp_activation_checkpointing") else "none",
        "parallelism": {"FSDP": "fsdp", "NO": "single"}.get(kind, "ddp"),
        "world_size": int(data.get("num_processes", 1)),
    }
