"""The library behind ``advisor train`` (and ``advisor.train``): which config a run trains, and
one call that trains it here or, for ddp/fsdp, once per rank through torchrun.

    plan / resumed run's saved config / defaults  →  explicit overrides  →  TrainConfig
    TrainConfig + RunOptions  →  this process (single)  |  torchrun ranks (ddp, fsdp)

Torch is imported only when training starts (``advisor --help`` stays instant).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor.errors import UsageProblem
from advisor.launch import LaunchSpec, under_torchrun
from advisor.trainer.options import RunOptions
from profilers.metrics_record import Metrics, read_metrics
from profilers.rundir import PLAN, TUNED_PLAN, RunDir, TrainDir
from strategies.config import ConfigError, TrainConfig, compose_config, load_plan_config

if TYPE_CHECKING:
    from advisor.data.token_source import TokenSource
    from advisor.trainer.loop import TrainResult


def default_out(prefix: str) -> Path:
    """``runs/PREFIX-TIMESTAMP``: where a command writes when not told (relative to the cwd)."""
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def resolve_train_config(
    plan: str | os.PathLike[str] | TrainConfig | None,
    out: Path | None,
    resume: bool,
    overrides: Mapping[str, Any],
) -> TrainConfig:
    """The plan (a plan.json path or a TrainConfig), else the resumed run's saved config, else
    the defaults; then ``overrides`` (TrainConfig keys) over it (``compose_config``).

    Over a plan, a new micro-batch size or world size keeps the plan's global batch (the one
    the user chose, which the plan was searched at) and the accumulation follows, unless the
    overrides name the global batch or the accumulation themselves: ``--micro-batch-size 4``
    on a plan of 8 x 1 trains 4 x 2, where it trained a global batch of 4."""
    base = TrainConfig()
    if plan is not None:
        base = plan if isinstance(plan, TrainConfig) else _plan_config(Path(plan))
        overrides = keeping_the_global_batch(base, overrides)
    elif resume and out is not None and TrainDir(out).train_config.is_file():
        saved_path = TrainDir(out).train_config
        try:
            saved = json.loads(saved_path.read_text())
            base = TrainConfig.from_dict(saved["config"])
        except (KeyError, TypeError, ValueError) as exc:
            # With the flags given, the defaults under them: the checkpoint's own config then
            # names any flag that differs, with its value (the trainer's resume check). It
            # refused them too, though it told the user to pass them.
            if not overrides:
                raise ConfigError(
                    f"{saved_path} is damaged ({type(exc).__name__}: {exc}): pass the flags of "
                    "the original run explicitly (with --resume, as before)"
                ) from None
    return compose_config(base, overrides)


def keeping_the_global_batch(plan: TrainConfig, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` of a plan's config, with the plan's global batch added when they change
    the micro-batch size or the world size and name neither the global batch nor the
    accumulation: the accumulation then follows (``compose_config``), not the global batch."""
    out = dict(overrides)
    if out.keys() & {"micro_batch_size", "world_size"} and not out.keys() & {
        "global_batch_size",
        "grad_accum_steps",
    }:
        out["global_batch_size"] = plan.global_batch_size
    return out


def _plan_config(path: Path) -> TrainConfig:
    """:func:`load_plan_config`, naming the files passed to ``--plan`` by mistake as such: a
    profile (its 17 keys were listed as unknown TrainConfig keys) or a plan without its
    config. A run directory is its plan.json, unless advisor tune left a tuned_plan.json there:
    which of the two to train is then the user's to say (``advisor export RUN`` takes the
    tuned one, and a directory read as its plan.json trained the untuned values silently)."""
    if path.is_dir():
        run = RunDir(path)
        if run.tuned_plan.is_file():
            beside = f" beside its {PLAN}" if run.plan.is_file() else ""
            raise UsageProblem(
                f"{path} holds {TUNED_PLAN} (advisor tune's hyper-parameters){beside}: pass the "
                f"plan to train, --plan {run.tuned_plan}"
                + (f" or --plan {run.plan}" if beside else "")
            )
        path = run.plan
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        data = None  # load_plan_config says what is wrong with the file
    if isinstance(data, dict) and "config" not in data:
        if isinstance(data.get("device"), dict) and isinstance(data.get("model"), dict):
            raise ConfigError(
                f"{path} is a profile, not a plan: make a plan from it with 'advisor recommend "
                f"--profile {path} --global-batch-size N --out DIR' and pass DIR/{PLAN}"
            )
        if "schema_version" in data:
            raise ConfigError(
                f"{path} is not a plan (it has no 'config'): pass the {PLAN} that 'advisor "
                "recommend' wrote"
            )
    return load_plan_config(path)


def needs_launch(config: TrainConfig) -> bool:
    """DDP/FSDP need a process group even on one rank: torchrun provides it."""
    return (config.world_size > 1 or config.parallelism != "single") and not under_torchrun()


def train(
    config: TrainConfig,
    options: RunOptions,
    *,
    launch: LaunchSpec | None = None,
    say: Callable[[str], None] | None = None,
    planned_for: str | None = None,
) -> TrainResult | None:
    """Train ``config`` in this process; or, when it needs ranks (:func:`needs_launch`), run it
    once per rank through torchrun as ``launch`` says (default: one node) and return None (rank
    0 wrote the run's files). ``say`` receives the per-node commands of a multi-node job."""
    options = resumed_options(options)
    check_host_memory(config, options, planned_for=planned_for)
    if needs_launch(config):
        spec = launch or LaunchSpec(world_size=config.world_size)
        with _steps_to(options.on_line, options.out):
            launch_ranks(config, options, spec, say or (lambda _message: None))
        return None
    from advisor.trainer.loop import train as run_training

    return run_training(config, options)


@contextlib.contextmanager
def _steps_to(on_line: Callable[[str], None] | None, out: Path) -> Iterator[None]:
    """While launched ranks train into ``out``, each step rank 0 logs in metrics.jsonl goes to
    ``on_line`` as a line (the ranks' own progress goes to their stderr, not to a caller's
    callback). Nothing without a callback."""
    if on_line is None:
        yield
        return
    import threading

    from profilers.metrics_record import TrainRecord, parse_record

    done = threading.Event()
    path = TrainDir(out).metrics
    offset = path.stat().st_size if path.exists() else 0  # a resumed run's earlier steps

    def follow() -> None:
        nonlocal offset
        while True:
            finished = done.is_set()
            if path.exists():
                lines, offset = json_lines_after(path, offset)
                for data in lines:
                    try:
                        record = parse_record(data)
                    except ValueError:
                        continue
                    if isinstance(record, TrainRecord) and record.loss is not None:
                        on_line(f"step {record.step}  loss {record.loss:.4f}")
            if finished:
                return
            done.wait(0.5)

    thread = threading.Thread(target=follow, name="advisor-train-steps", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


def json_lines_after(path: Path, offset: int) -> tuple[list[Any], int]:
    """The JSON values of the whole lines another process appended to ``path`` after byte
    ``offset`` (a line still being written waits for the next call; one that is not JSON is
    skipped), and the offset to read from next."""
    with open(path, "rb") as f:
        f.seek(offset)
        chunk = f.read()
    whole = chunk[: chunk.rfind(b"\n") + 1]
    values = []
    for line in whole.decode(errors="replace").splitlines():
        try:
            values.append(json.loads(line))
        except ValueError:
            continue
    return values, offset + len(whole)


def whatif_plan(plan: str | os.PathLike[str] | None) -> str | None:
    """The hardware a what-if plan (``recommend --target``: ``"estimate": true``) was made for,
    as its label names it ("8× NVIDIA H100 SXM5 80GB"); None for a plan of this kind of host,
    a run directory's own plan, or no plan."""
    if plan is None:
        return None
    path = Path(plan)
    if path.is_dir():
        path = path / PLAN
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, Mapping) or data.get("estimate") is not True:
        return None
    label = str(data.get("label") or "")
    where = label.removeprefix("ESTIMATE for ").split(":")[0].strip()
    return where or "other hardware"


def check_host_memory(
    config: TrainConfig, options: RunOptions, *, planned_for: str | None = None
) -> None:
    """On a CPU, refuse a model whose training state alone exceeds the RAM available, before
    it is built: an 8B model's 128 GB on a 23 GiB host allocated until the allocator gave up
    ("can't allocate memory", no fix named) or the kernel killed a neighbour. ``profile`` and
    ``run`` know this up front already. DDP ranks each hold the whole state; FSDP ranks each
    build the whole fp32 model before sharding it, and hold a share of the rest."""
    import torch

    from advisor.models import build_model
    from profilers.device import read_host_memory
    from profilers.memory_measured import WEIGHT_BYTES_PER_PARAM, training_state_bytes

    if options.device == "cuda" or (options.device == "auto" and torch.cuda.is_available()):
        return
    if under_torchrun():
        return  # the launcher checked the job; a rank would see its peers' allocations
    _, available = read_host_memory()
    if available <= 0:
        return  # unknown: nothing to hold it against
    module = build_model(config.model, config.model_args, meta=True).module
    params = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    state = training_state_bytes(params, trainable)
    if config.parallelism == "ddp":
        need = state * config.world_size
    elif config.parallelism == "fsdp":
        need = state + WEIGHT_BYTES_PER_PARAM * params * config.world_size
    else:
        need = state
    if need > available:
        gib = 2**30
        what = f"{state / gib:.1f} GiB for its fp32 weights, gradients and AdamW state"
        if config.world_size > 1:
            # 64 FSDP ranks of a 7B each building the whole fp32 model here read "1707 GiB
            # for its fp32 weights, gradients and AdamW state" (its state is 100 GiB).
            build = "the whole state" if config.parallelism == "ddp" else "the whole fp32 model"
            what += (
                f", and its {config.world_size} {config.parallelism} ranks each build "
                f"{build} on this host: {need / gib:.1f} GiB in all"
            )
        fix = (
            f"this plan is a what-if for {planned_for}: run it there, or plan for this host "
            "with 'advisor recommend' without --target"
            if planned_for
            else "plan it for GPUs with 'advisor profile' then 'advisor recommend --target "
            "GPU', or train a smaller --model-arg here"
        )
        raise UsageProblem(
            f"{config.model} has {params / 1e9:.2f}B parameters: training it here needs {what}, "
            f"and this host has {available / gib:.1f} GiB available: {fix}"
        )


def resumed_options(options: RunOptions) -> RunOptions:
    """``options`` of a ``--resume`` with what the run was started with in place of what the
    command does not say: its length (neither --steps nor --tokens: it trained on to the
    default 300 steps, with a schedule that had ended at the original length) and its
    evaluation and checkpoint cadence and its ``--val-data`` (``train_config.json``'s
    ``total_steps`` and ``options``; a resume that names another --val-data evaluates on it
    from then on, and the trainer says so). Anything else, or a run not resumed, is returned
    as is."""
    from advisor.trainer.options import DEFAULT_STEPS

    kept: dict[str, Any] = {}
    total = None
    saved_path = TrainDir(options.out).train_config
    if options.resume and saved_path.is_file():
        try:
            saved = json.loads(saved_path.read_text())
            kept, total = dict(saved.get("options") or {}), saved.get("total_steps")
        except (OSError, ValueError, AttributeError, TypeError):
            pass  # resolve_train_config names a damaged file
    changes: dict[str, Any] = {}
    if options.steps is None and options.tokens is None:
        changes["steps"] = total if isinstance(total, int) else DEFAULT_STEPS
    for name in ("checkpoint_every", "eval_every"):
        if getattr(options, name) is None and isinstance(kept.get(name), int):
            changes[name] = kept[name]
    if options.val_data is None and isinstance(kept.get("val_data"), str):
        changes["val_data"] = kept["val_data"]
    return dataclasses.replace(options, **changes) if changes else options


def check_data(config: TrainConfig, val_data: str | None) -> TokenSource:
    """Every refusal of ``config``'s data and of ``--val-data`` beside its model, as the
    trainer makes them (:func:`advisor.data.resolve_data`, ``check_shapes``), for a command
    that trains later: ``advisor run`` before its profile (which reads the train split only),
    ``advisor tune`` before its first trial (a trial refused it after minutes). The model is
    read on the meta device, not built. Returns the source."""
    from advisor.data import resolve_data
    from advisor.trainer.loop import check_shapes
    from advisor.workload import AdvisorWorkload

    workload = AdvisorWorkload(config.model, dict(config.model_args), config.data, config.tokenizer)
    facts = workload.facts()
    source = resolve_data(
        config.data,
        tokenizer=config.tokenizer,
        model_vocab=facts.vocab_size,
        min_tokens=config.seq_len + 1,
        model=config.model,
        val_data=val_data,
    )
    check_shapes(config, facts, source)
    return source


def launch_ranks(
    config: TrainConfig, options: RunOptions, spec: LaunchSpec, say: Callable[[str], None]
) -> None:
    """Re-run ``advisor train`` once per rank through torchrun, with ``config`` as its plan."""
    from advisor.launch import RanksFailed, launch, node_command

    options.out.mkdir(parents=True, exist_ok=True)
    plan = TrainDir(options.out).launch_config
    if spec.nnodes > 1:
        # One per node: --out is shared, and with one file the last node to write it set
        # every node's settings (a node started with other flags trained silently on the
        # other's). Each node's ranks read their own; the trainer makes them agree.
        plan = plan.with_name(f"{plan.stem}.node{spec.node_rank}{plan.suffix}")
    plan.write_text(json.dumps({"config": config.to_dict()}, indent=2) + "\n")
    args = options.train_args(plan)
    if spec.nnodes > 1:
        # The same torchrun options on every node; --plan is this node's settings file.
        say("this node runs (every node the same, with its own --node-rank; --out shared):")
        say(f"  {node_command(spec, args)}")
    started = time.time()
    try:
        launch(spec, args)
    except RanksFailed as exc:
        final = completed_since(options.out, started)
        if final is None:
            raise
        say(
            f"warning: {exc}, after the run had completed: its final checkpoint ({final}) was "
            "committed by every rank, so its results are whole (a gloo rank can abort while "
            "its interpreter tears down the process group, after its work)"
        )


def completed_since(out: Path, started: float) -> Path | None:
    """The final checkpoint of a run in ``out`` committed at or after ``started`` (epoch
    seconds), or None: a failure after it came once every rank had finished its work (the
    teardown abort of PyTorch issue 65231 that CI saw in a test's ranks on 2026-12-04).

    The trainer commits the last step's checkpoint after every rank has written its part
    (a barrier before rank 0's commit), so a committed checkpoint whose step is the run's last
    means no rank had work left when one failed; a checkpoint from before this launch (a run
    already complete when resumed) or of an earlier step does not count.
    """
    from advisor.trainer.checkpoint import CheckpointDir

    checkpoints = CheckpointDir(TrainDir(out).checkpoints, keep_last=0)
    latest = checkpoints.latest()
    if latest is None:
        return None
    try:
        if (latest / "extra.pt").stat().st_mtime < started:
            return None
        extra = CheckpointDir.load_extra(latest)
    except Exception:  # unreadable (torch.load fails many ways): no proof of completion
        return None
    step, total = extra.get("step"), extra.get("total_steps")
    return latest if isinstance(step, int) and step == total else None


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSummary:
    """What a training run ended with (``advisor.train`` returns it).

    ``steps``: the optimizer steps the run has completed; ``tokens``: the tokens trained in all
    (resumed segments included); ``final_loss``: the last step's training loss (NaN when no
    step was logged); ``eval_loss``: the last evaluation's; ``checkpoint``: the newest one;
    ``already_complete``: a resumed run that had nothing left to train. Per-step records:
    :meth:`metrics`.
    """

    out: Path
    config: TrainConfig
    steps: int
    tokens: int
    final_loss: float
    eval_loss: float | None
    checkpoint: Path | None
    metrics_path: Path
    skipped_steps: int = 0
    already_complete: bool = False

    def metrics(self) -> Metrics:
        """Every line of metrics.jsonl as typed records (``.train``, ``.evals``)."""
        return read_metrics(self.metrics_path)

    @classmethod
    def from_result(cls, config: TrainConfig, result: TrainResult) -> TrainSummary:
        """From the trainer's own result (a run in this process)."""
        return cls(
            out=result.out,
            config=config,
            steps=result.steps,
            tokens=result.tokens,
            final_loss=result.final_loss,
            eval_loss=result.eval_loss,
            checkpoint=result.checkpoint,
            metrics_path=result.metrics_path,
            skipped_steps=result.skipped_steps,
            already_complete=bool(result.extra.get("already_complete")),
        )

    @classmethod
    def from_run_dir(cls, config: TrainConfig, out: Path) -> TrainSummary:
        """From the files rank 0 wrote (a run launched through torchrun)."""
        files = TrainDir(out)
        metrics = read_metrics(files.metrics)
        train, evals = metrics.train, metrics.evals
        last = train[-1] if train else None
        checkpoints = files.checkpoint_dirs()
        return cls(
            out=out,
            config=config,
            steps=last.step if last else 0,
            tokens=(last.tokens or 0) if last else 0,
            final_loss=last.loss if last and last.loss is not None else float("nan"),
            eval_loss=evals[-1].eval_loss if evals else None,
            checkpoint=checkpoints[-1] if checkpoints else None,
            metrics_path=files.metrics,
            skipped_steps=(last.skipped_steps or 0) if last else 0,
        )
