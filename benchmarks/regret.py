"""Regret of ``advisor recommend``: its advised config against an exhaustive, measured grid.

For each model, on this machine, at one global batch and sequence length:

1. **Advisor, as a user runs it.** ``advisor profile`` (default settings) then ``advisor recommend
   --global-batch-size G --world-size W`` (default validation), both through the real CLI in
   subprocesses, timed end to end (interpreter start-up included).
2. **The exhaustive grid.** Every candidate of the search space that ``recommend`` considers,
   built with the same ``strategies.space.build_space`` from the profile (precision the device
   runs x checkpointing none/full x every micro-batch x accumulation split x single, ddp x W,
   fsdp x W), measured for real with the building blocks of recommend's own validators:

   * single-device configs: an isolated child (``profilers.isolate.run_isolated``, the
     LocalValidator's isolation) measures the allocator's peak over one real step
     (``measure_cpu_step_memory``, first round only) and then times steps with the probes'
     ``StepTimer`` (synthetic batches, warm-up discarded);
   * ddp/fsdp configs: a short ``advisor train`` under torchrun through
     ``advisor.validation.LauncherValidator`` itself (median ``step_time_s`` after the warm-up,
     largest rank's resident peak).

   The grid runs in rounds; each round visits every config once, in a fresh seeded order, so
   slow drift of a shared host spreads over all configs; a config's throughput is the median
   of all its timed steps over the rounds. Slow configs are bounded by a per-config time
   budget, not a fixed step count: each visit takes timed steps until ``--config-budget-s``
   seconds of them are spent (at least ``--min-steps``, at most ``--max-steps``; one warm-up
   step instead of two when a step alone eats half the budget). fp16 autocast is ~20x slower
   than fp32 on this CPU, so a fixed count would let 20 of the 60 configs dominate the wall
   time. Distributed visits size their step count in advance (torchrun runs a fixed number)
   from the config's own earlier visits, else the single-device steps of the same precision and
   checkpointing (never from the cost model under test), else ``--min-steps``.
3. **Report.** Measured tokens/s of the advised config / the grid's best (target >= 0.97);
   advisor wall time (profile included) / the grid's wall time (target <= 0.10); the advised
   config's measured memory against the budget; and the cost model (``advisor.recommend.predict``,
   the library behind ``advisor predict``) against every measured grid config, most of which
   no probe ran: median and max relative error of step time and memory, per layout.

Robustness: a failed visit is recorded (status and reason), never fatal; every finished visit
is appended to ``PREFIX_work/units.jsonl`` and the results files are rewritten after each, so a
kill loses at most the visit in flight; ``--resume`` continues from the log (the advisor phase
of a model is kept once it finished).

Run ``python benchmarks/regret.py`` (full: gpt-tiny and llama-tiny, 3 rounds; hours on 2 vCPUs,
see benchmarks/README.md) or ``--quick`` (a shrunken gpt-tiny, a 40 s profile, 1 round over a
handful of configs; ~3 min; results go to a temporary directory unless ``--out`` is given).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profilers.defaults import DEFAULT_MEMORY_BUDGET
from profilers.rundir import RunDir
from strategies.commands import Command
from strategies.config import DEFAULT_DATA
from strategies.space import KNOBS

if TYPE_CHECKING:
    from profilers.profile_record import Profile
    from profilers.workload import StepSpec
    from strategies.config import TrainConfig
    from strategies.plan import Plan
    from strategies.space import Candidate

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PREFIX = REPO / "benchmarks" / "results" / "regret"
THROUGHPUT_TARGET = 0.97  # advised measured tokens/s over the grid's best
WALL_TARGET = 0.10  # advisor wall time (profile + recommend) over the grid's
# Refinement visits are logged as rounds 1000, 1001 ... so that a resume with more --rounds
# never mistakes one for a grid round's visit.
REFINE_ROUND_BASE = 1000
DEFAULT_MODELS = ("gpt-tiny", "llama-tiny")
QUICK_MODEL_ARGS = {"n_layer": 2, "n_embd": 64, "n_head": 2}
LAYOUTS = ("single", "ddp", "fsdp")
GiB = 2**30


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the benchmark measures and how hard; stored with the work log so a resume matches."""

    models: tuple[str, ...]
    model_args: Mapping[str, Any] = field(default_factory=dict)
    global_batch_size: int = 8
    seq_len: int = 128
    world_size: int = 2
    memory_budget: float = DEFAULT_MEMORY_BUDGET  # recommend's default --memory-budget
    rounds: int = 3
    refine_rounds: int = 6  # extra visits of the configs near the grid's best (and the advised)
    refine_margin: float = 0.10
    config_budget_s: float = 10.0  # timed seconds per config per round
    warmup: int = 2
    min_steps: int = 2
    max_steps: int = 10
    profile_budget_s: float | None = None  # None: advisor profile's default
    threads: int | None = None  # None: what recommend's validators use (torch's default)
    quick: bool = False
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["models"] = list(self.models)
        out["model_args"] = dict(self.model_args)
        return out

    def identity(self) -> dict[str, Any]:
        """The keys a resumed run must share with the log it continues."""
        keep = (
            *("model_args", "global_batch_size", "seq_len", "world_size", "memory_budget"),
            *("config_budget_s", "warmup", "min_steps", "max_steps", "threads", "quick"),
        )
        return {k: v for k, v in self.to_dict().items() if k in keep}


def model_label(model: str, model_args: Mapping[str, Any]) -> str:
    args = ",".join(f"{k}={v}" for k, v in sorted(model_args.items()))
    return f"{model}[{args}]" if args else model


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


# -- child: one visit of a single-device config ---------------------------------------------------


def measure_single(
    workload_args: Mapping[str, Any],
    spec: StepSpec,
    *,
    with_memory: bool,
    warmup: int,
    budget_s: float,
    min_steps: int,
    max_steps: int,
) -> dict[str, Any]:
    """Runs in an isolated child: the allocator's peak (optional), then budget-bounded timed steps.

    The pieces are LocalValidator's (``advisor.validation.measure_configs``): the trainer's own
    step through AdvisorWorkload on synthetic batches, ``measure_cpu_step_memory`` for the peak,
    ``StepTimer`` for the steps. Only the step count differs: timed steps continue while the
    next one (estimated by the median so far) still fits ``budget_s``.
    """
    from typing import cast

    from advisor.workload import AdvisorWorkload
    from profilers.isolate import quiet_native_output
    from profilers.memory import measure_cpu_step_memory
    from profilers.throughput import StepTimer
    from profilers.workload import Workload

    workload = cast(
        "Workload",
        AdvisorWorkload(
            model=workload_args["model"],
            model_args=dict(workload_args["model_args"]),
            data="synthetic",
            tokenizer=None,
        ),
    )
    out: dict[str, Any] = {}
    if with_memory:
        started = time.perf_counter()
        with quiet_native_output():
            memory = measure_cpu_step_memory(workload, spec)
        out["peak_memory_bytes"] = memory.peak_bytes
        out["memory_s"] = time.perf_counter() - started
    with StepTimer(workload, spec, "cpu") as timer:
        for i in range(warmup):
            t0 = time.perf_counter()
            timer.warm_up(1)
            if i == 0 and time.perf_counter() - t0 > budget_s / 2:
                break  # a slow config: one warm-up step, the budget goes to timed steps
        spent: list[float] = []
        while len(spent) < max_steps:
            if len(spent) >= min_steps and sum(spent) + statistics.median(spent) > budget_s:
                break
            fb, opt = timer.sample()
            spent.append(fb + opt)
        timing = timer.timing()
    out.update(
        step_s=list(timing.step_s),
        forward_backward_s=list(timing.forward_backward_s),
        optimizer_s=list(timing.optimizer_s),
        num_warmup=timing.num_warmup,
    )
    return out


# -- the work log ---------------------------------------------------------------------------------


class WorkLog:
    """``units.jsonl``: one line per finished grid visit, appended and fsynced as it ends."""

    def __init__(self, path: Path, *, retry_failed: bool = False) -> None:
        self.path, self.retry_failed = path, retry_failed
        self.units: list[dict[str, Any]] = []
        if path.exists():
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):  # a line cut by a kill
                    self.units.append(json.loads(line))

    def done(self, model: str, round_index: int, key: str) -> bool:
        """Visited in that round (a failed visit counts, unless failures are to be retried)."""
        return any(
            (u["model"], u["round"], u["key"]) == (model, round_index, key)
            and (u["status"] == "ok" or not self.retry_failed)
            for u in self.units
        )

    def of(self, model: str) -> list[dict[str, Any]]:
        return [u for u in self.units if u["model"] == model]

    def append(self, unit: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(unit) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.units.append(unit)


# -- phase 1: advisor profile + recommend, as a user runs them ---------------------------------


def _run_cli(args: Sequence[str], log: Path) -> tuple[int, float]:
    """``python -m advisor ARGS`` with output to ``log``; (exit code, wall seconds). Interrupted,
    the command gets SIGTERM first, so it can stop the probes it started."""
    started = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "advisor", *args], stdout=f, stderr=f)
        try:
            code = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    return code, time.perf_counter() - started


def _tail(log: Path, lines: int = 3) -> str:
    text = log.read_text().strip().splitlines() if log.exists() else []
    return " | ".join(text[-lines:])[-400:]


def run_advisor(model: str, settings: Settings, workdir: Path) -> dict[str, Any]:
    """Profile and recommend into ``workdir`` (kept once finished: a resume reuses it)."""
    record_path = workdir / "advisor.json"
    if record_path.exists():
        earlier = dict(json.loads(record_path.read_text()))
        if earlier.get("recommend_status") == "ok":
            return earlier  # a failed phase is redone on resume
    if workdir.exists():
        shutil.rmtree(workdir)  # a half-finished phase from a killed run: redo it whole
    workdir.mkdir(parents=True)
    run_dir = workdir / "run"
    profile_cmd = (
        Command("profile")
        .model(model, settings.model_args)
        .option("seq_len", settings.seq_len)
        .option("out", run_dir)
        .switch("quiet", True)
        .option("budget_s", settings.profile_budget_s)
    )
    recommend_cmd = (
        Command("recommend")
        .option("profile", run_dir)
        .option("global_batch_size", settings.global_batch_size)
        .option("world_size", settings.world_size)
        .option("out", run_dir)
        .switch("quiet", True)
        .option("memory_budget", settings.memory_budget, default=DEFAULT_MEMORY_BUDGET)
    )
    record: dict[str, Any] = {
        "profile_command": profile_cmd.shell(),
        "recommend_command": recommend_cmd.shell(),
        "loadavg_start": list(os.getloadavg()),
        "run_dir": str(run_dir),
    }
    _say(f"[{model}] advisor profile ...")
    code, record["profile_s"] = _run_cli(profile_cmd.args(), workdir / "profile.log")
    record["profile_status"] = (
        "ok" if code == 0 else f"exit {code}: {_tail(workdir / 'profile.log')}"
    )
    if code == 0:
        _say(f"[{model}] profiled in {record['profile_s']:.0f} s; advisor recommend ...")
        code, record["recommend_s"] = _run_cli(recommend_cmd.args(), workdir / "recommend.log")
        record["recommend_status"] = (
            "ok" if code == 0 else f"exit {code}: {_tail(workdir / 'recommend.log')}"
        )
        record["advisor_s"] = record["profile_s"] + record["recommend_s"]
        _say(
            f"[{model}] recommended in {record['recommend_s']:.0f} s ({record['recommend_status']})"
        )
    else:
        _say(f"[{model}] advisor profile failed: {record['profile_status']}")
    record["loadavg_end"] = list(os.getloadavg())
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def load_profile_and_plan(record: Mapping[str, Any]) -> tuple[Profile | None, Plan | None]:
    from profilers.profile_record import load_profile
    from strategies.plan import Plan

    run_dir = RunDir(Path(record["run_dir"]))
    profile = plan = None
    if record.get("profile_status") == "ok":
        profile = load_profile(run_dir.profile)
    if record.get("recommend_status") == "ok":
        plan = Plan.from_dict(json.loads(run_dir.plan.read_text()))
    return profile, plan


# -- phase 2: the grid ------------------------------------------------------------------------


def base_config(model: str, settings: Settings) -> TrainConfig:
    """What every candidate shares: the fields advisor.recommend.base_config takes from the
    profile's workload (model, args, data, seq_len) and the request's global batch. Built from
    the settings, not the profile, since the grid also runs when the profile failed; the data
    is ``advisor profile``'s default, which the profile ran on."""
    from strategies.config import TrainConfig

    return TrainConfig(
        model=model,
        model_args=dict(settings.model_args),
        data=DEFAULT_DATA,
        seq_len=settings.seq_len,
        global_batch_size=settings.global_batch_size,
        micro_batch_size=settings.global_batch_size,
    )


def grid_candidates(profile: Profile | None, settings: Settings) -> tuple[list[Candidate], str]:
    """(every candidate recommend considers, where the list came from).

    With a profile: ``build_space`` exactly as ``recommend`` calls it. Without one (the profile
    failed) the product of every precision, checkpointing and layout, i.e. the same space on a
    device that runs all three precisions.
    """
    from profilers.workload import CHECKPOINTING, PRECISIONS
    from strategies.space import SearchRequest, SearchSpace, build_space, layouts_for

    request = SearchRequest(
        global_batch_size=settings.global_batch_size,
        memory_budget=settings.memory_budget,
        world_size=settings.world_size,
    )
    if profile is not None:
        return build_space(profile, request).candidates(), "strategies.space.build_space"
    space = SearchSpace(
        global_batch_size=settings.global_batch_size,
        precisions=PRECISIONS,
        checkpointing=CHECKPOINTING,
        layouts=layouts_for(settings.global_batch_size, range(1, settings.world_size + 1)),
    )
    return space.candidates(), "every precision x checkpointing x layout (no profile)"


def quick_subset(candidates: Sequence[Candidate], advised: str | None) -> list[Candidate]:
    """--quick: fp32 at the largest micro-batch on every layout, fp32 2 x accumulation and bf16
    on one device, and the advised config wherever it is."""

    def wanted(c: Candidate) -> bool:
        if c.key == advised:
            return True
        if c.activation_checkpointing != "none":
            return False
        per_rank = c.global_batch_size // c.world_size
        if c.precision == "fp32":
            return c.micro_batch_size == per_rank or (
                c.parallelism == "single" and c.micro_batch_size == 2
            )
        return c.precision == "bf16" and c.parallelism == "single" and c.grad_accum_steps == 1

    return [c for c in candidates if wanted(c)]


def round_order(candidates: Sequence[Candidate], round_index: int, seed: int) -> list[Candidate]:
    """A fresh seeded order each round (drift spreads over every config). In the first round the
    single-device configs go first: their step times size the distributed visits."""
    order = list(candidates)
    random.Random(f"{seed}-{round_index}").shuffle(order)
    if round_index == 0:
        order.sort(key=lambda c: c.parallelism != "single")  # stable: keeps the shuffle
    return order


def estimate_step_s(
    candidate: Candidate, units: Sequence[dict[str, Any]]
) -> tuple[float | None, str]:
    """A step-time guess that only sizes a distributed visit (step count, timeout). Never the
    cost model's: the grid must not lean on what it is there to check."""
    own = [s for u in units if u["key"] == candidate.key for s in u.get("step_s") or ()]
    if own:
        return statistics.median(own), "its earlier visits"
    same = [
        s
        for u in units
        if u["layout"] == "single"
        and (u["precision"], u["activation_checkpointing"])
        == (candidate.precision, candidate.activation_checkpointing)
        for s in u.get("step_s") or ()
    ]
    if same:
        # Two ranks with one thread each on this host's cores, plus communication.
        return 1.5 * statistics.median(same), "single-device steps of its precision"
    return None, "nothing: min-steps timed steps after one warm-up step"


def visit(
    model: str,
    candidate: Candidate,
    config: TrainConfig,
    round_index: int,
    *,
    with_memory: bool,
    estimate_s: float | None,
    settings: Settings,
) -> dict[str, Any]:
    """Measure one config once; a failure is a status and a reason, never an exception."""
    unit: dict[str, Any] = {
        "model": model,
        "round": round_index,
        "key": candidate.key,
        "layout": candidate.parallelism,
        "precision": candidate.precision,
        "activation_checkpointing": candidate.activation_checkpointing,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg": list(os.getloadavg()),
        "estimate_s": estimate_s,
    }
    started = time.perf_counter()
    try:
        if candidate.parallelism == "single":
            unit.update(_visit_single(config, with_memory=with_memory, settings=settings))
        else:
            unit.update(_visit_launcher(config, estimate_s, settings=settings))
    except Exception as exc:  # a bug in a visit costs that visit, not the grid
        unit.update(status="error", reason=f"{type(exc).__name__}: {exc}"[:300])
    unit["wall_s"] = time.perf_counter() - started
    return unit


def _visit_single(config: TrainConfig, *, with_memory: bool, settings: Settings) -> dict[str, Any]:
    from profilers.isolate import Isolation, run_isolated

    # Start-up (spawn, import torch, build) + the memory pass + warm-up + the budget; a single
    # step can exceed the budget (min_steps), so the limit is generous: it only catches hangs.
    timeout = 300.0 + 10 * settings.config_budget_s * (settings.min_steps + settings.warmup + 2)
    outcome = run_isolated(
        Isolation(timeout_s=timeout, num_threads=settings.threads),
        measure_single,
        {"model": config.model, "model_args": dict(config.model_args)},
        config.step_spec(),
        with_memory=with_memory,
        warmup=settings.warmup,
        budget_s=settings.config_budget_s,
        min_steps=settings.min_steps,
        max_steps=settings.max_steps,
    )
    out: dict[str, Any] = {"validator": "local (isolated child)", "process_s": outcome.wall_s}
    if not outcome.ok:
        return {**out, "status": outcome.status, "reason": outcome.reason}
    value = dict(outcome.value)
    if "peak_memory_bytes" in value:
        value["memory_kind"] = "cpu: allocator peak (torch.profiler), process overhead excluded"
    return {**out, "status": "ok", "reason": "", **value}


def _visit_launcher(
    config: TrainConfig, estimate_s: float | None, *, settings: Settings
) -> dict[str, Any]:
    from advisor.validation import LauncherValidator
    from strategies.prediction import Prediction

    budget = settings.config_budget_s
    if estimate_s is None:
        warmup, steps, timeout_step_s = 1, settings.min_steps, 60.0
    else:
        warmup = settings.warmup if estimate_s * 2 <= budget else 1
        steps = max(settings.min_steps, min(settings.max_steps, math.floor(budget / estimate_s)))
        # The guess can be off by a few x on a busy host; the timeout only catches hangs.
        timeout_step_s = max(3 * estimate_s, 10.0)
    validator = LauncherValidator(
        device="cpu",
        max_world_size=config.world_size,
        fixed_overhead_bytes=0,  # raw resident peak here; the profiled overhead comes off later
        warmup=warmup,
        rounds=steps,
    )
    # LauncherValidator sizes its timeout from the prediction's step time; nothing else is read.
    sizing = Prediction(
        peak_memory_bytes=0,
        budgeted_bytes=0,
        budget_bytes=0,
        step_time_s=timeout_step_s,
        tokens_per_s=0.0,
    )
    measured = validator.validate([config], [sizing])[0]
    out: dict[str, Any] = {
        "validator": "advisor.validation.LauncherValidator (advisor train under torchrun)",
        "status": measured.status,
        "reason": measured.reason,
        "num_warmup": warmup,
        "planned_steps": steps,
        "process_s": measured.wall_s,
    }
    if measured.ok:
        out.update(
            step_s=list(measured.step_samples_s),
            peak_memory_bytes=measured.peak_memory_bytes,
            memory_kind="cpu: largest rank's resident peak (VmHWM), process overhead included",
        )
    return out


def predictions_by_key(
    profile: Profile | None, model: str, candidates: Sequence[Candidate], settings: Settings
) -> dict[str, dict[str, Any]]:
    """``advisor.recommend.predict`` (the library behind ``advisor predict``) for every config:
    ``{"predicted": ...}`` or ``{"error": reason}``."""
    if profile is None:
        return {}
    from advisor.recommend import predict
    from strategies.errors import StrategyError

    base = base_config(model, settings)
    out: dict[str, dict[str, Any]] = {}
    for c in candidates:
        try:
            out[c.key] = predict(profile, c.apply(base), memory_budget=settings.memory_budget)
        except StrategyError as exc:  # Unpredictable: the profile lacks what this config needs
            out[c.key] = {"error": str(exc)[:300]}
    return out


def run_grid(
    model: str,
    candidates: Sequence[Candidate],
    settings: Settings,
    log: WorkLog,
    on_unit: Callable[[], None],
) -> None:
    """Every round, every config not yet visited in it; ``on_unit`` after each visit."""
    base = base_config(model, settings)
    total = len(candidates)
    for r in range(settings.rounds):
        for i, c in enumerate(round_order(candidates, r, settings.seed)):
            if log.done(model, r, c.key):
                continue
            with_memory = c.parallelism == "single" and not any(
                u["key"] == c.key and u.get("peak_memory_bytes") is not None for u in log.of(model)
            )
            unit = _logged_visit(model, c, base, r, log, with_memory=with_memory, settings=settings)
            _say(f"[{model} round {r + 1}/{settings.rounds} {i + 1}/{total}] {_unit_line(unit)}")
            on_unit()


def _logged_visit(
    model: str,
    candidate: Candidate,
    base: TrainConfig,
    round_index: int,
    log: WorkLog,
    *,
    with_memory: bool,
    settings: Settings,
    refine: bool = False,
) -> dict[str, Any]:
    """One visit (a distributed one sized from the log's earlier visits), appended to the log."""
    estimate, source = (None, "")
    if candidate.parallelism != "single":
        estimate, source = estimate_step_s(candidate, log.of(model))
    unit = visit(
        model,
        candidate,
        candidate.apply(base),
        round_index,
        with_memory=with_memory,
        estimate_s=estimate,
        settings=settings,
    )
    unit["estimate_source"] = source
    if refine:
        unit["refine"] = True
    log.append(unit)
    return unit


def pooled_tokens_per_s(
    units: Sequence[Mapping[str, Any]], settings: Settings, *, grid_only: bool = False
) -> dict[str, float]:
    """Each config's throughput: global tokens over the median of all its timed steps (of the
    grid rounds only, with ``grid_only``)."""
    samples: dict[str, list[float]] = {}
    for u in units:
        if u["status"] != "ok" or not u.get("step_s"):
            continue
        if grid_only and u.get("refine"):
            continue
        samples.setdefault(u["key"], []).extend(u["step_s"])
    tokens = settings.global_batch_size * settings.seq_len
    return {k: tokens / statistics.median(v) for k, v in samples.items()}


def refine_set(
    candidates: Sequence[Candidate],
    units: Sequence[Mapping[str, Any]],
    settings: Settings,
    advised: str | None,
) -> list[Candidate]:
    """The configs the refinement visits: within ``refine_margin`` of the grid rounds' best,
    and the advised one. Decided from the grid rounds alone, so a resumed refinement visits the
    same set."""
    tps = pooled_tokens_per_s(units, settings, grid_only=True)
    if not tps:
        return []
    best = max(tps.values())
    near = {k for k, t in tps.items() if t >= (1 - settings.refine_margin) * best}
    if advised is not None:
        near.add(advised)
    return [c for c in candidates if c.key in near]


def run_refinement(
    model: str,
    candidates: Sequence[Candidate],
    settings: Settings,
    log: WorkLog,
    on_unit: Callable[[], None],
    advised: str | None,
) -> None:
    """``refine_rounds`` more visits of the configs near the best (rounds REFINE_ROUND_BASE
    and up): one round's visit reads the host's moment as much as the config (the grid's own
    three rounds each put a different config first), and a target of 3% needs a reference
    tighter than that. Wall time is reported apart from the grid's: an exhaustive search would
    not include it."""
    if not settings.refine_rounds:
        return
    chosen = refine_set(candidates, log.of(model), settings, advised)
    if len(chosen) < 2:
        return
    base = base_config(model, settings)
    _say(
        f"[{model}] refinement: {len(chosen)} configs within {settings.refine_margin:.0%} of the "
        f"grid's best (or advised) x {settings.refine_rounds} more visits"
    )
    for k in range(settings.refine_rounds):
        r = REFINE_ROUND_BASE + k
        for i, c in enumerate(round_order(chosen, r, settings.seed)):
            if log.done(model, r, c.key):
                continue
            unit = _logged_visit(
                model, c, base, r, log, with_memory=False, settings=settings, refine=True
            )
            _say(
                f"[{model} refine {k + 1}/{settings.refine_rounds} {i + 1}/{len(chosen)}] "
                f"{_unit_line(unit)}"
            )
            on_unit()


def _unit_line(unit: Mapping[str, Any]) -> str:
    head = f"{unit['key']}: "
    if unit["status"] != "ok":
        return head + f"{unit['status']} ({unit.get('reason', '')}) in {unit['wall_s']:.0f} s"
    steps = unit["step_s"]
    text = f"median step {statistics.median(steps):.3f} s over {len(steps)} steps"
    if unit.get("peak_memory_bytes") is not None:
        text += f", peak {unit['peak_memory_bytes'] / 2**20:,.0f} MiB"
    return head + text + f", {unit['wall_s']:.0f} s"


# -- phase 3: analysis ---------------------------------------------------------------------------


def _rel_stats(errors: Sequence[float]) -> dict[str, Any]:
    if not errors:
        return {"n": 0, "median_abs": None, "max_abs": None, "median": None}
    return {
        "n": len(errors),
        "median_abs": statistics.median(abs(e) for e in errors),
        "max_abs": max(abs(e) for e in errors),
        "median": statistics.median(errors),
    }


def grid_rows(
    model: str,
    candidates: Sequence[Candidate],
    units: Sequence[dict[str, Any]],
    profile: Profile | None,
    plan: Plan | None,
    predictions: Mapping[str, Mapping[str, Any]],
    settings: Settings,
) -> list[dict[str, Any]]:
    """One row per grid config: what was measured, what the cost model predicts, their errors."""
    from strategies.plan import Measurement, Validation
    from strategies.prediction import Prediction

    fixed = profile.memory_overhead.fixed_bytes if profile is not None else 0
    rank_extra = dict(profile.memory_overhead.parallel_bytes) if profile is not None else {}

    # (layout, precision, checkpointing, micro-batch) the throughput probe timed: the fit passes
    # through those points; every other config is an interpolation or an extrapolation of it.
    def point(k: Any) -> str:  # a StepSpec or a Candidate
        layout = f"{k.parallelism}{k.world_size}"
        return f"{k.precision}/{k.activation_checkpointing}/{layout}/mb{k.micro_batch_size}"

    probed = {point(t.spec) for t in (profile.throughput if profile is not None else ())}
    validated = {v.candidate.key: v.measured for v in plan.validated} if plan else {}
    advised = plan.candidate.key if plan else None
    tokens = settings.global_batch_size * settings.seq_len
    rows = []
    for c in candidates:
        mine = sorted((u for u in units if u["key"] == c.key), key=lambda u: u["round"])
        ok = [u for u in mine if u["status"] == "ok" and u.get("step_s")]
        samples = [s for u in ok for s in u["step_s"]]
        raw_peaks = [u["peak_memory_bytes"] for u in mine if u.get("peak_memory_bytes") is not None]
        row: dict[str, Any] = {
            "model": model,
            "key": c.key,
            **c.to_dict(),
            "layout": c.parallelism,
            "visits": len(mine),
            "visits_ok": len(ok),
            "status": "ok" if samples else (mine[-1]["status"] if mine else "pending"),
            "reason": "" if samples or not mine else mine[-1].get("reason", ""),
            "timed_steps": len(samples),
            "step_time_s": statistics.median(samples) if samples else None,
            "tokens_per_s": tokens / statistics.median(samples) if samples else None,
            "round_tokens_per_s": [tokens / statistics.median(u["step_s"]) for u in ok],
            "raw_peak_memory_bytes": max(raw_peaks) if raw_peaks else None,
            "visits_wall_s": sum(u["wall_s"] for u in mine),
            "probed_time": point(c) in probed,
            "validated_by_recommend": c.key in validated,
            "recommend_measured_tokens_per_s": (
                validated[c.key].tokens_per_s if c.key in validated else None
            ),
            "advised": c.key == advised,
        }
        # Like for like with the traced peak (Validation.memory_error): the allocator's peak on
        # one device; a rank's resident peak minus the profiled per-process and per-rank
        # overheads, as LauncherValidator reports it. In the budget's terms
        # (Prediction.budgeted_bytes): the overheads included, every rank of a CPU host counted.
        peak = row["raw_peak_memory_bytes"]
        if peak is not None:
            single = c.parallelism == "single"
            overhead = fixed + rank_extra.get(c.parallelism, 0)
            row["peak_memory_bytes"] = peak if single else max(0, peak - overhead)
            row["budgeted_bytes"] = (peak + fixed) if single else peak * c.world_size
        else:
            row["peak_memory_bytes"] = row["budgeted_bytes"] = None
        pred = predictions.get(c.key, {})
        row["prediction_error"] = pred.get("error", "" if pred else "no profile")
        if "predicted" in pred:
            p = Prediction.from_dict(pred["predicted"])
            row.update(
                predicted_step_time_s=p.step_time_s,
                predicted_tokens_per_s=p.tokens_per_s,
                predicted_peak_memory_bytes=p.peak_memory_bytes,
                predicted_traced_bytes=p.traced_bytes,
                predicted_budgeted_bytes=p.budgeted_bytes,
                budget_bytes=p.budget_bytes,
                predicted_fits=p.fits,
                compute_source=p.breakdown.time.compute_source if p.breakdown.time else "",
            )
            measured = Measurement(
                status="ok" if samples else "error",
                step_time_s=row["step_time_s"],
                tokens_per_s=row["tokens_per_s"],
                peak_memory_bytes=row["peak_memory_bytes"],
            )
            v = Validation(candidate=c, predicted=p, measured=measured)
            row["time_error"] = v.time_error if samples else None
            row["memory_error"] = v.memory_error if row["peak_memory_bytes"] else None
        rows.append(row)
    return rows


def summarize(
    rows: Sequence[dict[str, Any]],
    advisor: Mapping[str, Any],
    units: Sequence[dict[str, Any]],
    settings: Settings,
) -> dict[str, Any]:
    ok = [r for r in rows if r["tokens_per_s"] is not None]
    budget = next((r["budget_bytes"] for r in rows if r.get("budget_bytes")), None)
    eligible = [r for r in ok if budget is None or (r["budgeted_bytes"] or 0) <= budget]
    ranked = sorted(eligible, key=lambda r: -r["tokens_per_s"])
    best = ranked[0] if ranked else None
    advised = next((r for r in rows if r["advised"]), None)
    out: dict[str, Any] = {
        "configs": len(rows),
        "configs_measured": len(ok),
        "configs_failed": [
            {"key": r["key"], "status": r["status"], "reason": r["reason"]}
            for r in rows
            if r["status"] not in ("ok", "pending")
        ],
        "configs_pending": sum(r["status"] == "pending" for r in rows),
        "best": {"key": best["key"], "tokens_per_s": best["tokens_per_s"]} if best else None,
        "top": [{"key": r["key"], "tokens_per_s": r["tokens_per_s"]} for r in ranked[:10]],
    }
    ratio = None
    if advised is not None and advised["tokens_per_s"] is not None and best is not None:
        ratio = advised["tokens_per_s"] / best["tokens_per_s"]
    out["advised"] = None
    if advised is not None:
        out["advised"] = {
            "key": advised["key"],
            "tokens_per_s": advised["tokens_per_s"],
            "round_tokens_per_s": advised["round_tokens_per_s"],
            "rank": next((i + 1 for i, r in enumerate(ranked) if r["key"] == advised["key"]), None),
            "recommend_measured_tokens_per_s": advised["recommend_measured_tokens_per_s"],
            "predicted_tokens_per_s": advised.get("predicted_tokens_per_s"),
            "budgeted_bytes": advised["budgeted_bytes"],
            "budget_bytes": budget,
            "within_budget": (
                None
                if advised["budgeted_bytes"] is None or budget is None
                else advised["budgeted_bytes"] <= budget
            ),
        }
    out["throughput_ratio"] = ratio
    out["meets_throughput_target"] = None if ratio is None else ratio >= THROUGHPUT_TARGET
    # The same ratio from the grid rounds alone (before the refinement visits), for comparison.
    grid_tps = pooled_tokens_per_s(units, settings, grid_only=True)
    eligible_keys = {r["key"] for r in eligible}
    grid_best = max((t for k, t in grid_tps.items() if k in eligible_keys), default=None)
    out["throughput_ratio_grid_rounds"] = (
        grid_tps[advised["key"]] / grid_best
        if advised is not None and advised["key"] in grid_tps and grid_best
        else None
    )
    refined = [u for u in units if u.get("refine")]
    out["refined_configs"] = sorted({u["key"] for u in refined})
    out["refine_wall_s"] = sum(u["wall_s"] for u in refined)
    # Grid wall = every visit from spawn to reap (start-up, memory pass, warm-up, timed steps,
    # teardown): what measuring the space costs, whatever runs were interrupted and resumed.
    rounds: dict[int, float] = {}
    for u in units:
        if not u.get("refine"):  # refinement visits are not part of the search's cost
            rounds[u["round"]] = rounds.get(u["round"], 0.0) + u["wall_s"]
    grid_s = sum(rounds.values())
    out["grid_wall_s"] = grid_s
    out["grid_round_wall_s"] = [rounds[k] for k in sorted(rounds)]
    advisor_s = advisor.get("advisor_s")
    out["advisor_s"] = advisor_s
    out["wall_ratio"] = advisor_s / grid_s if advisor_s and grid_s else None
    first = rounds.get(0)
    # The cheapest exhaustive search by this method is one round (with the memory pass).
    out["wall_ratio_one_round"] = advisor_s / first if advisor_s and first else None
    out["meets_wall_target"] = (
        None if out["wall_ratio"] is None else out["wall_ratio"] <= WALL_TARGET
    )
    out["loadavg_range"] = (
        [min(u["loadavg"][0] for u in units), max(u["loadavg"][0] for u in units)]
        if units
        else None
    )
    errors: dict[str, Any] = {}
    for group in (*LAYOUTS, "all"):
        members = [r for r in rows if group in ("all", r["layout"])]
        unprobed = [r for r in members if not r["probed_time"]]
        errors[group] = {
            "time": _rel_stats(
                [r["time_error"] for r in members if r.get("time_error") is not None]
            ),
            "memory": _rel_stats(
                [r["memory_error"] for r in members if r.get("memory_error") is not None]
            ),
            "time_unprobed": _rel_stats(
                [r["time_error"] for r in unprobed if r.get("time_error") is not None]
            ),
            "unpredictable": sum(bool(r["prediction_error"]) for r in members),
        }
    out["prediction_errors"] = errors
    return out


# -- output -------------------------------------------------------------------------------------

CSV_COLUMNS = (
    "model",
    "key",
    *(k for k in KNOBS if k != "num_workers"),  # never a column: 0 on a CPU host
    "status",
    "reason",
    "visits",
    "visits_ok",
    "timed_steps",
    "step_time_s",
    "tokens_per_s",
    "round_tokens_per_s",
    "raw_peak_memory_bytes",
    "peak_memory_bytes",
    "budgeted_bytes",
    "budget_bytes",
    "predicted_step_time_s",
    "predicted_tokens_per_s",
    "predicted_peak_memory_bytes",
    "predicted_traced_bytes",
    "predicted_budgeted_bytes",
    "predicted_fits",
    "time_error",
    "memory_error",
    "prediction_error",
    "compute_source",
    "probed_time",
    "validated_by_recommend",
    "recommend_measured_tokens_per_s",
    "advised",
    "visits_wall_s",
)


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{100 * value:+.0f}%" if signed else f"{100 * value:.0f}%"


def _tps(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _yes(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "NO")


def _work_s(results: Mapping[str, Any]) -> float:
    """Seconds of measuring behind the results, across resumed invocations."""
    return sum(
        (m["summary"]["advisor_s"] or 0) + m["summary"]["grid_wall_s"]
        for m in results["models"]
        if "summary" in m
    )


def render_markdown(results: Mapping[str, Any]) -> str:
    done = [m for m in results["models"] if "summary" in m]
    lines = [
        "| model | configs measured | advised (rank) | advised tok/s | grid best | best tok/s | "
        f"ratio (≥ {THROUGHPUT_TARGET}) | advisor s (profile + recommend) | grid s (1st round) "
        f"| wall ratio (≤ {WALL_TARGET}) | advised memory / budget |",
        "|" + "---|" * 11,
    ]
    for m in done:
        s = m["summary"]
        a, best = s["advised"] or {}, s["best"] or {}
        adv = m["advisor"]
        advisor_s = (
            f"{s['advisor_s']:.0f} ({adv['profile_s']:.0f} + {adv['recommend_s']:.0f})"
            if s["advisor_s"]
            else adv.get("recommend_status") or adv.get("profile_status", "–")
        )
        first = s["grid_round_wall_s"][0] if s["grid_round_wall_s"] else None
        memory = "–"
        if a.get("budgeted_bytes") is not None and a.get("budget_bytes"):
            memory = (
                f"{a['budgeted_bytes'] / GiB:.2f} / {a['budget_bytes'] / GiB:.1f} GiB "
                f"({_yes(a['within_budget'])})"
            )
        lines.append(
            f"| {m['label']} | {s['configs_measured']}/{s['configs']} | "
            f"{a.get('key', '–')} ({a.get('rank') or '–'}) | {_tps(a.get('tokens_per_s'))} | "
            f"{best.get('key', '–')} | {_tps(best.get('tokens_per_s'))} | "
            f"**{'–' if s['throughput_ratio'] is None else format(s['throughput_ratio'], '.3f')}**"
            f" ({_yes(s['meets_throughput_target'])}) | {advisor_s} | {s['grid_wall_s']:.0f} "
            f"({'–' if first is None else format(first, '.0f')}) | "
            f"**{'–' if s['wall_ratio'] is None else format(s['wall_ratio'], '.3f')}** "
            f"({_yes(s['meets_wall_target'])}) | {memory} |"
        )
    for m in done:
        s = m["summary"]
        if s.get("refined_configs"):
            before = s.get("throughput_ratio_grid_rounds")
            lines.append(
                f"\n{m['label']}: the {len(s['refined_configs'])} configs within "
                f"{results['settings']['refine_margin']:.0%} of the grid's best (and the advised "
                f"one) were visited {results['settings']['refine_rounds']} more times after the "
                f"advisor ran ({s['refine_wall_s']:.0f} s, not in the grid's wall); from the grid "
                f"rounds alone the ratio is {'–' if before is None else format(before, '.3f')}."
            )
    lines += [
        "",
        "Predicted (cost model, `advisor predict`) vs measured, relative error "
        "(predicted / measured − 1): median |error| / max |error| (median signed error).",
        "",
        "| model | layout | configs | step time | step time, unprobed configs | memory | "
        "unpredictable |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in done:
        for group, e in m["summary"]["prediction_errors"].items():

            def cell(stats: Mapping[str, Any]) -> str:
                if not stats["n"]:
                    return "–"
                return (
                    f"{_pct(stats['median_abs'])} / {_pct(stats['max_abs'])} "
                    f"({_pct(stats['median'], signed=True)}, n={stats['n']})"
                )

            n = sum(1 for r in m["rows"] if group in ("all", r["layout"]))
            lines.append(
                f"| {m['label']} | {group} | {n} | {cell(e['time'])} | {cell(e['time_unprobed'])} "
                f"| {cell(e['memory'])} | {e['unpredictable']} |"
            )
    lines += ["", "Fastest measured configs (tokens/s):", ""]
    for m in done:
        top = m["summary"]["top"][:5]
        shown = ", ".join(f"{t['key']} {t['tokens_per_s']:,.0f}" for t in top) or "–"
        lines.append(f"- {m['label']}: {shown}")
        failed = m["summary"]["configs_failed"]
        if failed:
            lines.append(
                "  - failed: "
                + "; ".join(f"{f['key']} {f['status']} ({f['reason'][:80]})" for f in failed)
            )
    st, env = results["settings"], results["environment"]
    lines += [
        "",
        f"Global batch {st['global_batch_size']} × seq {st['seq_len']}, world size up to "
        f"{st['world_size']}; {st['rounds']} round(s), each config visited once per round in a "
        f"fresh seeded order; per visit timed steps until {st['config_budget_s']:g} s of them "
        f"(min {st['min_steps']}, max {st['max_steps']}) after up to {st['warmup']} warm-up steps; "
        "throughput = median over all timed steps. Memory: single = allocator peak, ddp/fsdp = "
        "largest rank's resident peak minus the profiled process overhead (like for like with "
        "the trace); budget check in the budget's terms (overhead included, every rank). "
        f"torch {env['torch']}, {env['cpu_count']} CPUs ({env['cpu']}), load average "
        f"{env['loadavg_start'][0]:.1f} at start, {(env.get('loadavg_end') or [math.nan])[0]:.1f} "
        f"at end; advisor + grid {_work_s(results) / 60:.0f} min of measuring "
        f"(this invocation {results['total_s'] / 60:.0f} min)"
        + (" (PARTIAL: still running or interrupted)" if results["partial"] else "")
        + (" (QUICK: subset of configs, shrunken model)" if results["quick"] else "")
        + ".",
    ]
    return "\n".join(lines) + "\n"


def write_outputs(prefix: Path, results: Mapping[str, Any]) -> None:
    """regret.json, regret_grid.csv and regret.md, each written atomically."""
    prefix.parent.mkdir(parents=True, exist_ok=True)

    def atomic(path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)

    atomic(prefix.with_suffix(".json"), json.dumps(results, indent=1, default=str) + "\n")
    grid = prefix.with_name(prefix.name + "_grid.csv")
    tmp = grid.with_name(grid.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for m in results["models"]:
            for row in m.get("rows", ()):
                writer.writerow(
                    {
                        k: json.dumps(v) if isinstance(v, list) else ("" if v is None else v)
                        for k, v in row.items()
                    }
                )
    tmp.replace(grid)
    atomic(
        prefix.with_suffix(".md"), "# Regret of `advisor recommend`\n\n" + render_markdown(results)
    )


def _environment() -> dict[str, Any]:
    import torch

    from profilers.device import read_cpu_info

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": read_cpu_info().model_name,
        "cpu_count": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
    }


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="Smoke run: gpt-tiny shrunken by --model-arg, 40 s profile, 1 round, ~6 configs.",
    )
    parser.add_argument(
        "--model",
        action="append",
        help=f"Model spec (repeatable; default {', '.join(DEFAULT_MODELS)}; --quick: gpt-tiny).",
    )
    parser.add_argument(
        "--model-arg",
        action="append",
        default=None,
        help="KEY=VALUE (JSON value) for every model, as advisor's --model-arg. --quick "
        f"default: {', '.join(f'{k}={v}' for k, v in QUICK_MODEL_ARGS.items())}.",
    )
    parser.add_argument("--global-batch-size", type=int, default=8, help="Sequences per step.")
    parser.add_argument("--seq-len", type=int, default=128, help="Tokens per sequence.")
    parser.add_argument("--world-size", type=int, default=2, help="recommend's --world-size.")
    parser.add_argument(
        "--rounds", type=int, default=None, help="Grid rounds (default 3; quick 1)."
    )
    parser.add_argument(
        "--refine-rounds",
        type=int,
        default=None,
        help="Extra visits, after the grid rounds, of the configs within --refine-margin of "
        "the grid's best and of the advised config (default 6; quick 1).",
    )
    parser.add_argument(
        "--refine-margin",
        type=float,
        default=0.10,
        help="Which configs the refinement visits: within this fraction of the best (0.10).",
    )
    parser.add_argument(
        "--config-budget-s",
        type=float,
        default=None,
        help="Timed seconds per config per round (default 10; quick 2): bounds slow configs.",
    )
    parser.add_argument("--warmup", type=int, default=None, help="Warm-up steps (2; quick 1).")
    parser.add_argument("--min-steps", type=int, default=2, help="Timed steps per visit, at least.")
    parser.add_argument(
        "--max-steps", type=int, default=None, help="Timed steps per visit, at most (10; quick 4)."
    )
    parser.add_argument(
        "--profile-budget-s",
        type=float,
        default=None,
        help="advisor profile --budget-s (default: advisor's own default; quick 40).",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="Threads of the single-device children (default: torch's, as recommend's "
        "validation; torchrun ranks always get cores / ranks from advisor's launcher).",
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the per-round visit orders.")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"Results prefix: PREFIX.json, PREFIX_grid.csv, PREFIX.md and the work log "
        f"PREFIX_work/ (default {DEFAULT_PREFIX.relative_to(REPO)}; --quick: a temp dir).",
    )
    parser.add_argument(
        "--resume", action="store_true", help="Continue from PREFIX_work/ (same settings)."
    )
    parser.add_argument(
        "--fresh", action="store_true", help="Delete PREFIX_work/ first and start over."
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="With --resume: visit failed configs again (default: keep the failure).",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    model_args = dict(QUICK_MODEL_ARGS) if quick else {}
    if args.model_arg:
        from advisor.errors import UsageProblem
        from advisor.models import parse_model_args

        try:
            model_args = parse_model_args(args.model_arg)
        except UsageProblem as exc:
            parser.error(str(exc))
    settings = Settings(
        models=tuple(args.model or (("gpt-tiny",) if quick else DEFAULT_MODELS)),
        model_args=model_args,
        global_batch_size=args.global_batch_size,
        seq_len=args.seq_len,
        world_size=args.world_size,
        rounds=args.rounds or (1 if quick else 3),
        refine_rounds=(
            args.refine_rounds if args.refine_rounds is not None else (1 if quick else 6)
        ),
        refine_margin=args.refine_margin,
        config_budget_s=args.config_budget_s or (2.0 if quick else 10.0),
        warmup=args.warmup if args.warmup is not None else (1 if quick else 2),
        min_steps=args.min_steps,
        max_steps=args.max_steps or (4 if quick else 10),
        profile_budget_s=args.profile_budget_s or (40.0 if quick else None),
        threads=args.threads,
        quick=quick,
        seed=args.seed,
    )
    if settings.rounds < 1 or settings.min_steps < 1 or settings.max_steps < settings.min_steps:
        parser.error("--rounds and --min-steps must be >= 1, and --max-steps >= --min-steps")
    if settings.refine_rounds < 0 or not 0 <= settings.refine_margin < 1:
        parser.error("--refine-rounds must be >= 0 and --refine-margin in [0, 1)")
    if settings.warmup < 0 or settings.config_budget_s <= 0:
        parser.error("--warmup must be >= 0 and --config-budget-s positive")
    if args.resume and args.fresh:
        parser.error("--resume and --fresh exclude each other")
    return settings, args


def main(argv: Sequence[str] | None = None) -> int:
    settings, args = parse_args(argv)
    prefix: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="regret-quick-")) / "regret"
        if settings.quick
        else DEFAULT_PREFIX
    )
    work = prefix.with_name(prefix.name + "_work")
    if work.exists() and args.fresh:
        shutil.rmtree(work)
    settings_path = work / "settings.json"
    if work.exists() and not args.resume:
        print(
            f"{work} holds an earlier run: pass --resume to continue it or --fresh to start over",
            file=sys.stderr,
        )
        return 2
    if args.resume and settings_path.exists():
        earlier = json.loads(settings_path.read_text())
        if earlier.get("identity") != json.loads(json.dumps(settings.identity())):
            print(
                f"{work} was started with other settings ({earlier.get('identity')}): resume "
                "with the same flags, or --fresh",
                file=sys.stderr,
            )
            return 2
    work.mkdir(parents=True, exist_ok=True)
    if not settings_path.exists():
        settings_path.write_text(
            json.dumps({"settings": settings.to_dict(), "identity": settings.identity()}, indent=1)
        )
    log = WorkLog(work / "units.jsonl", retry_failed=args.retry_failed)
    started = time.perf_counter()
    environment = _environment()
    models: list[dict[str, Any]] = []

    def results(partial: bool) -> dict[str, Any]:
        return {
            "benchmark": "regret",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "quick": settings.quick,
            "partial": partial,
            "targets": {"throughput_ratio": THROUGHPUT_TARGET, "wall_ratio": WALL_TARGET},
            "settings": settings.to_dict(),
            "environment": environment,
            "models": models,
            "total_s": time.perf_counter() - started,
            "work_dir": str(work),
        }

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # SIGTERM unwinds like Ctrl-C: the visit in flight kills its child (run_isolated) or its
    # torchrun launcher (subprocess.run), the partial results are written, --resume continues.
    signal.signal(signal.SIGTERM, stop)
    try:
        run_models(settings, log, models, results, prefix)
    except KeyboardInterrupt:
        write_outputs(prefix, results(partial=True))
        _say(f"interrupted: partial results in {prefix}.*; continue with --resume --out {prefix}")
        return 130
    environment["loadavg_end"] = list(os.getloadavg())
    final = results(partial=False)
    write_outputs(prefix, final)
    table = render_markdown(final)
    print(table)
    _say(
        f"wrote {prefix.with_suffix('.json')}, {prefix.with_name(prefix.name + '_grid.csv')} and "
        f"{prefix.with_suffix('.md')} (work log: {work})"
    )
    return 0


def run_models(
    settings: Settings,
    log: WorkLog,
    models: list[dict[str, Any]],
    results: Callable[[bool], dict[str, Any]],
    prefix: Path,
) -> None:
    """Every model in turn: the advisor phase, then its grid; outputs rewritten after each visit."""
    for model in settings.models:
        label = model_label(model, settings.model_args)
        advisor = run_advisor(model, settings, log.path.parent / _slug(label))
        profile, plan = load_profile_and_plan(advisor)
        candidates, space_source = grid_candidates(profile, settings)
        if settings.quick:
            candidates = quick_subset(candidates, plan.candidate.key if plan else None)
        predictions = predictions_by_key(profile, model, candidates, settings)
        entry: dict[str, Any] = {
            "model": model,
            "model_args": dict(settings.model_args),
            "label": label,
            "advisor": advisor,
            "space_source": space_source,
            "plan": (
                {
                    "config": plan.config.to_dict(),
                    "key": plan.candidate.key,
                    "predicted": plan.predicted.to_dict(),
                    "measured": plan.measured.to_dict() if plan.measured else None,
                    "validated": [v.to_dict() for v in plan.validated],
                    "reasons": list(plan.reasons),
                }
                if plan
                else None
            ),
        }
        models.append(entry)

        def refresh(
            entry: dict[str, Any] = entry,
            model: str = model,
            candidates: list[Candidate] = candidates,
            profile: Profile | None = profile,
            plan: Plan | None = plan,
            predictions: dict[str, dict[str, Any]] = predictions,
            partial: bool = True,
        ) -> None:
            units = log.of(model)
            rows = grid_rows(model, candidates, units, profile, plan, predictions, settings)
            entry["rows"] = rows
            entry["summary"] = summarize(rows, entry["advisor"], units, settings)
            write_outputs(prefix, results(partial))

        refresh()
        _say(f"[{model}] grid: {len(candidates)} configs x {settings.rounds} round(s)")
        run_grid(model, candidates, settings, log, refresh)
        run_refinement(
            model, candidates, settings, log, refresh, plan.candidate.key if plan else None
        )
        refresh()


if __name__ == "__main__":
    sys.exit(main())
