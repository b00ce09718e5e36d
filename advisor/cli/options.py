"""Options shared by several commands; flag names mirror the TrainConfig keys.

Every TrainConfig flag defaults to None so a command can tell what the user set explicitly and
layer it over a plan, a resumed run, or the defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

PRECISIONS = ("fp32", "bf16", "fp16")
CHECKPOINTING = ("none", "full")
PARALLELISMS = ("single", "ddp", "fsdp")
POSITIVE = click.IntRange(min=1)
NON_NEGATIVE = click.IntRange(min=0)


def model_options(f: F) -> F:
    f = click.option(
        "--tokenizer",
        type=click.Path(),
        default=None,
        help="Local Hugging Face tokenizer directory for text data (extra 'hf').",
    )(f)
    f = click.option(
        "--data",
        default=None,
        help="stdlib (default: Python's own sources, byte-level), synthetic, a text file, a .bin "
        "of uint16 token ids, or a directory with train.bin/val.bin.",
    )(f)
    f = click.option(
        "--model-arg",
        "model_arg",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override a model config field (repeatable), e.g. --model-arg n_layer=2.",
    )(f)
    f = click.option(
        "--model",
        default=None,
        help="Preset (gpt-tiny, gpt-small, ... bert-tiny, llama-tiny ...), hf:NAME_OR_PATH, "
        "FILE.py:factory or package.module:factory. Default gpt-tiny.",
    )(f)
    return f


def config_options(f: F) -> F:
    """The remaining TrainConfig keys (model and data come from :func:`model_options`)."""
    specs: list[tuple[str, dict[str, Any]]] = [
        ("--num-workers", dict(type=NON_NEGATIVE, help="Data-loader worker processes.")),
        ("--seed", dict(type=int, help="Seed for weights and data order.")),
        ("--grad-clip", dict(type=click.FloatRange(min=0), help="Max grad norm; 0 disables.")),
        ("--weight-decay", dict(type=click.FloatRange(min=0), help="AdamW weight decay.")),
        ("--warmup-steps", dict(type=NON_NEGATIVE, help="Linear warm-up steps.")),
        ("--min-lr", dict(type=click.FloatRange(min=0), help="Floor of the cosine decay.")),
        ("--lr", dict(type=click.FloatRange(min=0, min_open=True), help="Peak learning rate.")),
        ("--world-size", dict(type=POSITIVE, help="Ranks (processes/devices) for ddp/fsdp.")),
        ("--parallelism", dict(type=click.Choice(PARALLELISMS), help="single, ddp or fsdp.")),
        (
            "--activation-checkpointing",
            dict(
                type=click.Choice(CHECKPOINTING),
                help="Recompute each block in backward: none|full.",
            ),
        ),
        ("--precision", dict(type=click.Choice(PRECISIONS), help="fp32, bf16 or fp16 (autocast).")),
        ("--grad-accum-steps", dict(type=POSITIVE, help="Micro-batches per optimizer step.")),
        ("--micro-batch-size", dict(type=POSITIVE, help="Sequences per forward/backward.")),
        (
            "--global-batch-size",
            dict(type=POSITIVE, help="Sequences per optimizer step = micro x accum x world size."),
        ),
        ("--seq-len", dict(type=POSITIVE, help="Tokens per sequence.")),
    ]
    for flag, kwargs in specs:
        f = click.option(flag, default=None, **kwargs)(f)
    return f


CONFIG_KEYS = (
    "seq_len",
    "global_batch_size",
    "micro_batch_size",
    "grad_accum_steps",
    "precision",
    "activation_checkpointing",
    "parallelism",
    "world_size",
    "lr",
    "min_lr",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "seed",
    "num_workers",
)


def explicit_config(params: Mapping[str, Any]) -> dict[str, Any]:
    """TrainConfig keys the user set on the command line (model args parsed)."""
    from advisor.models import parse_model_args

    out = {k: params[k] for k in CONFIG_KEYS if params.get(k) is not None}
    if params.get("model") is not None:
        out["model"] = params["model"]
    for key in ("data", "tokenizer"):
        if params.get(key) is not None:
            out[key] = params[key]
    if params.get("model_arg"):
        out["model_args"] = parse_model_args(params["model_arg"])
    return out


def budget_option(f: F) -> F:
    """--memory-budget (recommend, predict, run)."""
    return click.option(
        "--memory-budget",
        type=click.FloatRange(min=0, max=1, min_open=True),
        default=0.9,
        show_default=True,
        help="Fraction of device memory (CPU: of the RAM available when profiled) a plan may use.",
    )(f)


def validation_options(f: F) -> F:
    """--validate-top / --validate-rounds (recommend, run): what is measured for real, and how
    often (advisor.recommend.DEFAULT_VALIDATE_TOP_K, advisor.validation.TIE_MARGIN and
    DEFAULT_VALIDATE_ROUNDS, strategies.plan.LAYOUT_MARGIN)."""
    f = click.option(
        "--validate-rounds",
        type=POSITIVE,
        default=3,
        show_default=True,
        help="Measure configs within 15% of the fastest up to N times, at different moments, "
        "before the fastest wins (1: each finalist once).",
    )(f)
    return click.option(
        "--validate-top",
        type=NON_NEGATIVE,
        default=3,
        show_default=True,
        help="Measure the K best predicted configs with short real runs (and the baseline, and "
        "the best of a layout missing from them within 15% of the best prediction).",
    )(f)
