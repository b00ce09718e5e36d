"""How well does a profile predict configs it never ran? Peak memory and step time, on this CPU.

For each model, ``run_profile`` (the orchestrator behind ``advisor profile``, its normal settings,
communication off: it predicts nothing on one device) writes the fits the search trusts:
``MemoryModel`` per (precision, checkpointing), fitted on fake-tensor traces at micro-batch 1, 4
and 8, and ``TimeModel``, fitted on real steps at the two sizes the throughput probe chose. Then, at
micro-batch sizes the probes did NOT run (3, 6, 12), the truth is measured:

* memory: the CPU allocator's own peak over one real step (the second: optimizer state exists),
  read from profiler memory events (``profilers.memory.measure_cpu_step_memory``), each config in
  a fresh child process. Deterministic up to a few KiB, so once.
* time: real training steps (forward+backward+optimizer, the same ``StepTimer`` the probe uses),
  each group's sizes timed round-robin (``measure_interleaved``, two warm-up steps each) in a
  fresh child, repeated in several children whose order interleaves all groups, so the slow
  drift of this shared 2-vCPU host spreads over every config. Truth = median of every sample.

Each child also re-times the sizes the profile timed, interleaved with the truth sizes. Fitting
the same affine TimeModel on those samples gives a *same-session* prediction: the model's own
error, without the host's drift between the profile and the truth; their ratio at the probed
sizes is that drift.

Error = (predicted - measured) / measured. Targets: |memory error| <= 5%, |time error| <= 10%.
Nothing here is tuned to the targets: predictions come from exactly what ``advisor profile``
writes. The load average is recorded before and after every phase; step times on this host vary
with the other tenants' load (see ``spread``: the interquartile range of the truth samples over
their median), and that noise is part of what a short probe has to live with.

Two settings, measured with this same method in one invocation (``--settings both``, the
default; model by model, their order alternating between models): *favourable* -- every
process (probes and truth) on one OMP thread (``--threads``), a 240 s profile budget -- and
*defaults* -- what ``advisor profile`` does with no options: torch's default thread count (every
core) and ``profilers.defaults.DEFAULT_PROFILE_BUDGET_S`` (120 s). The truth of each is measured
under its own settings, each model of each in a fresh process (the thread count must be set
before torch is imported); the results hold one labelled section per settings.

Run ``python benchmarks/profiler_accuracy.py`` (full: gpt-tiny, llama-tiny, bert-tiny x fp32,
bf16, fp16 x none/full/ops/blocks:1-3 checkpointing at seq_len 128, both settings; the profile
measures ops and blocks:L//2, the other blocks:K are its line in K) or ``--quick`` (gpt-tiny,
fp32/bf16, seq_len 64, sizes 3 and 6, 60 s profiles; results go to a temporary directory unless
``--out`` is given); ``--settings favourable`` or ``--settings defaults`` measures one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from profilers.workload import Workload

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PREFIX = REPO / "benchmarks" / "results" / "profiler_accuracy"
MEMORY_TARGET = 0.05
TIME_TARGET = 0.10
SLOW_ROUND_S = 8.0  # a group whose sizes take longer than this per round is "slow"
SLOW_REPEATS = 2


@dataclass(frozen=True, kw_only=True)
class Settings:
    models: tuple[str, ...]
    precisions: tuple[str, ...]
    checkpointing: tuple[str, ...]
    sizes: tuple[int, ...]
    seq_len: int
    budget_s: float  # of each model's profile
    repeats: int  # children per group for the time truth
    truth_s: float  # target seconds of timed steps per group per child (sets the rounds)
    max_rounds: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Settings:
        """Back from ``dataclasses.asdict`` through JSON (lists become tuples again)."""
        return cls(
            models=tuple(data["models"]),
            precisions=tuple(data["precisions"]),
            checkpointing=tuple(data["checkpointing"]),
            sizes=tuple(int(b) for b in data["sizes"]),
            seq_len=int(data["seq_len"]),
            budget_s=float(data["budget_s"]),
            repeats=int(data["repeats"]),
            truth_s=float(data["truth_s"]),
            max_rounds=int(data["max_rounds"]),
        )


# The selective settings: ops and the profile's middle blocks:K are measured; the other K are
# priced on the line in K (profilers.checkpointing_fits) and their truth checks that line.
SELECTIVE = ("ops", "blocks:1", "blocks:2", "blocks:3")
FULL = Settings(
    models=("gpt-tiny", "llama-tiny", "bert-tiny"),
    precisions=("fp32", "bf16", "fp16"),
    checkpointing=("none", "full", *SELECTIVE),
    sizes=(3, 6, 12),
    seq_len=128,
    budget_s=240.0,
    repeats=3,
    truth_s=20.0,
    max_rounds=5,
)
QUICK = Settings(
    models=("gpt-tiny",),
    precisions=("fp32", "bf16"),
    checkpointing=("none", "full", "ops", "blocks:1", "blocks:2"),
    sizes=(3, 6),
    seq_len=64,
    budget_s=60.0,
    repeats=2,
    truth_s=4.0,
    max_rounds=3,
)


def load() -> float:
    return os.getloadavg()[0]


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {load():.1f}] {message}", file=sys.stderr, flush=True)


# -- measuring -------------------------------------------------------------------------------------


def profile_model(model: str, settings: Settings) -> dict[str, Any]:
    """``advisor profile``'s probes on ``model``; returns the profile and its load context."""
    from advisor.workload import AdvisorWorkload
    from profilers.checkpointing import profiled
    from profilers.profiler import ProfileOptions, run_profile

    # AdvisorStep satisfies TrainStep at run time; mypy can't see it (advisor/profiling.py too).
    workload = cast("Workload", AdvisorWorkload(model, {}, "synthetic"))
    # What advisor profile measures of the settings asked for (blocks:K only at K = L // 2).
    measured = profiled(workload.facts().num_layers)
    options = ProfileOptions(
        seq_len=settings.seq_len,
        budget_s=settings.budget_s,
        precisions=settings.precisions,
        checkpointing=tuple(c for c in settings.checkpointing if c in measured),
        comm=False,
    )
    before = load()
    profile = run_profile(workload, options, lambda message, _: say(f"  {model}: {message}"))
    return {"profile": profile, "load_before": before, "load_after": load()}


def measure_memory(model: str, spec: Any) -> int | str:
    """CPU allocator peak of one real step in a fresh child, or the failure's status and reason."""
    from advisor.workload import AdvisorWorkload
    from profilers.isolate import Isolation, run_isolated
    from profilers.memory import measure_cpu_step_peak

    workload = AdvisorWorkload(model, {}, "synthetic")
    outcome = run_isolated(Isolation(timeout_s=600), measure_cpu_step_peak, workload, spec)
    return int(outcome.value) if outcome.ok else f"{outcome.status}: {outcome.reason}"


def time_group(model: str, specs: Sequence[Any], rounds: int, warmup: int) -> list[Any] | str:
    """One child: every size of one group timed round-robin after two warm-up steps each."""
    from advisor.workload import AdvisorWorkload
    from profilers.isolate import Isolation, run_isolated
    from profilers.throughput import measure_interleaved

    workload = AdvisorWorkload(model, {}, "synthetic")
    outcome = run_isolated(
        Isolation(timeout_s=1200),
        measure_interleaved,
        workload,
        list(specs),
        "cpu",
        rounds=rounds,
        warmup=warmup,
    )
    return list(outcome.value) if outcome.ok else f"{outcome.status}: {outcome.reason}"


def quartile_spread(samples: Sequence[float]) -> float:
    """Interquartile range over the median: how noisy the truth itself is."""
    if len(samples) < 4:
        return (max(samples) - min(samples)) / statistics.median(samples)
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / statistics.median(samples)


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def bench_model(model: str, settings: Settings) -> dict[str, Any]:
    from profilers.host_activity import HostMeter
    from profilers.throughput import fit_step_time, largest_host_share
    from profilers.workload import StepSpec

    say(f"{model}: profiling (budget {settings.budget_s:g} s)")
    profiled = profile_model(model, settings)
    profile = profiled["profile"]
    layers = profile.model.num_layers
    # blocks:K runs only with 0 < K < L: a shallower model skips the larger K.
    groups = [
        (p, c)
        for p in settings.precisions
        for c in settings.checkpointing
        if profile.model.checkpointing_problem(c) is None
    ]

    def spec(precision: str, checkpointing: str, b: int) -> Any:
        return StepSpec(
            seq_len=settings.seq_len,
            micro_batch_size=b,
            precision=precision,
            activation_checkpointing=checkpointing,
        )

    say(f"{model}: memory truth ({len(groups) * len(settings.sizes)} configs, one child each)")
    memory_load = [load()]
    measured_memory: dict[tuple[str, str, int], int | str] = {}
    for p, c in groups:
        for b in settings.sizes:
            measured_memory[p, c, b] = measure_memory(model, spec(p, c, b))
    memory_load.append(load())

    # Each child also re-times the sizes the profile timed: the same fit made from samples of
    # the same session as the truth separates the model's error from the drift of the host
    # between the profile and the truth (see `same_session` below).
    probed: dict[tuple[str, str], list[int]] = {}
    for p, c in groups:
        fit = profile.fits.time_model(p, c, num_layers=layers)
        probed[p, c] = sorted({int(x) for x in fit.forward_backward.xs}) if fit else []
    # Rounds per child from the profile's own prediction, at least 2. A slow group (fp16 here:
    # ~20x fp32) gets one warm-up step per size and fewer children, or it would take an hour.
    rounds: dict[tuple[str, str], int] = {}
    slow: set[tuple[str, str]] = set()
    for p, c in groups:
        fit = profile.fits.time_model(p, c, num_layers=layers)
        sizes = sorted({*settings.sizes, *probed[p, c]})
        per_round = sum(max(fit.predict(b), 1e-3) for b in sizes) if fit else 1.0
        rounds[p, c] = max(2, min(settings.max_rounds, int(settings.truth_s / per_round)))
        if per_round > SLOW_ROUND_S:
            slow.add((p, c))
    say(f"{model}: time truth ({settings.repeats} interleaved children per group)")
    time_load = [load()]
    samples: dict[tuple[str, str, int], list[float]] = {}
    session: dict[tuple[str, str], list[Any]] = {}  # StepTimings at the probed sizes
    failures: dict[tuple[str, str], str] = {}
    truth_shares: dict[tuple[str, str], list[float]] = {}
    for repeat in range(settings.repeats):
        for p, c in groups:
            if (p, c) in failures or ((p, c) in slow and repeat >= SLOW_REPEATS):
                continue
            say(f"  {model} {p}/{c}: child {repeat + 1}/{settings.repeats}, {rounds[p, c]} rounds")
            specs = [spec(p, c, b) for b in sorted({*settings.sizes, *probed[p, c]})]
            # Others' share of the host while the child ran (the child is reaped inside, so
            # its own CPU time counts as ours): the profile records the same for its timings.
            with HostMeter() as meter:
                result = time_group(model, specs, rounds[p, c], 1 if (p, c) in slow else 2)
            if meter.others_share is not None:
                truth_shares.setdefault((p, c), []).append(meter.others_share)
            if isinstance(result, str):
                failures[p, c] = result
                continue
            for timing in result:
                key = (p, c, timing.spec.micro_batch_size)
                samples.setdefault(key, []).extend(timing.step_s)
                if timing.spec.micro_batch_size in probed[p, c]:
                    session.setdefault((p, c), []).append(timing)
        time_load.append(load())

    rows = []
    for p, c in groups:
        # blocks:K between the measured settings: interpolated in K (no samples: xs empty).
        memory_model = profile.fits.memory_model(p, c, num_layers=layers)
        time_model = profile.fits.time_model(p, c, num_layers=layers)
        same_session = fit_step_time(session[p, c]) if (p, c) in session else None
        # Host drift: the same sizes measured now over what the profile measured then.
        drift = (
            statistics.median(
                statistics.median(samples[p, c, b]) / time_model.predict(b) for b in probed[p, c]
            )
            if time_model is not None and (p, c) in session
            else None
        )
        memory_sizes = (
            sorted({int(x) for x in memory_model.forward_backward.xs}) if memory_model else []
        )
        # How a blocks:K without traces of its own is priced: from the measured settings'
        # windows (profilers.checkpointing_fits), else on the line in K between them.
        memory_priced = (
            "windows in K" if memory_model and memory_model.forward_backward.pieces else "line in K"
        )
        time_sizes = sorted({int(x) for x in time_model.forward_backward.xs}) if time_model else []
        for b in settings.sizes:
            row: dict[str, Any] = {
                "model": model,
                "precision": p,
                "activation_checkpointing": c,
                "micro_batch_size": b,
                "memory_probed_sizes": memory_sizes,
                "memory_priced": memory_priced,
                "time_probed_sizes": time_sizes,
            }
            truth = measured_memory[p, c, b]
            if memory_model is None or isinstance(truth, str):
                row["memory"] = {
                    "error": None,
                    "note": truth if isinstance(truth, str) else "no fit",
                }
            else:
                predicted = memory_model.predict(b)
                row["memory"] = {
                    "predicted_bytes": predicted,
                    "measured_bytes": truth,
                    "error": relative_error(predicted, truth),
                    "extrapolated": beyond(memory_sizes, b),
                }
            timed = samples.get((p, c, b))
            if time_model is None or not timed:
                note = "no time fit in the profile" if time_model is None else "no truth"
                row["time"] = {"error": None, "note": failures.get((p, c), note)}
            else:
                predicted_s = time_model.predict(b)
                measured_s = statistics.median(timed)
                row["time"] = {
                    "predicted_s": predicted_s,
                    "measured_s": measured_s,
                    "num_samples": len(timed),
                    "spread": quartile_spread(timed),
                    "error": relative_error(predicted_s, measured_s),
                    "extrapolated": outside(time_sizes, b),
                    "drift": drift,
                    # Others' largest share of the host: the profile's timing children of
                    # this group, and the truth's children (None: not measured).
                    "profile_host_share": largest_host_share(
                        t
                        for t in profile.throughput
                        if (t.spec.precision, t.spec.activation_checkpointing) == (p, c)
                    ),
                    "truth_host_share": max(truth_shares.get((p, c), []), default=None),
                }
                if same_session is not None:
                    row["time"]["same_session_predicted_s"] = same_session.predict(b)
                    row["time"]["same_session_error"] = relative_error(
                        same_session.predict(b), measured_s
                    )
            rows.append(row)
    throughput_rows = [
        {"name": r.name, "status": r.status, "reason": r.reason, "value": r.value}
        for r in profile.probes
        if r.probe == "throughput"
    ]
    return {
        "model": model,
        "device": profile.device.name,
        "profile": {
            "budget_s": profile.budget_s,
            "elapsed_s": profile.elapsed_s,
            "load_before": profiled["load_before"],
            "load_after": profiled["load_after"],
            "throughput_probes": throughput_rows,
            "memory_overhead": profile.memory_overhead.to_dict(),
            "time_fits": [t.to_dict() for t in profile.fits.time],
            "host_share": largest_host_share(profile.throughput),
        },
        "truth_host_share": max((x for v in truth_shares.values() for x in v), default=None),
        "memory_truth_load": memory_load,
        "time_truth_load": time_load,
        "rounds": {f"{p}/{c}": n for (p, c), n in rounds.items()},
        "rows": rows,
    }


# -- settings: favourable and the product's defaults ----------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Variant:
    """The settings the profile and the truth run under; nothing else of the method changes.

    ``favourable``: one OMP thread per process (steady on a shared host) and a generous profile
    budget. ``defaults``: what ``advisor profile`` does when given no options: torch's own
    thread count (every core) and ``DEFAULT_PROFILE_BUDGET_S``.
    """

    name: str
    threads: int | None  # OMP/MKL threads of every process; None: torch's default
    budget_s: float  # each model's profile budget

    def label(self) -> str:
        threads = "torch's default threads" if self.threads is None else f"{self.threads} thread(s)"
        return f"{self.name} ({threads} per process, profile budget {self.budget_s:g} s)"

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment of this variant's processes (children inherit it)."""
        env = {k: v for k, v in base.items() if k not in THREAD_VARIABLES}
        if self.threads is not None:
            env.update({k: str(self.threads) for k in THREAD_VARIABLES})
        return env


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
VARIANT_NAMES = ("favourable", "defaults")
SETTINGS_CHOICES = (*VARIANT_NAMES, "both")


def resolve_variants(
    choice: str, settings: Settings, threads: int, budget_s: float | None, quick: bool
) -> list[Variant]:
    """The variants ``--settings`` asks for. ``--threads`` and ``--budget-s`` shape the
    favourable one only (defaults are the product's); ``--quick`` caps the defaults' budget
    at the quick profile's so that a smoke run stays short."""
    from profilers.defaults import DEFAULT_PROFILE_BUDGET_S

    favourable = Variant(
        name="favourable", threads=threads or None, budget_s=budget_s or settings.budget_s
    )
    default_budget = DEFAULT_PROFILE_BUDGET_S
    if quick:
        default_budget = min(default_budget, settings.budget_s)
    defaults = Variant(name="defaults", threads=None, budget_s=default_budget)
    chosen = {"favourable": [favourable], "defaults": [defaults], "both": [favourable, defaults]}
    if choice not in chosen:
        raise ValueError(f"--settings must be one of {', '.join(SETTINGS_CHOICES)}, got {choice!r}")
    return chosen[choice]


def interleaved_order(models: Sequence[str], variants: Sequence[Variant]) -> list[tuple[str, str]]:
    """(variant, model) in the order they run: model by model, the variants' order alternating
    from one model to the next, so a slow drift of the host's load favours neither variant."""
    order = []
    for i, model in enumerate(models):
        names = [v.name for v in variants]
        order += [(name, model) for name in (names if i % 2 == 0 else names[::-1])]
    return order


def beyond(sizes: Sequence[int], b: int) -> bool:
    """Whether a memory fit extrapolates to ``b``: right of its largest traced size (left of
    the smallest it is floored there). False for a fit with no sizes of its own: ``blocks:K``
    priced from the measured settings (their windows, or the line in K through them), which
    is what is being judged."""
    return bool(sizes) and b > max(sizes)


def outside(sizes: Sequence[int], b: int) -> bool:
    """Whether a time fit extrapolates to ``b``: outside its timed sizes. False, as in
    :func:`beyond`, for ``blocks:K`` on the line in K (its fit has no sizes: the first full
    run of the selective settings crashed here, on ``min()`` of none)."""
    return bool(sizes) and not (min(sizes) <= b <= max(sizes))


def kept_benches(path: Path, settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    """The models an earlier results file measured without error, by (settings name, model),
    each marked with where it came from; refused when that run's settings differ from these
    in anything but the models."""
    earlier = json.loads(path.read_text())
    theirs = {k: v for k, v in earlier["meta"]["settings"].items() if k != "models"}
    ours = json.loads(json.dumps(dataclasses.asdict(settings)))  # tuples as JSON reads them
    ours.pop("models")
    if theirs != ours:
        raise SystemExit(
            f"--resume-from {path}: its settings differ from this run's ({theirs} vs {ours})"
        )
    return {
        (section["name"], bench["model"]): {**bench, "kept_from": str(path)}
        for section in earlier["by_settings"]
        for bench in section["models"]
        if "error" not in bench
    }


def run_child(model: str, settings: Settings, variant: Variant, workdir: Path) -> dict[str, Any]:
    """One model under one variant, in a fresh interpreter with the variant's environment (the
    thread count has to be set before torch is imported, and every probe child inherits it)."""
    import subprocess

    out = workdir / f"{variant.name}-{model.replace('/', '_').replace(':', '_')}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-model", model]
    cmd += ["--child-settings", json.dumps(dataclasses.asdict(settings)), "--child-out", str(out)]
    say(f"{model}: settings {variant.label()}")
    done = subprocess.run(cmd, cwd=REPO, env=variant.env(os.environ))
    if done.returncode != 0 or not out.is_file():
        return {"model": model, "error": f"the benchmark child exited with {done.returncode}"}
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def child_main(model: str, settings_json: str, out: Path) -> None:
    """In the child: ``bench_model`` as before, plus the process's thread facts."""
    import torch

    bench = bench_model(model, Settings.from_dict(json.loads(settings_json)))
    bench["torch_threads"] = torch.get_num_threads()
    bench["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    bench["torch"] = torch.__version__
    out.write_text(json.dumps(bench) + "\n")


# -- reporting -------------------------------------------------------------------------------------


def summarize(rows: Sequence[dict[str, Any]], precisions: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for p in (*precisions, "all"):
        mine = [r for r in rows if p in ("all", r["precision"])]
        entry: dict[str, Any] = {"precision": p}
        for kind, target in (("memory", MEMORY_TARGET), ("time", TIME_TARGET)):
            errors = [abs(r[kind]["error"]) for r in mine if r[kind]["error"] is not None]
            inside = [
                abs(r[kind]["error"])
                for r in mine
                if r[kind]["error"] is not None and not r[kind]["extrapolated"]
            ]
            entry[kind] = {
                "num": len(errors),
                "median_abs_error": statistics.median(errors) if errors else None,
                "max_abs_error": max(errors) if errors else None,
                "within_target": sum(e <= target for e in errors),
                "median_abs_error_interpolated": statistics.median(inside) if inside else None,
                "num_interpolated": len(inside),
            }
        same = [
            abs(r["time"]["same_session_error"])
            for r in mine
            if r["time"].get("same_session_error") is not None
        ]
        drifts = [r["time"]["drift"] for r in mine if r["time"].get("drift") is not None]
        entry["time_same_session"] = {
            "num": len(same),
            "median_abs_error": statistics.median(same) if same else None,
            "max_abs_error": max(same) if same else None,
            "within_target": sum(e <= TIME_TARGET for e in same),
            "median_drift": statistics.median(drifts) if drifts else None,
            "min_drift": min(drifts) if drifts else None,
            "max_drift": max(drifts) if drifts else None,
        }
        out.append(entry)
    return out


def variant_results(
    variant: Variant, benches: Sequence[dict[str, Any]], precisions: Sequence[str]
) -> dict[str, Any]:
    """One variant's section of the results: its settings, summary and per-model tables."""
    ok = [b for b in benches if "error" not in b]
    rows = [row for bench in ok for row in bench["rows"]]
    threads = sorted({b["torch_threads"] for b in ok if "torch_threads" in b})
    return {
        "name": variant.name,
        "label": variant.label(),
        "threads": variant.threads,
        "torch_threads": threads[0] if len(threads) == 1 else threads,
        "budget_s": variant.budget_s,
        "summary": summarize(rows, precisions),
        "models": list(benches),
    }


def pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.1f}%"


def abs_pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


SUMMARY_HEADER = (
    "| settings | precision | memory median | memory max | memory ≤ 5% | time (profile) median "
    "| max | ≤ 10% | time (same session) median | max | ≤ 10% | drift median (min–max) |"
)


def summary_rows(name: str, summary: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for s in summary:
        m, t, same = s["memory"], s["time"], s["time_same_session"]
        drift = (
            f"{same['median_drift']:.2f} ({same['min_drift']:.2f}–{same['max_drift']:.2f})"
            if same["median_drift"] is not None
            else "—"
        )
        lines.append(
            f"| {name} | {s['precision']} | {abs_pct(m['median_abs_error'])} | "
            f"{abs_pct(m['max_abs_error'])} | {m['within_target']}/{m['num']} | "
            f"{abs_pct(t['median_abs_error'])} | {abs_pct(t['max_abs_error'])} | "
            f"{t['within_target']}/{t['num']} | {abs_pct(same['median_abs_error'])} | "
            f"{abs_pct(same['max_abs_error'])} | {same['within_target']}/{same['num']} | {drift} |"
        )
    return lines


def host_shares(profile_share: float | None, truth_share: float | None) -> str:
    """Others' largest share of the host while the profile and the truth timed, where read
    (runs before the host meter have neither)."""
    if profile_share is None and truth_share is None:
        return ""
    return (
        f" Others' largest share of the host: profile {pct(profile_share).lstrip('+')}, "
        f"time truth {pct(truth_share).lstrip('+')}."
    )


def model_section(bench: dict[str, Any], heading: str) -> list[str]:
    if "error" in bench:
        return ["", f"{heading} {bench['model']}", "", f"Not measured: {bench['error']}."]
    prof = bench["profile"]
    lines = [
        "",
        f"{heading} {bench['model']}",
        "",
        f"Profile: {prof['elapsed_s']:.0f} s of {prof['budget_s']:g} s, load "
        f"{prof['load_before']:.1f} → {prof['load_after']:.1f}; time truth load "
        + " → ".join(f"{x:.1f}" for x in bench["time_truth_load"])
        + "."
        + host_shares(prof.get("host_share"), bench.get("truth_host_share"))
        + (f" Measured by the run of {bench['kept_from']} (kept)." if "kept_from" in bench else ""),
        "",
        "| precision | ckpt | b | memory probed at | predicted MiB | measured MiB | error "
        "| time probed at | predicted s | measured s (spread, n) | error "
        "| same-session error | drift |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in bench["rows"]:
        m, t = r["memory"], r["time"]
        mem = (
            f"{m['predicted_bytes'] / 2**20:.2f} | {m['measured_bytes'] / 2**20:.2f} | "
            f"{pct(m['error'])}{'*' if m['extrapolated'] else ''}"
            if m["error"] is not None
            else f"— | — | {m.get('note', '')}"
        )
        tim = (
            f"{t['predicted_s']:.3f} | {t['measured_s']:.3f} ({100 * t['spread']:.0f}%, "
            f"{t['num_samples']}) | {pct(t['error'])}{'*' if t['extrapolated'] else ''} | "
            f"{pct(t.get('same_session_error'))} | "
            + (f"{t['drift']:.2f}" if t.get("drift") is not None else "—")
            if t["error"] is not None
            else f"— | — | {t.get('note', '')} | — | —"
        )
        lines.append(
            f"| {r['precision']} | {r['activation_checkpointing']} | {r['micro_batch_size']} | "
            f"{r['memory_probed_sizes'] or r.get('memory_priced', 'line in K')} | {mem} | "
            f"{r['time_probed_sizes'] or 'line in K'} | {tim} |"
        )
    skipped = [p for p in prof["throughput_probes"] if p["status"] != "ok"]
    if skipped:
        lines += ["", "Throughput probes not ok in the profile: "]
        lines += [f"- {p['name']}: {p['status']} ({p['reason']})" for p in skipped]
    return lines


def render(results: dict[str, Any]) -> str:
    lines = ["# Profiler accuracy", ""]
    meta = results["meta"]
    variants = results["by_settings"]
    lines += [
        f"{meta['cpu']}, {meta['num_cpus']} CPUs, torch {meta['torch']}, seq_len "
        f"{meta['settings']['seq_len']}, total {meta['total_min']:.1f} min. Load average "
        f"(1 min) at start {meta['load_start']:.1f}, end {meta['load_end']:.1f}. Settings: "
        + "; ".join(
            f"**{v['label']}**"
            + (f" (torch.get_num_threads() = {v['torch_threads']})" if v["torch_threads"] else "")
            for v in variants
        )
        + (
            ". Run model by model, the settings' order alternating between models."
            if len(variants) > 1
            else "."
        ),
        "",
        "Error = (predicted − measured) / measured at micro-batch sizes the probes did not run. "
        f"Targets: |memory| ≤ {MEMORY_TARGET:.0%}, |time| ≤ {TIME_TARGET:.0%}. "
        "`*` = extrapolated beyond the probed sizes. Spread = IQR / median of the measured steps.",
        "",
        "Time is reported twice. *Profile*: the profile's own TimeModel, as `advisor recommend` "
        "uses it. *Same session*: the same affine fit, made from the probed sizes re-timed in "
        "the truth's own children (interleaved with the truth sizes): the model's error without "
        "the host's drift between the profile and the truth. *Drift* = the probed sizes' step "
        "time now over the profile's (1.00 = the host ran as fast as during the profile).",
        "",
        "Settings: *favourable* runs every process (probes and truth) on the given OMP thread "
        "count with a long profile budget; *defaults* is what `advisor profile` does with no "
        "options: torch's default threads (every core) and its default budget. The truth is "
        "measured under the same settings as the profile it checks.",
        "",
        "## Summary (|error|)",
        "",
        SUMMARY_HEADER,
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in variants:
        lines += summary_rows(v["name"], v["summary"])
    for v in variants:
        lines += ["", f"## Settings: {v['label']}"]
        for bench in v["models"]:
            lines += model_section(bench, "###")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="Smoke run: gpt-tiny, fp32/bf16, sizes 3 and 6."
    )
    parser.add_argument(
        "--settings",
        choices=SETTINGS_CHOICES,
        default="both",
        help="favourable: --threads per process and a long profile budget (--budget-s); "
        "defaults: what `advisor profile` does with no options (torch's default threads, its "
        "default budget); both (default): each model under each, in one invocation.",
    )
    parser.add_argument("--models", nargs="+", default=None, help="Model specs to profile.")
    parser.add_argument("--precisions", nargs="+", default=None, help="Subset of fp32 bf16 fp16.")
    parser.add_argument(
        "--budget-s", type=float, default=None, help="Profile budget per model (favourable)."
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP/MKL threads for every process of the favourable settings, probes included "
        "(default 1: two threads on a shared 2-vCPU host stall at each barrier when a "
        "co-tenant runs; 0 keeps torch's default).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"Results prefix (writes PREFIX.json and PREFIX.md; default {DEFAULT_PREFIX} for "
        "the full run, a temporary directory with --quick).",
    )
    parser.add_argument(
        "--resume-from",
        type=Path,
        default=None,
        help="The results JSON of an earlier run with the same settings: the models it "
        "measured without error are kept (each says so) and only the others are measured.",
    )
    # Internal: one model under one variant, in a fresh process.
    parser.add_argument("--child-model", help=argparse.SUPPRESS)
    parser.add_argument("--child-settings", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_model is not None:
        child_main(args.child_model, args.child_settings, args.child_out)
        return 0

    settings = QUICK if args.quick else FULL
    if args.models:
        settings = dataclasses.replace(settings, models=tuple(args.models))
    if args.precisions:
        settings = dataclasses.replace(settings, precisions=tuple(args.precisions))
    variants = resolve_variants(args.settings, settings, args.threads, args.budget_s, args.quick)
    started, load_start = time.perf_counter(), load()
    benches: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    by_name = {v.name: v for v in variants}
    order = interleaved_order(settings.models, variants)
    kept = kept_benches(args.resume_from, settings) if args.resume_from else {}
    with tempfile.TemporaryDirectory(prefix="profiler_accuracy-") as tmp:
        for name, model in order:
            if (name, model) in kept:
                say(f"{model}: settings {name}: kept from {args.resume_from}")
                benches[name].append(kept[name, model])
                continue
            variant = by_name[name]
            child_settings = dataclasses.replace(settings, budget_s=variant.budget_s)
            benches[name].append(run_child(model, child_settings, variant, Path(tmp)))
    ok = [b for bs in benches.values() for b in bs if "error" not in b]
    results = {
        "meta": {
            "quick": args.quick,
            "settings": dataclasses.asdict(settings),
            "settings_choice": args.settings,
            "order": [list(x) for x in order],
            "cpu": ok[0]["device"] if ok else "?",
            "num_cpus": os.cpu_count(),
            "torch": ok[0]["torch"] if ok else "?",
            "python": platform.python_version(),
            "load_start": load_start,
            "load_end": load(),
            "total_min": (time.perf_counter() - started) / 60,
            "targets": {"memory": MEMORY_TARGET, "time": TIME_TARGET},
        },
        "by_settings": [variant_results(v, benches[v.name], settings.precisions) for v in variants],
    }
    prefix = args.out
    if prefix is None:
        prefix = (
            Path(tempfile.mkdtemp(prefix="profiler_accuracy-quick-")) / "profiler_accuracy"
            if args.quick
            else DEFAULT_PREFIX
        )
    prefix.parent.mkdir(parents=True, exist_ok=True)
    table = render(results)
    prefix.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    prefix.with_suffix(".md").write_text(table)
    print(table)
    print(f"wrote {prefix.with_suffix('.json')} and {prefix.with_suffix('.md')}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
