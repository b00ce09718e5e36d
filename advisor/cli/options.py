"""The options of the ``advisor`` commands, each declared once; flag names mirror the
TrainConfig keys (strategies.config) and defaults come from their owners.

A command stacks the groups it takes (``@model_options``, ``@probe_options`` ...); an option
that reads differently in two commands (``--device``: where to probe, where to train) takes its
help text as an argument. TrainConfig flags default to None so a command can tell what the
user set explicitly and layer it over a plan, a resumed run, or the defaults. Nothing here
imports torch (``advisor --help`` stays instant).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from advisor.trainer.options import (
    DEFAULT_EVAL_BATCHES,
    DEFAULT_KEEP_CHECKPOINTS,
    RunOptions,
    run_steps,
)
from profilers.checkpointing import parse_checkpointing
from profilers.defaults import DEFAULT_MEMORY_BUDGET, DEFAULT_PROFILE_BUDGET_S
from profilers.workload import PARALLELISMS, PRECISIONS
from strategies.budgets import (
    DEFAULT_TRIALS,
    DEFAULT_VALIDATE_ROUNDS,
    DEFAULT_VALIDATE_TOP_K,
    LAYOUT_MARGIN,
    TIE_MARGIN,
)
from strategies.config import (
    CONFIG_FLAG_KEYS,
    DEFAULT_DATA,
    DEFAULT_GLOBAL_BATCH_SIZE,
    DEFAULT_MODEL,
    DEFAULT_SEQ_LEN,
    DEFAULT_STEPS,
    HYPERPARAMETER_KEYS,
)

F = TypeVar("F", bound=Callable[..., Any])
Decorator = Callable[[F], F]

POSITIVE = click.IntRange(min=1)
NON_NEGATIVE = click.IntRange(min=0)
DEVICES = ("auto", "cpu", "cuda")


class TokenCount(click.ParamType):
    """A positive whole number of tokens, also as written for large counts: ``100000``,
    ``100_000`` or ``1e5`` (``--tokens-per-trial 1e5`` was refused as not an integer)."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number: float = value
        else:
            text = str(value).strip().replace("_", "")
            try:
                number = int(text)
            except ValueError:
                try:
                    number = float(text)
                except ValueError:
                    self.fail(f"{value!r} is not a whole number of tokens (e.g. 100000 or 1e5)")
        if number != number or number in (float("inf"), float("-inf")) or number != int(number):
            self.fail(f"{value!r} is not a whole number of tokens (e.g. 100000 or 1e5)")
        if number < 1:
            self.fail(f"{value!r} is not at least 1")
        return int(number)


TOKENS = TokenCount()


class CheckpointingType(click.ParamType):
    """An activation-checkpointing setting (profilers.checkpointing): none, full, ops, ops-half
    or blocks:K. K against the model's depth is checked once the model is known."""

    name = "none|full|ops|ops-half|blocks:K"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return parse_checkpointing(str(value)).setting
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class FiniteFloatRange(click.FloatRange):
    """A click.FloatRange that also refuses nan and infinity: nan passes every comparison a
    range makes (``--budget-s nan`` then fails deep in the profiler), and an infinite bound
    is no bound (``--budget-s inf`` profiles forever)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(
                f"{number} is not a finite number: give one in the range {self._describe_range()}.",
                param,
                ctx,
            )
        return number


class BudgetSeconds(FiniteFloatRange):
    """--budget-s: a finite number of seconds no shorter than the least a profile runs
    (advisor.profiling.check_budget, imported only when the option is given: it is not
    light enough for ``advisor --help``)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        from advisor.errors import UsageProblem
        from advisor.profiling import check_budget

        try:
            check_budget(number)
        except UsageProblem as exc:
            self.fail(str(exc).removeprefix("--budget-s "), param, ctx)
        return number


def _stack(*decorators: Callable[[Any], Any]) -> Callable[[F], F]:
    """Options in the order given (click shows the decorator applied last first)."""

    def apply(f: F) -> F:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f

    return apply


# -- the model and its data ----------------------------------------------------------------------

model_options = _stack(
    click.option(
        "--model",
        default=None,
        help="Preset (gpt-tiny, gpt-small, ... bert-tiny, llama-tiny ...), hf:NAME_OR_PATH, "
        "FILE.py:factory or package.module:factory. Default gpt-tiny.",
    ),
    click.option(
        "--model-arg",
        "model_arg",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override a model config field (repeatable), e.g. --model-arg n_layer=2.",
    ),
    click.option(
        "--data",
        default=None,
        help="stdlib (default: Python's own sources, byte-level), synthetic, a text file, "
        'FILE.jsonl[:FIELD] (JSON lines, the "text" field), a .bin of uint16 token ids, a .npy '
        "of integer token ids (a .bin may be an llm.c shard: its header is read), or a "
        "directory with train.bin/val.bin or shards named *train*/*val* (llm.c's FineWeb "
        "shards).",
    ),
    click.option(
        "--tokenizer",
        type=click.Path(),
        default=None,
        help="Local Hugging Face tokenizer directory for text data (extra 'hf').",
    ),
)


def seq_len_option(default: int | None = None) -> Decorator[Any]:
    """--seq-len; None (train, predict): from the plan or the config's default."""
    return click.option(
        "--seq-len",
        type=POSITIVE,
        default=default,
        show_default=default is not None,
        help="Tokens per sequence.",
    )


SEARCHED_GLOBAL_BATCH = (
    "Sequences per optimizer step = micro-batch x accumulation x world size; the search holds "
    "it fixed."
)


def global_batch_option(
    *, required: bool = False, default: int | None = None, help: str = SEARCHED_GLOBAL_BATCH
) -> Decorator[Any]:
    # No ``default=None`` when required: click (8.3+) takes an explicit None as a default given.
    extra: dict[str, Any] = {"default": default, "show_default": True} if default else {}
    return click.option("--global-batch-size", type=POSITIVE, required=required, help=help, **extra)


# -- TrainConfig ----------------------------------------------------------------------------------

hyperparameter_options = _stack(
    click.option("--lr", type=FiniteFloatRange(min=0, min_open=True), help="Peak learning rate."),
    click.option("--min-lr", type=FiniteFloatRange(min=0), help="Floor of the cosine decay."),
    click.option("--warmup-steps", type=NON_NEGATIVE, help="Linear warm-up steps."),
    click.option("--weight-decay", type=FiniteFloatRange(min=0), help="AdamW weight decay."),
    click.option("--grad-clip", type=FiniteFloatRange(min=0), help="Max grad norm; 0 disables."),
    click.option("--seed", type=int, help="Seed for weights and data order."),
    click.option(
        "--init-from",
        type=click.Path(exists=True),
        default=None,
        help="Start training from these weights: a .safetensors/.pt/.bin state dict, a Hugging "
        "Face model directory, or a checkpoint of 'advisor train' (a step directory, or a "
        "training/run directory: its latest). hf:DIR models load DIR's weights by default.",
    ),
)

config_options = _stack(
    seq_len_option(),
    # (train, predict: no search holds it; the batch arithmetic of README's advisor train)
    global_batch_option(
        help="Sequences per optimizer step = micro-batch x accumulation x world size. Without "
        "it, that product; with it (and no --grad-accum-steps), the accumulation follows; a "
        "product that does not match is refused."
    ),
    click.option("--micro-batch-size", type=POSITIVE, help="Sequences per forward/backward."),
    click.option("--grad-accum-steps", type=POSITIVE, help="Micro-batches per optimizer step."),
    click.option(
        "--precision", type=click.Choice(PRECISIONS), help="fp32, bf16 or fp16 (autocast)."
    ),
    click.option(
        "--activation-checkpointing",
        type=CheckpointingType(),
        help="Recompute in backward: none | full (every block) | ops (every block's cheap "
        "ops; matmul and attention outputs are saved) | ops-half (as ops, but every second "
        "matmul of a block recomputed too: torchtitan's 'op') | blocks:K (K of the repeated "
        "blocks, spread evenly).",
    ),
    click.option(
        "--parallelism",
        type=click.Choice(PARALLELISMS),
        help="single (one process), ddp (a replica of the model per rank) or fsdp (parameters, "
        "gradients and optimizer state sharded over the ranks); advisor train runs ddp and fsdp's "
        "--world-size ranks through torchrun.",
    ),
    click.option("--world-size", type=POSITIVE, help="Ranks (processes/devices) for ddp/fsdp."),
    hyperparameter_options,
    click.option("--num-workers", type=NON_NEGATIVE, help="Data-loader worker processes."),
    click.option(
        "--loss-chunks",
        type=POSITIVE,
        help="Compute the LM loss over N chunks of each micro-batch's tokens, each chunk's "
        "logits recomputed in backward (less memory for a large vocabulary); 1: the plain loss.",
    ),
    click.option(
        "--fsdp-reshard-after-forward/--no-fsdp-reshard-after-forward",
        default=None,
        help="FSDP: free each block's gathered parameters after forward and all-gather them "
        "again in backward (default), or keep them until backward (one all-gather less per "
        "micro-batch, whole-model parameters held per rank).",
    ),
    click.option(
        "--compile/--no-compile",
        default=None,
        help="torch.compile each repeated block (inductor; on CPU it needs a C++ compiler). "
        "The first steps pay the compilation.",
    ),
)


def explicit_config(params: Mapping[str, Any]) -> dict[str, Any]:
    """TrainConfig keys the user set on the command line (model args parsed)."""
    from advisor.models import parse_model_args

    out = {k: params[k] for k in CONFIG_FLAG_KEYS if params.get(k) is not None}
    if params.get("model") is not None:
        out["model"] = params["model"]
    for key in ("data", "tokenizer"):
        if params.get(key) is not None:
            out[key] = params[key]
    if params.get("model_arg"):
        out["model_args"] = parse_model_args(params["model_arg"])
    return out


def pick(params: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The named parameters as they were parsed (option names are the library's field names)."""
    return {name: params[name] for name in names}


def workload(params: Mapping[str, Any]) -> dict[str, Any]:
    """model, model_args, data, tokenizer, seq_len from :data:`model_options` and --seq-len,
    defaults filled in (profile, run)."""
    from advisor.models import parse_model_args

    return {
        "model": params["model"] or DEFAULT_MODEL,
        "model_args": parse_model_args(params["model_arg"]),
        "data": params["data"] or DEFAULT_DATA,
        "tokenizer": params["tokenizer"],
        "seq_len": params["seq_len"],
    }


def probing(params: Mapping[str, Any]) -> dict[str, Any]:
    """device, budget_s, precisions, comm from --device and :data:`probe_options`."""
    return {
        "device": params["device"],
        "budget_s": params["budget_s"],
        "precisions": tuple(params["precisions"]) or None,
        "checkpointing": tuple(params["checkpointing"]) or None,
        "comm": not params["no_comm"],
    }


def hyperparameters(params: Mapping[str, Any]) -> dict[str, Any]:
    """The hyper-parameter flags the user set (a run passes them into its plan unchanged)."""
    return {k: params[k] for k in HYPERPARAMETER_KEYS if params.get(k) is not None}


# -- where and how --------------------------------------------------------------------------------


def device_option(help: str) -> Decorator[Any]:
    return click.option(
        "--device", type=click.Choice(DEVICES), default="auto", show_default=True, help=help
    )


def out_option(help: str) -> Decorator[Any]:
    return click.option("--out", type=click.Path(path_type=Path), default=None, help=help)


def resume_option(help: str) -> Decorator[Any]:
    return click.option("--resume", is_flag=True, help=help)


def quiet_option(help: str = "No progress display.") -> Decorator[Any]:
    return click.option("--quiet", is_flag=True, help=help)


profile_path_option = click.option(
    "--profile",
    "profile_path",
    required=True,
    type=click.Path(path_type=Path),
    help="profile.json from 'advisor profile' (or its directory).",
)


# -- profile --------------------------------------------------------------------------------------

probe_options = _stack(
    click.option(
        "--budget-s",
        type=BudgetSeconds(min=0, min_open=True),
        default=DEFAULT_PROFILE_BUDGET_S,
        show_default=True,
        help="Time budget of all the profile's probes, in seconds.",
    ),
    click.option(
        "--precision",
        "precisions",
        type=click.Choice(PRECISIONS),
        multiple=True,
        help="Profile and consider only these precisions (repeatable; default: all the device "
        "runs).",
    ),
    click.option(
        "--checkpointing",
        "checkpointing",
        type=CheckpointingType(),
        multiple=True,
        help="Measure these activation-checkpointing settings (repeatable; default: none, full, "
        "ops and blocks:L/2; none is always measured). Add ops-half to price torchtitan's "
        "'op' policy.",
    ),
    click.option("--no-comm", is_flag=True, help="Skip the communication probe."),
)


# -- recommend ------------------------------------------------------------------------------------

memory_budget_option = click.option(
    "--memory-budget",
    type=FiniteFloatRange(min=0, max=1, min_open=True),
    default=DEFAULT_MEMORY_BUDGET,
    show_default=True,
    help="Fraction of device memory (CPU: of the RAM available when profiled) a plan may use.",
)


def _only(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, Any]:
    from strategies.errors import StrategyError
    from strategies.restrict import parse_only

    try:
        return parse_only(value)
    except StrategyError as exc:
        raise click.BadParameter(str(exc).removeprefix("--only ")) from None


def search_options(world_size_help: str) -> Decorator[Any]:
    """--world-size / --trials / --storage / --only (recommend, run)."""
    return _stack(
        click.option("--world-size", type=POSITIVE, default=None, help=world_size_help),
        click.option(
            "--only",
            "only",
            multiple=True,
            metavar="KNOB=V1,V2",
            callback=_only,
            help="Search only these values of a knob (repeatable): precision, checkpointing, "
            "parallelism, micro-batch-size, num-workers, loss-chunks, "
            "fsdp-reshard-after-forward, compile; e.g. --only checkpointing=none,full "
            "--only compile=false. Other knobs keep what the profile can price.",
        ),
        click.option(
            "--trials",
            type=POSITIVE,
            default=None,
            help=f"Most candidates the study holds (default {DEFAULT_TRIALS}): the best of an "
            "in-memory screen of the space, or TPE's budget for a space too large to screen; "
            "at most 256 priceable candidates are all enumerated.",
        ),
        click.option(
            "--storage",
            default=None,
            help="Optuna storage URL, also shared by several workers (e.g. "
            "postgresql+psycopg2://...); default sqlite:///OUT/study.db.",
        ),
    )


validation_options = _stack(
    click.option(
        "--validate-top",
        type=NON_NEGATIVE,
        default=DEFAULT_VALIDATE_TOP_K,
        show_default=True,
        help="Measure the K best predicted configs with short real runs (and the baseline, and "
        "the best of a layout missing from them whose 90% interval reaches the best "
        f"prediction's; within {LAYOUT_MARGIN:.0%} of it for predictions without intervals). "
        "A config whose run fails is replaced by the next ranked one (up to K in all).",
    ),
    click.option(
        "--validate-rounds",
        type=POSITIVE,
        default=DEFAULT_VALIDATE_ROUNDS,
        show_default=True,
        help=f"Measure configs within {TIE_MARGIN:.0%} of the fastest up to N times, at "
        "different moments, before the fastest wins (1: each finalist once); also one whose "
        "single visit fell below its predicted interval while that interval reaches them.",
    ),
)

whatif_options = _stack(
    click.option(
        "--target",
        default=None,
        help="What-if: plan for this device from the datasheet table (e.g. h100-80gb, "
        "a100-80gb) instead of the profiled one; results are labelled estimates.",
    ),
    click.option(
        "--nodes",
        type=POSITIVE,
        default=1,
        show_default=True,
        help="With --target: machines the world size is spread over.",
    ),
    click.option(
        "--network",
        default=None,
        help="With --nodes > 1: the inter-node network (profilers.hardware.NETWORKS key, "
        "default ib-ndr-400).",
    ),
)


def check_whatif(params: Mapping[str, Any]) -> None:
    if params["target"] is None and (params["nodes"] != 1 or params["network"]):
        raise click.UsageError("--nodes and --network plan for other hardware: add --target")
    if params["nodes"] == 1 and params["network"]:
        from strategies.space import NETWORK_NEEDS_NODES

        raise click.UsageError(NETWORK_NEEDS_NODES)


# -- train ----------------------------------------------------------------------------------------

run_length_options = _stack(
    click.option(
        "--steps",
        type=POSITIVE,
        default=None,
        help=f"Optimizer steps to train (default {DEFAULT_STEPS} unless --tokens; a --resume "
        "without either finishes the run's own length).",
    ),
    click.option(
        "--tokens",
        type=TOKENS,
        default=None,
        help="Train for this many tokens instead (e.g. 100000 or 1e5).",
    ),
)

VAL_DATA_HELP = (
    "Evaluate on this file instead of --data's validation split: text (read as --data is, "
    "through the same tokenizer), FILE.jsonl[:FIELD], a .bin of uint16 ids, a .npy of integer "
    "ids, or a directory's val.bin or *val* shards; all of it is the validation set, and a "
    "single --data file then trains on all of it. A --resume without it keeps the run's own."
)


def val_data_option(help_text: str = VAL_DATA_HELP) -> Decorator[Any]:
    """--val-data (train, run: in :data:`train_output_options`; tune)."""
    return click.option("--val-data", default=None, metavar="SPEC", help=help_text)


train_output_options = _stack(
    click.option(
        "--checkpoint-every",
        type=POSITIVE,
        default=None,
        help="Save a checkpoint every N steps (default: about 4 per run, and at the end).",
    ),
    click.option(
        "--keep-checkpoints",
        type=POSITIVE,
        default=DEFAULT_KEEP_CHECKPOINTS,
        show_default=True,
        help="How many recent checkpoints to keep.",
    ),
    click.option(
        "--eval-every",
        type=NON_NEGATIVE,
        default=None,
        help="Eval loss every N steps (default: about 10 per run; 0: only at the end).",
    ),
    click.option(
        "--eval-batches",
        type=POSITIVE,
        default=DEFAULT_EVAL_BATCHES,
        show_default=True,
        help="Validation global batches per eval (the same samples for any micro/accum/rank "
        "split).",
    ),
    val_data_option(),
)


def run_options(params: Mapping[str, Any], out: Path, *, resume: bool) -> RunOptions:
    """The training run's options from the flags of :data:`run_length_options`,
    :data:`train_output_options`, --device and --quiet."""
    return RunOptions(
        out=out,
        steps=run_steps(params["steps"], params["tokens"], resume=resume),
        tokens=params["tokens"],
        resume=resume,
        checkpoint_every=params["checkpoint_every"],
        eval_every=params["eval_every"],
        eval_batches=params["eval_batches"],
        val_data=params["val_data"],
        keep_checkpoints=params["keep_checkpoints"],
        device=params["device"],
        progress=not params["quiet"],
    )


def default_seq_len_option() -> Decorator[Any]:
    """--seq-len with the config's default shown (profile, run)."""
    return seq_len_option(DEFAULT_SEQ_LEN)


def default_global_batch_option() -> Decorator[Any]:
    """--global-batch-size with the config's default shown (run)."""
    return global_batch_option(default=DEFAULT_GLOBAL_BATCH_SIZE)
