"""The hand-written training loops ``trainer_overhead.py`` measures ``advisor train`` against.

One nanoGPT-style loop for the three layouts: a single process, DDP and FSDP2
(``torch.distributed.fsdp.fully_shard``), the latter two one process per rank under torchrun
(gloo). Deliberately none of advisor's step, trainer, loader, optimizer or schedule code: it
is the baseline they are measured against. Shared with advisor: the model builder (same seed,
so identical weights), the data source, ``mix`` (the hash that places sample g's window) and
``WindowDataset`` to check the first micro-batch of every rank and for the final eval.

The same work as advisor's step, written the way a person would: autocast for bf16/fp16,
loss / accum, backward (DDP: gradient all-reduce only on the last micro-batch, nanoGPT's
``require_backward_grad_sync``), clip, AdamW with the same groups and hyper-parameters,
``zero_grad(set_to_none=True)``, warm-up+cosine LR, and one host sync per step for the loss
(distributed: the all-reduced mean over the ranks, as advisor logs it). The wrappers get the
arguments advisor gives them (DDP: ``gradient_as_bucket_view=True``; FSDP2: each block, then
the root without resharding after forward, the same mixed-precision policy), so the comparison
is of the training loops, not of wrapper settings.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

from strategies.config import load_plan_config

# The final eval of advisor train: this many global batches of the validation split.
EVAL_BATCHES = 4


def hand_file(out: Path, rank: int) -> Path:
    """Where rank ``rank`` of a hand-written run leaves its step times, CPU times and losses."""
    return out / f"hand-rank{rank}.json"


def run_hand(config_path: Path, steps: int, out: Path) -> None:
    """Train ``steps`` optimizer steps of the TrainConfig at ``config_path``; every rank writes
    ``hand_file(out, rank)``: wall time (rank 0's clock) and process CPU time at the end of every
    step, and every step's loss (the mean over the ranks)."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    from advisor.data import WindowDataset, resolve_data
    from advisor.data.loader import _STREAM_WINDOW, mix
    from advisor.models import build_model

    cfg = load_plan_config(config_path)
    seq_len, mb, accum = cfg.seq_len, cfg.micro_batch_size, cfg.grad_accum_steps
    layout, world = cfg.parallelism, cfg.world_size
    global_batch = mb * accum * world

    rank = 0
    if layout != "single":
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        if dist.get_world_size() != world:
            raise RuntimeError(f"torchrun started {dist.get_world_size()} ranks, plan: {world}")

    torch.manual_seed(cfg.seed)
    adapter = build_model(cfg.model, cfg.model_args)
    model: nn.Module = adapter.module
    vocab = adapter.vocab_size

    class Checkpointed(nn.Module):
        def __init__(self, block: nn.Module) -> None:
            super().__init__()
            self.block = block

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = checkpoint(self.block, x, use_reentrant=False)
            return out

    blocks = adapter.blocks()
    if cfg.activation_checkpointing == "full":
        for i, block in enumerate(blocks):
            blocks[i] = Checkpointed(block)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    ddp = None
    if layout == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = ddp = DDP(model, gradient_as_bucket_view=True)
    elif layout == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cpu", (world,))
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    model.train()

    # Data: the run's sample g is the window at hash(seed, g) -- the positions advisor's
    # WindowDataset draws; computed up front like nanoGPT's torch.randint, read per step below.
    # Rank r's micro-batch m of a step holds that step's samples (r * accum + m) * mb onwards.
    source = resolve_data(
        cfg.data, tokenizer=cfg.tokenizer, model_vocab=vocab, min_tokens=seq_len + 1
    )
    data = source.tokens("train")
    span = len(data) - seq_len
    starts = [mix(cfg.seed, g, _STREAM_WINDOW) % span for g in range(steps * global_batch)]

    def first_sample(step: int, micro: int) -> int:
        return step * global_batch + (rank * accum + micro) * mb

    def get_batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = first_sample(step, micro)
        ix = starts[first : first + mb]
        x = torch.from_numpy(np.stack([data[i : i + seq_len] for i in ix]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[i + 1 : i + 1 + seq_len] for i in ix]).astype(np.int64))
        return x, y

    # Guard against silently different data: this rank's first micro-batch must be advisor's.
    objective = adapter.make_objective(source.vocab_size)
    reference = WindowDataset(source, "train", seq_len, cfg.seed, objective)
    x0, y0 = get_batch(0, 0)
    for k in range(mb):
        item = reference[first_sample(0, 0) + k]
        if not (torch.equal(x0[k], item["input_ids"]) and torch.equal(y0[k], item["labels"])):
            raise RuntimeError(f"rank {rank}: sample {k} of the first micro-batch is not advisor's")

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    base_lr, min_lr, warmup = cfg.lr, cfg.min_lr, cfg.warmup_steps
    # Fused AdamW where it works; FSDP2's sharded (DTensor) parameters take the foreach one.
    optimizer = torch.optim.AdamW(
        groups, lr=base_lr, betas=(0.9, 0.95), eps=1e-8, fused=layout != "fsdp"
    )
    ctx: Any = contextlib.nullcontext() if dtype is None else torch.autocast("cpu", dtype=dtype)
    scaler: Any
    if layout == "fsdp" and cfg.precision == "fp16":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler("cpu")
    else:
        scaler = torch.amp.GradScaler("cpu", enabled=cfg.precision == "fp16")

    def get_lr(it: int) -> float:  # linear warm-up, then cosine to min_lr (nanoGPT)
        if it < warmup:
            lr = base_lr * (it + 1) / warmup
        else:
            progress = min(1.0, (it - warmup) / max(1, steps - warmup))
            lr = min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (base_lr - min_lr)
        return base_lr * (lr / base_lr)  # as LambdaLR forms it: base x factor, same bits

    def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
        if layout != "single":
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= world
        return value

    times: list[float] = []
    cpu: list[float] = []  # process CPU time at each step end (not part of the loop's work)
    losses: list[float] = []
    t0 = time.perf_counter()
    for it in range(steps):
        lr = get_lr(it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros(())
        for micro in range(accum):
            if ddp is not None:  # all-reduce gradients on the last micro-batch only
                ddp.require_backward_grad_sync = micro == accum - 1
            x, y = get_batch(it, micro)
            with ctx:
                logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1)) / accum
            scaler.scale(loss).backward()
            total += loss.detach()
        scaler.unscale_(optimizer)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(mean_over_ranks(total).item())  # the one host sync per step
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time())

    # What advisor does once after its last step (outside the measured window): an eval over
    # EVAL_BATCHES global batches of the validation split and a checkpoint of model + optimizer.
    val = WindowDataset(source, "val", seq_len, cfg.seed, objective)
    per_rank = EVAL_BATCHES * mb * accum
    model.eval()
    with torch.no_grad():
        total = torch.zeros(())
        for i in range(per_rank // mb):
            first = rank * per_rank + i * mb
            items = [val[j] for j in range(first, first + mb)]
            xv = torch.stack([item["input_ids"] for item in items])
            yv = torch.stack([item["labels"] for item in items])
            with ctx:
                logits = model(xv)
            total += F.cross_entropy(logits.float().view(-1, vocab), yv.view(-1))
        mean_over_ranks(total).item()
    out.mkdir(parents=True, exist_ok=True)
    if layout == "fsdp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(out / "ckpt"))
    elif rank == 0:
        state = {"model": adapter.module.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(state, out / "ckpt.pt")
    hand_file(out, rank).write_text(json.dumps({"times": times, "cpu": cpu, "losses": losses}))
    if layout != "single":
        dist.barrier()
        dist.destroy_process_group()
