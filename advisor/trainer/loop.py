"""``advisor train``: run a TrainConfig end to end.

Writes ``OUT/metrics.jsonl`` (one line per optimizer step, plus eval lines), ``OUT/checkpoints/``
and ``OUT/train_config.json``. Resumable bit for bit: the data order is a pure function of the
step, and a checkpoint carries every state the next step reads.
"""

from __future__ import annotations

import contextlib
import json
import math
import pickle
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from advisor.data import (
    StepSampler,
    TokenSource,
    WindowDataset,
    data_use,
    make_loader,
    repetition_notice,
    resolve_data,
)
from advisor.errors import AdvisorError, TrainingDiverged, UsageProblem
from advisor.launch import die_with_parent
from advisor.models import ModelAdapter
from advisor.models.weights import LoadedWeights, load_weights
from advisor.trainer.checkpoint import (
    CheckpointDir,
    initial_weights,
    rng_state,
    set_rng_state,
    weights_fix,
)
from advisor.trainer.compile import check_compile_available, compile_problem
from advisor.trainer.dist import (
    DistContext,
    check_ranks_agree,
    init_distributed,
    launched_by_torchrun,
    shutdown_distributed,
)
from advisor.trainer.metrics import MetricsLog, PeakMemory, Progress
from advisor.trainer.options import RunOptions
from advisor.trainer.schedule import WarmupCosine
from advisor.trainer.state import barrier, load_model_state, save_model_state
from advisor.trainer.step import AdvisorStep
from advisor.workload import AdvisorWorkload
from profilers.metrics_record import EvalRecord, TrainRecord, read_metrics
from profilers.rundir import TrainDir, write_atomically
from profilers.workload import NO_REPEATED_BLOCKS, Batch, ModelFacts
from strategies.config import TrainConfig


class TrainingInterrupted(AdvisorError):
    """SIGTERM/SIGINT: a checkpoint was saved and the run stopped; ``--resume`` continues it."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


@dataclass
class TrainResult:
    out: Path
    steps: int
    tokens: int
    final_loss: float
    eval_loss: float | None
    checkpoint: Path | None
    metrics_path: Path
    skipped_steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def plan_total_steps(config: TrainConfig, steps: int | None, tokens: int | None) -> int:
    if steps is not None and tokens is not None:
        raise UsageProblem("give --steps or --tokens, not both")
    if steps is not None:
        if steps < 1:
            raise UsageProblem(f"--steps must be a positive integer, got {steps}")
        return steps
    if tokens is not None:
        if tokens < 1:
            raise UsageProblem(f"--tokens must be a positive integer, got {tokens}")
        return math.ceil(tokens / config.tokens_per_step)
    raise UsageProblem("say how long to train: --steps N or --tokens N")


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name not in ("auto", "cpu", "cuda"):
        raise UsageProblem(f"unknown --device {name!r}: use auto, cpu or cuda")
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise UsageProblem("--device cuda but no CUDA device is visible: use --device cpu")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def check_precision(precision: str, device: torch.device) -> None:
    from profilers.device import precision_problem

    problem = precision_problem(device, precision)  # only its own (precision_problem says why)
    if problem:
        raise UsageProblem(f"{precision} cannot run on {device.type}: {problem}")


def check_shapes(config: TrainConfig, facts: ModelFacts, source: TokenSource) -> None:
    if facts.max_seq_len and config.seq_len > facts.max_seq_len:
        raise UsageProblem(
            f"--seq-len {config.seq_len} exceeds {config.model}'s maximum sequence length "
            f"{facts.max_seq_len}: lower --seq-len or raise the model's maximum with --model-arg"
        )
    if source.vocab_size > facts.vocab_size:
        raise UsageProblem(
            f"data {config.data!r} has token ids up to {source.vocab_size - 1} but "
            f"{config.model} has a vocabulary of {facts.vocab_size}: use "
            f"--model-arg vocab_size={source.vocab_size} (or a matching tokenizer)"
        )
    val = source.val
    if val is not None and val.vocab_size > facts.vocab_size:
        raise UsageProblem(
            f"--val-data {val.spec!r} has token ids up to {val.vocab_size - 1} but "
            f"{config.model} has a vocabulary of {facts.vocab_size}: pass validation ids from "
            f"the train data's tokenizer (or --model-arg vocab_size={val.vocab_size})"
        )


def check_block_knobs(config: TrainConfig, facts: ModelFacts) -> None:
    """Activation checkpointing recomputes the repeated blocks: refuse it for a model without
    (and blocks:K for K outside 1..L-1)."""
    problem = facts.checkpointing_problem(config.activation_checkpointing)
    if facts.repeated_blocks and problem:
        raise UsageProblem(f"{config.model}: {problem}")
    if config.activation_checkpointing not in facts.checkpointing_modes()[0]:
        raise UsageProblem(
            f"--activation-checkpointing {config.activation_checkpointing} is unavailable for "
            f"{config.model}: {NO_REPEATED_BLOCKS}; use --activation-checkpointing none "
            "(or keep the layers in an nn.ModuleList, which an advisor_blocks attribute, if the "
            "model sets one, must name)"
        )
    why = facts.loss_chunking_unavailable()
    if config.loss_chunks > 1 and why:
        raise UsageProblem(
            f"--loss-chunks {config.loss_chunks} is unavailable for {config.model}: {why}; use "
            "--loss-chunks 1"
        )


def _flag(key: str) -> str:
    """The ``advisor train`` flag of a TrainConfig key."""
    return "--model-arg" if key == "model_args" else "--" + key.replace("_", "-")


def _shown(value: Any) -> str:
    """A config value as a flag would take it (``none`` for None, ``k=v`` for model args)."""
    if value is None:
        return "none"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in sorted(value.items())) or "none"
    return str(value)


def _span(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def _jsonable(x: float) -> float | None:
    return x if math.isfinite(x) else None


class _StopFlag:
    """SIGTERM/SIGINT set a flag checked between steps; a second Ctrl-C interrupts at once. A
    second SIGTERM does not: it is the same request delivered twice (a scheduler signals the
    whole process group while ``advisor run`` passes its own SIGTERM on to this child), and a
    scheduler's SIGKILL ends its grace period anyway."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            if signum == signal.SIGTERM:
                return  # the checkpoint goes on
            self.__exit__()
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class Trainer:
    def __init__(self, config: TrainConfig, options: RunOptions) -> None:
        self.config, self.options = config, options
        self.total_steps = plan_total_steps(config, options.steps, options.tokens)
        if launched_by_torchrun():
            die_with_parent()  # a rank never outlives its launcher (kill -9 included)
        self.ctx: DistContext = init_distributed(config.world_size, _device_type(options.device))
        check_ranks_agree(self.ctx, {**config.to_dict(), "steps": self.total_steps})
        self.device = resolve_device(options.device, self.ctx.local_rank)
        check_precision(config.precision, self.device)
        self.workload = AdvisorWorkload(
            config.model, dict(config.model_args), config.data, config.tokenizer
        )
        self.facts = self.workload.facts()
        check_block_knobs(config, self.facts)
        if config.compile:
            check_compile_available(self.device.type)
        # Resolved now, so a missing or unreadable path fails before anything is built.
        self.weights_source = initial_weights(config.model, config.init_from)
        self.weights: LoadedWeights | None = None
        self.source = resolve_data(
            config.data,
            tokenizer=config.tokenizer,
            model_vocab=self.facts.vocab_size,
            min_tokens=config.seq_len + 1,
            model=config.model,
            val_data=options.val_data,
        )
        check_shapes(config, self.facts, self.source)
        self.out = options.out
        self.files = TrainDir(self.out)
        self.checkpoints = CheckpointDir(self.files.checkpoints, options.keep_checkpoints)
        self.last_checkpoint: Path | None = None
        self.last_checkpoint_step = -1
        self.metrics = MetricsLog(self.files.metrics)
        self.checkpoint_every = options.checkpoint_every or max(1, self.total_steps // 4)
        self.eval_every = (
            max(1, self.total_steps // 10) if options.eval_every is None else options.eval_every
        )

    # -- setup --------------------------------------------------------------------------------
    def _build(self, resuming: bool) -> None:
        torch.manual_seed(self.config.seed)  # identical initial weights on every rank
        # Initial weights go in after placement and before the wrappers, on every rank (DDP
        # and FSDP then start from identical full copies); a resumed run's checkpoint has its
        # own weights.
        load = self._load_initial_weights if self.weights_source and not resuming else None
        self.step: AdvisorStep = self.workload.build_step(
            self.config.step_spec(), self.device, before_wrap=load
        )
        schedule = WarmupCosine(
            self.config.lr, self.config.min_lr, self.config.warmup_steps, self.total_steps
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.step.optimizer, schedule)
        self.objective = self.step.adapter.make_objective(self.source.vocab_size)
        self.peak = PeakMemory(self.device)

    def _load_initial_weights(self, adapter: ModelAdapter) -> None:
        assert self.weights_source is not None
        fix = weights_fix(self.config.model, self.config.init_from, self.config.model_args)
        self.weights = load_weights(adapter.module, self.weights_source, self.config.model, fix=fix)

    def _check_out_dir(self) -> Path | None:
        existing = self.checkpoints.latest()
        if self.options.resume:
            return existing
        if existing is not None or self.files.metrics.exists():
            raise UsageProblem(
                f"{self.out} already holds a training run: pass --resume to continue it, "
                "or choose another --out"
            )
        return None

    def _note(self, text: str) -> None:
        """A note the run's user must see whatever --quiet says (the run is not what the
        command seems to ask for): on stderr, or to the caller's ``on_note``
        (``advisor.train``: its callback, or a warning; the library never prints)."""
        if self.options.on_note is not None:
            self.options.on_note(text)
        else:
            print(f"note: {text}", file=sys.stderr, flush=True)

    def _damaged(self, path: Path, exc: BaseException) -> UsageProblem:
        """A checkpoint that cannot be read: an empty extra.pt raised EOFError, which click
        reports as a Ctrl-C (exit 130), and a cut state.pt a traceback."""
        reason = (str(exc).strip().splitlines() or [""])[0].split(". ")[0][:160]
        # Deleting it is the way back: 'latest' then falls back to the newest complete
        # checkpoint (a step_N written into 'latest' by hand needs the zero-padded name).
        earlier = [d for d in map(self.checkpoints.dir_for, self.checkpoints.steps()) if d != path]
        then = f"from {earlier[-1].name}" if earlier else "from step 0 (no earlier checkpoint)"
        return UsageProblem(
            f"cannot resume {self.out}: checkpoint {path} cannot be read ({type(exc).__name__}"
            f"{': ' + reason if reason else ''}): delete it to resume {then}, or choose "
            "another --out"
        )

    def _restore(self, path: Path) -> int:
        try:
            state = self.checkpoints.load_extra(path)
        except (EOFError, RuntimeError, pickle.UnpicklingError) as exc:
            raise self._damaged(path, exc) from None
        saved = state["config"]
        ours = self.config.to_dict()
        # Loader workers change no sample (the order is a pure function of seed and index):
        # a resume on a host with fewer cores may use fewer.
        free = {"num_workers"}
        diff = sorted(k for k in (set(saved) | set(ours)) - free if saved.get(k) != ours.get(k))
        if diff:
            # The values too: "a different lr" sent the user to train_config.json to find out
            # which lr the run had.
            changed = ", ".join(
                f"{_flag(k)} {_shown(saved.get(k))} (not {_shown(ours.get(k))})" for k in diff
            )
            raise UsageProblem(
                f"cannot resume {self.out}: its checkpoint was trained with {changed}; resume "
                "with the same settings or choose another --out"
            )
        try:
            load_model_state(self.step, path, self.device)
        except (EOFError, RuntimeError, pickle.UnpicklingError) as exc:
            raise self._damaged(path, exc) from None
        self.step.scaler.load_state_dict(state["scaler"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.tokens = int(state["tokens"])
        self.skipped = int(state["skipped_steps"])
        self.elapsed_before = float(state["elapsed_s"])
        return int(state["step"])

    def _save(self, step: int) -> Path | None:
        """Every rank: stage, write model/optimizer state, then rank 0 commits atomically."""
        if self.ctx.is_main:
            self.metrics.sync()
            self.checkpoints.begin(step)
        barrier(self.ctx)
        save_model_state(self.step, self.checkpoints.staging_dir(step), self.ctx)
        barrier(self.ctx)
        extra = {
            "step": step,
            "config": self.config.to_dict(),
            "total_steps": self.total_steps,
            "world_size": self.config.world_size,
            "scaler": self.step.scaler.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "tokens": self.tokens,
            "skipped_steps": self.skipped,
            "elapsed_s": self._elapsed(),
        }
        path = self.checkpoints.commit(step, extra) if self.ctx.is_main else None
        barrier(self.ctx)  # nobody moves on (or dies) with a half-committed checkpoint
        self.last_checkpoint = path or self.checkpoints.dir_for(step)
        self.last_checkpoint_step = step
        return path

    # -- data ---------------------------------------------------------------------------------
    def _batches(self, start: int) -> Iterator[list[Batch]]:
        c = self.config
        dataset = WindowDataset(self.source, "train", c.seq_len, c.seed, self.objective)
        sampler = StepSampler(
            start_step=start,
            num_steps=self.total_steps - start,
            micro_batch=c.micro_batch_size,
            accum=c.grad_accum_steps,
            rank=self.ctx.rank,
            world=c.world_size,
        )
        loader = make_loader(
            dataset,
            sampler,
            micro_batch=c.micro_batch_size,
            num_workers=c.num_workers,
            pin_memory=self.device.type == "cuda",
        )
        micro: list[Batch] = []
        for batch in loader:
            micro.append({k: v.to(self.device, non_blocking=True) for k, v in batch.items()})
            if len(micro) == c.grad_accum_steps:
                yield micro
                micro = []

    def _agree(self, loss: torch.Tensor, signum: int | None) -> tuple[float, int | None]:
        """The mean loss over ranks, and the stop signal any rank has seen (its own first), in
        the one all-reduce a step already makes: [loss, SIGINT seen, SIGTERM seen], summed."""
        if not self.ctx.enabled:
            return float(loss.item()), signum
        import torch.distributed as dist

        seen = [float(signum == signal.SIGINT), float(signum == signal.SIGTERM)]
        flags = torch.tensor(seen, dtype=torch.float32).to(loss.device, non_blocking=True)
        packed = torch.cat([loss.detach().float().reshape(1), flags])
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        total, interrupted, terminated = packed.tolist()
        agreed = signum
        if agreed is None and (interrupted or terminated):
            agreed = signal.SIGINT if interrupted else signal.SIGTERM
        return total / self.ctx.world_size, agreed

    def _all_mean(self, value: torch.Tensor) -> torch.Tensor:
        if self.ctx.enabled:
            import torch.distributed as dist

            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.ctx.world_size
        return value

    def evaluate(self) -> float:
        """Mean loss over the first ``eval_batches`` global batches of the validation split
        (all of ``--val-data`` when given: the source's nested ``val``).

        The same samples whatever the split into micro-batches, accumulation and ranks, so the
        eval loss of two configs at one global batch is comparable.
        """
        c = self.config
        dataset = WindowDataset(self.source, "val", c.seq_len, c.seed, self.objective)
        per_rank = self.options.eval_batches * c.micro_batch_size * c.grad_accum_steps
        chunks = per_rank // c.micro_batch_size
        self.step.model.eval()
        total = torch.zeros((), device=self.device)
        with torch.no_grad():
            for i in range(chunks):
                first = self.ctx.rank * per_rank + i * c.micro_batch_size
                items = [dataset[j] for j in range(first, first + c.micro_batch_size)]
                batch = {k: torch.stack([it[k] for it in items]).to(self.device) for k in items[0]}
                total += self.step.loss(batch).float()
        self.step.model.train()
        return float(self._all_mean(total / chunks).item())

    # -- the loop -----------------------------------------------------------------------------
    def _elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self._t_start

    def _gather_peaks(self, peak: int) -> list[int]:
        if not self.ctx.enabled:
            return [peak]
        import torch.distributed as dist

        out: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(out, peak)
        return [int(v) for v in out]

    def run(self) -> TrainResult:
        resume_from = self._check_out_dir()
        self._build(resuming=resume_from is not None)
        self.tokens, self.skipped, self.elapsed_before = 0, 0, 0.0
        start = self._restore(resume_from) if resume_from is not None else 0
        if start >= self.total_steps:
            # Nothing to train: the run's files stay as they are (a shorter --steps rewrote
            # train_config.json's total, and its report called a 13-step run 13/5 done).
            return self._already_done(start)
        # --resume with no checkpoint yet (a second Ctrl-C stops before one is saved): a fresh
        # start, whose metrics must not follow the lines of the steps it will log again.
        afresh = self.options.resume and resume_from is None and self.files.metrics.exists()
        if self.ctx.is_main:
            if afresh:
                self.metrics.truncate_after(0)
            self._write_run_files(start, resumed=resume_from is not None)
        wanted = self.options.progress or self.options.on_line is not None
        progress = Progress(
            self.total_steps,
            start,
            enabled=wanted and self.ctx.is_main,
            sink=self.options.on_line,
        )
        if self.ctx.is_main and start == 0 and (notice := self._repetition_notice()):
            # Said whatever --quiet says: a run that repeats its data should know (a 33-token
            # file was trained 58 times over without a word until 2026-12-07).
            self._note(notice)
        if afresh:
            progress.message(f"no checkpoint in {self.out} to resume from: training from step 0")
        if self.ctx.is_main:
            for notice in self._schedule_notices(start, resume_from, afresh):
                # Whatever --quiet says, as the repetition note: each means the run is not
                # what the command seems to ask for.
                self._note(notice)
        if resume_from is not None:
            progress.message(f"resumed from {resume_from} at step {start}")
        elif self.weights is not None:
            progress.message(self.weights.describe())
        self._mfu_terms = self._model_flops_and_peak()
        self._t_start = time.perf_counter()
        self.loss_value = math.nan
        self.agreed_stop: int | None = None  # the stop signal the ranks agreed on (_agree)
        self.eval_loss: float | None = None
        try:
            with _StopFlag() as stop:
                self._loop(start, progress, stop)
        finally:
            progress.close()
            self.metrics.close()
        return TrainResult(
            out=self.out,
            steps=self.total_steps,
            tokens=self.tokens,
            final_loss=self.loss_value,
            eval_loss=self.eval_loss,
            checkpoint=self.last_checkpoint,
            metrics_path=self.metrics.path,
            skipped_steps=self.skipped,
        )

    def _schedule_notices(self, start: int, resumed: Path | None, afresh: bool) -> list[str]:
        """What the learning-rate schedule and ``--resume`` do that the flags do not say: a
        ``--resume`` that finds no run (a mistyped --out trained a new one without a word), a
        warm-up that lasts the whole run (the default 20 steps of a 12-step run: no decay),
        and a resume whose length differs from the schedule's (the checkpoint's schedule is
        kept, so that a resume reproduces the uninterrupted run: past its end the rate stays
        at --min-lr)."""
        c = self.config
        notices = []
        if self.options.resume and resumed is None and not afresh:
            notices.append(f"--resume: no run in {self.out} yet: starting one at step 0")
        schedule = self.scheduler.lr_lambdas[0]
        ends = schedule.total_steps if isinstance(schedule, WarmupCosine) else self.total_steps
        if start == 0 and c.warmup_steps >= self.total_steps:
            notices.append(
                f"--warmup-steps {c.warmup_steps} is not below the run's length "
                f"({self.total_steps}): the learning rate rises for the whole run, to "
                f"{schedule(self.total_steps - 1) * c.lr:.3g} (--lr {c.lr:g}) at its last step, "
                "and never decays; lower --warmup-steps"
            )
        elif resumed is not None and ends < self.total_steps:
            notices.append(
                f"the learning-rate schedule of {self.out} ends at step {ends} (its length "
                f"when it started): {_span(max(ends, start) + 1, self.total_steps)} "
                f"{'trains' if max(ends, start) + 1 == self.total_steps else 'train'} at "
                f"--min-lr {c.min_lr:g}"
            )
        elif resumed is not None and ends > self.total_steps:
            notices.append(
                f"the learning-rate schedule of {self.out} decays over {ends} steps (its "
                f"length when it started): stopping at step {self.total_steps}, it ends at "
                f"{schedule(self.total_steps - 1) * c.lr:.3g}, not --min-lr {c.min_lr:g}"
            )
        return notices

    def _repetition_notice(self) -> str | None:
        """A line when the run draws more tokens than the train split holds, or an evaluation
        more windows than the validation split has (advisor.data.repetition_notice)."""
        use = data_use(
            self.source,
            steps=self.total_steps,
            global_batch_size=self.config.global_batch_size,
            seq_len=self.config.seq_len,
            eval_batches=self.options.eval_batches,
        )
        return repetition_notice(self.source, use)

    def _write_run_files(self, start: int, *, resumed: bool) -> None:
        """Rank 0: the run directory, metrics cut back to the checkpoint, train_config.json."""
        self.out.mkdir(parents=True, exist_ok=True)
        weights = self.weights.to_dict() if self.weights else None
        if resumed:
            self.metrics.truncate_after(start)
            weights = self._saved_weights()  # what the run started from, not the checkpoint
            was = self._saved("data")
            now = self.source.description
            # (a run started before a directory's description gave its counts: not a change)
            if isinstance(was, str) and was != now and not now.startswith(f"{was} ("):
                # The same --data path with other contents (a train.bin written again) passes
                # the config check; the resumed steps then read other tokens.
                self._note(
                    f"data {self.config.data} changed since {self.out} started (then: "
                    f"{was}; now: {now}): the resumed steps read the new "
                    "data, so they will not match an uninterrupted run"
                )
            if (note := self._val_data_note()) is not None:
                self._note(note)
        write_atomically(
            self.files.train_config,
            json.dumps(
                {
                    "config": self.config.to_dict(),
                    "total_steps": self.total_steps,
                    # What a --resume that names none of them keeps (advisor.training)
                    "options": {
                        "checkpoint_every": self.checkpoint_every,
                        "eval_every": self.eval_every,
                        "eval_batches": self.options.eval_batches,
                        "keep_checkpoints": self.options.keep_checkpoints,
                        **self._val_data_option(),
                    },
                    "device": str(self.device),
                    # which GPU: a what-if plan's report tells its target from another one
                    "device_name": torch.cuda.get_device_name(self.device)
                    if self.device.type == "cuda"
                    else None,
                    "data": self.source.description,
                    **self._val_data_record(),
                    "model": self.facts.to_dict(),
                    "weights": weights,
                },
                indent=2,
            )
            + "\n",
            durable=True,
        )

    def _val_data_option(self) -> dict[str, str]:
        """train_config.json's ``options`` entry of --val-data (none without it: the file of a
        run without one is as it was)."""
        return {} if self.options.val_data is None else {"val_data": self.options.val_data}

    def _val_data_record(self) -> dict[str, str]:
        """train_config.json's ``val_data``: what the evaluations read (none without it)."""
        return {} if self.source.val is None else {"val_data": self.source.val.description}

    def _val_data_note(self) -> str | None:
        """A resume whose validation set is not the one the run started with: its evaluations
        from now on do not compare with the earlier ones (and where the run had held back the
        last 10% of a single --data file for them, its train steps now read that too)."""
        was, val = self._saved("val_data"), self.source.val
        if val is None or was == val.description:
            return None
        if isinstance(was, str):
            return (
                f"validation data changed since {self.out} last started (then: {was}; now: "
                f"{val.description}): the evaluations from here on read the new data, so their "
                "losses do not compare with the earlier ones"
            )
        assert self.source.paths is not None  # --val-data beside synthetic data is refused
        train, held = self.source.paths
        whole = (
            f"; the train steps now read the whole of {self.config.data} (its last 10%, held "
            "back for validation until now, included), so they will not match an "
            "uninterrupted run"
            if train == held
            else ""
        )
        return (
            f"--val-data {val.spec}: {self.out} started without it, evaluating on the "
            f"validation split of {self.config.data}; the evaluations from here on read "
            f"{val.description}, so their losses do not compare with the earlier ones{whole}"
        )

    def _saved_weights(self) -> Any:
        """The initial weights the resumed run's train_config.json recorded (None if none)."""
        return self._saved("weights")

    def _saved(self, key: str) -> Any:
        """``key`` of the resumed run's train_config.json (None if absent or unreadable)."""
        try:
            return json.loads(self.files.train_config.read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            return None

    def _loop(self, start: int, progress: Progress, stop: _StopFlag) -> None:
        """Steps ``start + 1 .. total``: train, log, evaluate, checkpoint, honour a signal.

        A step's time runs from the end of the previous step's timer (data loading included)
        to its host sync; evaluation and checkpointing are not part of the next step's time.
        """
        t_prev = time.perf_counter()
        batches = self._batches(start)
        for step in range(start + 1, self.total_steps + 1):
            micro = next(batches)
            t_data = time.perf_counter() - t_prev
            record, t_prev = self._train_step(step, micro, t_data, t_prev, stop)
            if self.ctx.is_main:
                self.metrics.write(record)
            last = step == self.total_steps
            if last or (self.eval_every and step % self.eval_every == 0):
                self._log_eval(step, progress)
            # after the evaluation, so the line shows this step's eval loss, not the last one's
            progress.update(step, self.loss_value, record.tokens_per_s or 0.0)
            if last or step % self.checkpoint_every == 0:
                self._save(step)
            # One process reads its flag now; ranks act on the flags they agreed on in the step's
            # loss all-reduce, so a signal that reached them on either side of it stops every
            # rank after the same step (a split would hang the next collective).
            signum = self.agreed_stop if self.ctx.enabled else stop.signum
            if signum is not None and not last:  # the last step: the run is complete, saved
                self._stop(step, signum)
            if self.last_checkpoint_step == step or progress.eval_loss_step == step:
                t_prev = time.perf_counter()  # eval/checkpoint: not the next step's time

    def _train_step(
        self, step: int, micro: list[Batch], t_data: float, t_prev: float, stop: _StopFlag
    ) -> tuple[TrainRecord, float]:
        """One optimizer step: its record and when its timer stopped (``t_prev``: when the
        previous one's did). Stops the run on a NaN/inf loss."""
        lr = self.step.optimizer.param_groups[0]["lr"]
        self.peak.reset()
        loss, stats = self.step.step(micro)
        self.scheduler.step()
        # Host sync: one per optimizer step, for the loss, norm and the step timer.
        self.loss_value, self.agreed_stop = self._agree(loss, stop.signum)
        grad_norm = float(stats.grad_norm.item())
        now = time.perf_counter()
        step_time = now - t_prev
        if not math.isfinite(self.loss_value):
            self._diverged(step)
        self.skipped += bool(stats.skipped) if stats.skipped is not None else 0
        self.tokens += self.config.tokens_per_step
        peaks = self._gather_peaks(self.peak.read())
        tokens_per_s = self.config.tokens_per_step / step_time
        record = TrainRecord(
            step=step,
            loss=self.loss_value,
            lr=lr,
            grad_norm=_jsonable(grad_norm),
            tokens=self.tokens,
            step_time_s=step_time,
            data_time_s=t_data,
            tokens_per_s=tokens_per_s,
            peak_memory_bytes=max(peaks),
            peak_memory_kind=self.peak.kind,
            mfu=self.mfu(tokens_per_s),
            skipped_steps=self.skipped,
            elapsed_s=self._elapsed(),
            peak_memory_bytes_per_rank=tuple(peaks) if self.ctx.enabled else None,
            loss_scale=float(stats.loss_scale) if stats.loss_scale is not None else None,
        )
        return record, now

    def _diverged(self, step: int) -> None:
        # The step's line, its loss NaN/inf (null where the step did not get so far): without
        # it metrics.jsonl ended at the last good step and the report called a diverged run
        # merely incomplete, "resume it" (audit 41, D4). A resume from an earlier checkpoint
        # cuts it off with the steps after that checkpoint (MetricsLog.truncate_after).
        if self.ctx.is_main:
            self.metrics.write(
                TrainRecord(
                    step=step,
                    loss=self.loss_value,
                    tokens=self.tokens + self.config.tokens_per_step,
                    elapsed_s=self._elapsed(),
                    skipped_steps=self.skipped,
                )
            )
            self.metrics.sync()
        where = (
            f"the last good checkpoint is {self.last_checkpoint}"
            if self.last_checkpoint
            else "no checkpoint was saved yet"
        )
        raise TrainingDiverged(
            f"loss became {self.loss_value} at step {step}; {where}. Lower --lr, raise"
            " --warmup-steps, keep --grad-clip on, or use bf16 instead of fp16"
        )

    def _log_eval(self, step: int, progress: Progress) -> None:
        self.eval_loss = self.evaluate()
        progress.eval_loss, progress.eval_loss_step = self.eval_loss, step
        if self.ctx.is_main:
            self.metrics.write(EvalRecord(step=step, eval_loss=self.eval_loss, tokens=self.tokens))

    def _stop(self, step: int, signum: int) -> None:
        """SIGTERM/SIGINT arrived: make sure this step is checkpointed, then stop."""
        if self.last_checkpoint_step != step:
            self._save(step)
        name = signal.Signals(signum).name
        raise TrainingInterrupted(
            f"{name}: stopped after step {step}, checkpoint saved in "
            f"{self.checkpoints.path}; continue with the same command plus --resume",
            signum,
        )

    def _already_done(self, start: int) -> TrainResult:
        """Resuming a finished run: nothing to train; report what it ended with."""
        metrics = read_metrics(self.metrics.path)
        train, evals = metrics.train, metrics.evals
        final_loss = train[-1].loss if train else None
        return TrainResult(
            out=self.out,
            steps=start,
            tokens=self.tokens,
            final_loss=final_loss if final_loss is not None else math.nan,
            eval_loss=evals[-1].eval_loss if evals else None,
            checkpoint=self.checkpoints.latest(),
            metrics_path=self.metrics.path,
            skipped_steps=self.skipped,
            extra={"already_complete": True},
        )

    def _peak_flops_per_device(self) -> float | None:
        """Datasheet peak of this device at the run's precision; None if unknown (e.g. CPU)."""
        if self.device.type != "cuda":
            return None
        from profilers.hardware import match_device

        spec = match_device(torch.cuda.get_device_name(self.device))
        return spec.peak_flops(self.config.precision) if spec is not None else None

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilisation per device; model FLOPs exclude recompute (PaLM App. B)."""
        from profilers.flops import mfu

        flops_per_token, peak = self._mfu_terms  # set before the first step
        return mfu(tokens_per_s / self.config.world_size, flops_per_token, peak)

    def _model_flops_and_peak(self) -> tuple[float, float | None]:
        """The MFU's model FLOPs per token and the device's datasheet peak, before the first
        step (the expert count below is not a step's time). Where the peak is known and the
        model has 3-D weights (stacked experts; a Mamba convolution too), its grouped expert
        GEMMs are counted on a fake step, so a mixture of experts' FLOPs count the experts a
        token is routed to (:func:`profilers.flops.formula_flops_per_token`); the count
        failing leaves every parameter in, as for a dense model."""
        from profilers.expert_gemms import count_expert_gemms
        from profilers.flops import formula_flops_per_token

        peak = self._peak_flops_per_device()
        experts = None
        module = self.step.adapter.module
        if peak is not None and any(p.dim() == 3 for p in module.parameters()):
            try:
                experts = count_expert_gemms(self.workload, self.config.step_spec())
            except Exception:  # a utilisation metric never stops training
                experts = None
        return formula_flops_per_token(self.facts, self.config.seq_len, experts), peak


def _device_type(name: str) -> str:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return "cuda"
    return "cpu"


def train(config: TrainConfig, options: RunOptions) -> TrainResult:
    """Train ``config`` as ``options`` say; the one public entry of the trainer."""
    try:
        return Trainer(config, options).run()
    except Exception as exc:
        # A model dynamo/inductor cannot compile fails in its first step: one line, not a trace.
        problem = compile_problem(config.model, exc) if config.compile else None
        if problem is None:
            raise
        raise problem from None
    finally:
        shutdown_distributed()
