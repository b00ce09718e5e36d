"""The words and the file syntax every exporter shares: the header (which plan, predicted and
measured, what has no equivalent), the knobs that are ours in every stack, and small writers
for YAML and TOML (the export itself needs no third-party package; reading back does)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from advisor.exporters.source import Source, adam_hyperparameters, num_layers
from reports import fmt
from strategies.config import TrainConfig

STACK_NAMES = {
    "hf": "the Hugging Face Trainer (TrainingArguments)",
    "accelerate": "Accelerate (accelerate launch --config_file)",
    "lightning": "Lightning (Trainer / LightningCLI)",
    "deepspeed": "DeepSpeed (ds_config.json)",
    "torchtitan": "torchtitan (job config TOML)",
}


def layout(source: Source) -> str:
    c = source.config
    where = f" on {source.nodes} nodes" if source.nodes > 1 else ""
    return f"{c.parallelism}×{c.world_size}{where}" if c.world_size > 1 else c.parallelism


def header_lines(
    source: Source, fmt_name: str, unmapped: Sequence[str], launch: str | None
) -> list[str]:
    """The header: which plan, its config, predicted and measured, then every knob that has
    no equivalent in the stack, one line each."""
    plan, c = source.plan, source.config
    p = plan.predicted
    lines = [
        f"advisor export --to {fmt_name}: {STACK_NAMES[fmt_name]}",
        f"plan: {source.origin}" + (f" ({plan.label})" if plan.label else ""),
        *(f"note: {note}" for note in source.notes),
        f"config: global batch {c.global_batch_size} = micro-batch {c.micro_batch_size} × "
        f"{c.grad_accum_steps} accumulation × {c.world_size} rank(s); {c.precision}; "
        f"activation checkpointing {c.activation_checkpointing}; {layout(source)}; "
        f"seq_len {c.seq_len}",
        f"planned for: {plan.machine.get('name') or source.device_kind}",
        ("predicted (ESTIMATE): " if p.estimate or plan.estimate else "predicted: ")
        + f"step {fmt.seconds(p.step_time_s)}, {fmt.rate(p.tokens_per_s)}, "
        f"peak memory {fmt.size(p.peak_memory_bytes)} per rank (process overheads included)",
    ]
    m = plan.measured
    if m is not None and m.ok:
        # The measured peak is the allocator's (on CPU without the process overhead): set it
        # beside the prediction's traced peak, the same basis (Validation.memory_error's pair).
        traced = p.traced_bytes
        basis = [m.memory_kind] if m.memory_kind else []
        basis += [f"predicted on this basis {fmt.size(traced)}"] if traced else []
        lines.append(
            f"measured: step {fmt.seconds(m.step_time_s)}, {fmt.rate(m.tokens_per_s)}, "
            f"peak memory {fmt.size(m.peak_memory_bytes)}"
            + (f" ({'; '.join(basis)})" if basis else "")
            + (f" ({m.device}, {m.visits} visit(s))" if m.device else "")
        )
    else:
        reason = f" ({m.status}: {m.reason})" if m is not None else ""
        lines.append(f"measured: not measured{reason}")
    t = source.trained
    if t is not None and t.num_steps:
        lines.append(
            f"trained (RUN/train): step {fmt.seconds(t.step_time_s)}, {fmt.rate(t.tokens_per_s)}"
            f" (medians of {t.num_steps} steps after warm-up)"
        )
    lines.append(f"lr schedule length: {source.steps} optimizer steps ({source.steps_source})")
    if launch:
        lines.append(f"launch: {launch}")
    if unmapped:
        lines.append(f"no equivalent in {fmt_name} (apply by hand; never dropped silently):")
        lines += [f"  - {line}" for line in unmapped]
    else:
        lines.append(f"every knob of the plan has an equivalent in {fmt_name}")
    return lines


def comment_block(lines: Sequence[str]) -> str:
    return "".join(f"# {line}\n" for line in lines)


def workload_unmapped(source: Source, *, seq_len_mapped: bool = False) -> list[str]:
    """The model, data and tokenizer specs and the initial weights are ours in every stack.

    Each line names the TrainConfig keys it is about (tests check every key is either mapped
    by the exporter or named in one of its lines)."""
    c = source.config
    args = json.dumps(dict(c.model_args), sort_keys=True)
    out = [
        f"model {c.model}, model_args {args}: an advisor model spec; build the same model in "
        "your script",
        f"data {c.data}, tokenizer {c.tokenizer or 'none (byte-level)'}"
        + ("" if seq_len_mapped else f", seq_len {c.seq_len}")
        + ": advisor's data loader; feed your own dataset"
        + ("" if seq_len_mapped else f" in sequences of {c.seq_len} tokens"),
    ]
    init_from = getattr(c, "init_from", None)  # initial weights; None: the model's own
    weights = _how_to_load(c.model, init_from)
    if init_from:
        out.append(f"init_from {init_from}: advisor's initial weights; {weights}")
    elif weights:  # hf:DIR with weights in it: training starts from them
        out.append(f"initial weights: those in {c.model[3:]}, which advisor loads; {weights}")
    chunks = getattr(c, "loss_chunks", 1)  # the chunked LM loss; 1: the plain one
    out.append(
        f"loss_chunks {chunks}: the plain LM loss over the whole logits, as this stack computes it"
        if chunks == 1
        else f"loss_chunks {chunks}: advisor's chunked LM loss (each chunk's logits recomputed "
        "in backward) has no setting here; compute the loss over that many chunks of the "
        "tokens in your script, or use a fused linear cross-entropy (e.g. liger-kernel's)"
    )
    return out


def compile_unmapped(compiled: bool, stack: str, how: str) -> list[str]:
    """The line of ``compile`` in a stack with no setting for it: eager is its default; with
    compile on, ``how`` says what to write in the script (advisor compiles each repeated block
    in place before wrapping, advisor.trainer.compile, and measured the speed-up so)."""
    if not compiled:
        return [f"compile false: eager, as {stack} runs by default"]
    return [
        f"compile true: {stack} has no setting for it; {how} (advisor compiles each repeated "
        "block with block.compile() before the data-parallel wrapper, as measured)"
    ]


def ordinal(n: int) -> str:
    """2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def plural(count: int, noun: str) -> str:
    return noun if count == 1 else f"{noun}s"


def index_list(indices: Sequence[int]) -> str:
    """``0, 2 and 4``; a long evenly spaced run as ``0, 2, 4, ..., 78 (every 2nd)``."""
    items = [str(i) for i in indices]
    steps = {b - a for a, b in itertools.pairwise(indices)}
    if len(items) > 8 and len(steps) == 1:
        step = steps.pop()
        return f"{', '.join(items[:3])}, ..., {items[-1]} (every {ordinal(step)})"
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def advisor_blocks(config: TrainConfig) -> str:
    """Which blocks advisor's ``blocks:K`` checkpoints in the plan's model, exactly: their
    indices when the model's depth is known here, else the rule (profilers.checkpointing)."""
    from profilers.checkpointing import checkpointed_blocks, parse_checkpointing

    k = parse_checkpointing(config.activation_checkpointing).blocks
    layers = num_layers(config)
    if layers is None or k >= layers:
        why = (
            "L could not be read here"
            if layers is None
            else f"L = {layers} here, no more than K: every block, as full checkpointing"
        )
        return (
            f"blocks floor(i·L/{k}) for i = 0..{k - 1} of the model's L repeated blocks ({why}), "
            "counted from 0 in forward order: never the last"
        )
    chosen = checkpointed_blocks(config.activation_checkpointing, layers)
    rule = f"floor(i·{layers}/{k}) for i = 0..{k - 1}: " if k > 1 else ""
    return (
        f"{plural(len(chosen), 'block')} {index_list(chosen)} of the model's {layers} repeated "
        f"blocks, counted from 0 in forward order ({rule}never the last)"
    )


def selective_checkpointing_unmapped(config: TrainConfig, stack: str) -> list[str]:
    """The unmapped line of a selective checkpointing setting in a stack that checkpoints every
    block or none (profilers.checkpointing names the settings); none for the others."""
    from profilers.checkpointing import parse_checkpointing

    setting = config.activation_checkpointing
    parsed = parse_checkpointing(setting)
    if parsed.kind == "ops":
        return [
            f"activation_checkpointing ops: {stack} has no per-op checkpointing policy; wrap "
            "each repeated block in torch.utils.checkpoint.checkpoint(use_reentrant=False, "
            "context_fn=partial(create_selective_checkpoint_contexts, policy)) whose policy "
            "MUST_SAVEs aten mm/addmm/bmm/baddbmm, _grouped_mm (a mixture of experts') and "
            "scaled_dot_product_* outputs and PREFER_RECOMPUTEs the rest"
        ]
    if parsed.kind == "ops-half":
        return [
            f"activation_checkpointing ops-half: {stack} has no per-op checkpointing policy; "
            "wrap each repeated block in torch.utils.checkpoint.checkpoint(use_reentrant="
            "False, context_fn=...) whose policy MUST_SAVEs scaled_dot_product_* outputs and "
            "the odd-numbered aten mm/addmm of the block's forward (counted from 1, afresh in "
            "each forward and recompute), and PREFER_RECOMPUTEs the rest (torchtitan's 'op')"
        ]
    if parsed.kind == "blocks":
        return [
            f"activation_checkpointing {setting}: {stack} checkpoints every block or none; in "
            "your model wrap in torch.utils.checkpoint.checkpoint(use_reentrant=False) exactly "
            f"{advisor_blocks(config)}"
        ]
    return []


def schedule_code(source: Source) -> str:
    """Our optimizer and schedule as the torch code a user pastes where a stack has neither."""
    c = source.config
    beta1, beta2, eps = adam_hyperparameters()
    return (
        f"torch.optim.AdamW(lr={c.lr:g}, betas=({beta1:g}, {beta2:g}), eps={eps:g}, "
        f"weight_decay={c.weight_decay:g} on >=2-D params, 0 on norms and biases) with linear "
        f"warm-up over {c.warmup_steps} steps then cosine decay to min_lr {c.min_lr:g} at step "
        f"{source.steps}"
    )


# -- YAML and TOML writers ---------------------------------------------------------------------


def _scalar(value: Any) -> str:
    """A scalar both YAML and TOML read back as the same value (JSON's spelling)."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return json.dumps(value)


def yaml_text(data: Mapping[str, Any], indent: int = 0) -> str:
    """Block-style YAML of nested mappings; lists and scalars in JSON's (flow) spelling, which
    YAML 1.2 reads as the same values. Floats never use inf here (YAML spells it .inf)."""
    out = []
    pad = "  " * indent
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            out.append(f"{pad}{key}:\n{yaml_text(value, indent + 1)}")
        else:
            out.append(f"{pad}{key}: {json.dumps(value)}\n")
    return "".join(out)


def toml_text(data: Mapping[str, Any]) -> str:
    """TOML of a mapping of tables (nested tables as ``[a.b]``), scalars and lists of scalars."""
    out: list[str] = []

    def table(name: str, values: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in values.items() if not isinstance(v, Mapping)}
        if scalars:
            out.append(f"[{name}]\n")
            for key, value in scalars.items():
                if isinstance(value, (list, tuple)):
                    out.append(f"{key} = [{', '.join(_scalar(v) for v in value)}]\n")
                else:
                    out.append(f"{key} = {_scalar(value)}\n")
            out.append("\n")
        for key, value in values.items():
            if isinstance(value, Mapping):
                table(f"{name}.{key}", value)

    for name, values in data.items():
        table(name, values)
    return "".join(out).rstrip("\n") + "\n"


def _how_to_load(model: str, init_from: str | None) -> str:
    """How to load the run's initial weights into your own model: the file that holds them
    and how to read it (a training directory's are its latest checkpoint's ``state.pt``, under
    ``"model"``). Empty for a model that starts from its own initialisation."""
    from advisor.errors import UsageProblem
    from advisor.trainer.checkpoint import MODEL_STATE, initial_weights

    try:
        source = initial_weights(model, init_from)
    except UsageProblem:  # not on this machine (a plan exported elsewhere): say it generally
        source = None
    if source is None:
        if not init_from:
            return ""
        return "load them into your model before training (load_state_dict)"
    files = ", ".join(str(f) for f in source.files) or str(source.path)
    if source.kind == "safetensors":
        how = f"safetensors.torch.load_file({files})"
    elif source.kind == "dcp":
        how = (
            "torch.distributed.checkpoint.load({'model': model.state_dict()}, "
            f"checkpoint_id={source.path!r})"
        )
    else:
        how = f"torch.load({files}, weights_only=True)"
        if source.path.name == MODEL_STATE:  # a checkpoint of advisor train: model + optimizer
            how += '["model"]'
    return f"load them into your model before training: {how}, then load_state_dict"
