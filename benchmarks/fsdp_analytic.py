"""The FSDP rank the what-if derives from one device, against the rank's own traced fit.

When a profile traced no FSDP rank of a setting (its budget ran out first), the what-if prices
an FSDP rank analytically (``strategies.cost.CostModel._fsdp_memory``): the sharded state, the
gathered units, the reduce-scatter buffer, and the activations from the single-device fit.
Until 2026-12-06 those activations were the single-device peak less the parameters and the
optimizer state, which counted as activations whatever else that peak held: every fp32
gradient when it fell at the end of backward (full checkpointing: DeepSeek-V3's 2.5 TB), and
autocast's 16-bit copy of every weight in 16 bits. Now they come from the fit's windows
(window A less the copies the blocks not checkpointed saved for backward; window B less every
gradient; window F less every copy).

The reference is each profile's own per-rank fit (fsdp×2 traces at several micro-batches,
resharded to the candidate's world size), used only at micro-batches within its traced range
(a fit's extrapolation is no reference). "Before" is the whole-peak formula (the same profile
with the single-device fits' windows removed, which is what the cost model then falls back
to); "now" the windowed one. Every number is the what-if's per-rank traced bytes (before the
fragmentation margin and the fixed overhead) for H100-80GB targets, FSDP, no accumulation.

The profiles (``results/fsdp_analytic/<name>/profile.json``, each with its probes.csv) were
taken on this repository's 2-vCPU host on 2026-12-06 with ``advisor profile --trace-for
cuda`` at the default 120 s budget (``--precision bf16`` for Mixtral). The windowed formula was
worked out on three of them (``DESIGN``: Llama-shaped 70.55B and 7.53B, Mixtral 8×7B: the
copies term was added after the 70.55B's bf16/none read 103% over); the others were profiled
after it was written and are reported apart (``HELD_OUT``), with Qwen3.5-9B's from
``fsdp_one_rank``. All seven were re-taken later that day, the same commands, after the day's
trace mends (Qwen3.5's v copy, transformers' causal mask) and with the primed tracer and the
what-if rank order (``blocks:K`` ranks last); the method was not changed. Predictions: no GPU
ran them.

Run ``python benchmarks/fsdp_analytic.py``: prints the tables, writes
``results/fsdp_analytic.md`` and ``.json``. Seconds.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from profilers.rundir import PROFILE as PROFILE_FILE  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PROFILES = RESULTS / "fsdp_analytic"
TARGET, WORLDS, MICRO = "h100-80gb", (8, 64), (1, 2, 4, 8)
DESIGN = ("llama-70b", "llama-7b", "mixtral")
HELD_OUT = ("mistral", "olmo2", "glm4", "qwen3_5")
PATHS = {name: PROFILES / name / PROFILE_FILE for name in (*DESIGN, *HELD_OUT)}
PATHS["qwen3_5"] = RESULTS / "fsdp_one_rank" / PROFILE_FILE


def cost_model(profile: Any, world: int) -> Any:
    from strategies.space import SearchRequest
    from strategies.whatif import whatif_cost_model

    request = SearchRequest(global_batch_size=world, world_size=world, target=TARGET)
    return whatif_cost_model(profile, request)[0]


def single_device_only(profile: Any, windows: bool = True) -> Any:
    """``profile`` without its per-rank traces and fits (and, ``windows`` False, without the
    single-device fits' windows: the whole-peak formula)."""
    memory = tuple(t for t in profile.memory if t.spec.parallelism == "single")
    fits = tuple(
        m if windows else dataclasses.replace(m, windows=(), windows_accumulating=())
        for m in profile.fits.memory
        if m.parallelism == "single"
    )
    return dataclasses.replace(
        profile, memory=memory, fits=dataclasses.replace(profile.fits, memory=fits)
    )


def traced_bytes(model: Any, precision: str, checkpointing: str, world: int, micro: int) -> int:
    from strategies.space import Candidate

    c = Candidate(
        precision=precision,
        activation_checkpointing=checkpointing,
        parallelism="fsdp",
        world_size=world,
        micro_batch_size=micro,
        grad_accum_steps=1,
    )
    return int(model.predict(c).breakdown.to_dict()["memory"]["traced_bytes"])


def measure() -> list[dict[str, Any]]:
    from profilers.profile_record import load_profile

    rows = []
    for name, path in PATHS.items():
        profile = load_profile(path)
        single = {
            (m.precision, m.activation_checkpointing)
            for m in profile.fits.memory
            if m.parallelism == "single" and m.loss_chunks == 1
        }
        ranks = {
            (m.precision, m.activation_checkpointing): max(m.forward_backward.xs)
            for m in profile.fits.memory
            if m.parallelism == "fsdp" and m.loss_chunks == 1 and m.fsdp_reshard_after_forward
        }
        for world in WORLDS:
            fit = cost_model(profile, world)
            now = cost_model(single_device_only(profile), world)
            before = cost_model(single_device_only(profile, windows=False), world)
            for (precision, checkpointing), largest in sorted(ranks.items()):
                if (precision, checkpointing) not in single:
                    continue
                for micro in (b for b in MICRO if b <= largest):
                    args = (precision, checkpointing, world, micro)
                    rows.append(
                        {
                            "model": name,
                            "held_out": name in HELD_OUT,
                            "precision": precision,
                            "checkpointing": checkpointing,
                            "world_size": world,
                            "micro_batch_size": micro,
                            "rank_fit_gib": traced_bytes(fit, *args) / 2**30,
                            "before_gib": traced_bytes(before, *args) / 2**30,
                            "now_gib": traced_bytes(now, *args) / 2**30,
                        }
                    )
    return rows


def summary(rows: list[dict[str, Any]], held_out: bool) -> dict[str, float]:
    group = [r for r in rows if r["held_out"] == held_out]
    out: dict[str, float] = {"rows": len(group)}
    for key in ("before", "now"):
        over = [r[f"{key}_gib"] / r["rank_fit_gib"] - 1 for r in group]
        out[f"{key}_median"] = statistics.median(over) if over else float("nan")
        out[f"{key}_min"] = min(over, default=float("nan"))
        out[f"{key}_max"] = max(over, default=float("nan"))
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| set | rows | before: median | min | max | now: median | min | max |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for held_out, label in ((False, "design (formula worked out on)"), (True, "held out")):
        s = summary(rows, held_out)
        lines.append(
            f"| {label} | {int(s['rows'])} | {s['before_median']:+.1%} | {s['before_min']:+.1%} "
            f"| {s['before_max']:+.1%} | {s['now_median']:+.1%} | {s['now_min']:+.1%} "
            f"| {s['now_max']:+.1%} |"
        )
    lines += [
        "",
        "| model | setting | ranks | micro-batch | rank's fit GiB | before | now |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        fit = r["rank_fit_gib"]
        lines.append(
            f"| {r['model']}{' (held out)' if r['held_out'] else ''} | {r['precision']}/"
            f"{r['checkpointing']} | {r['world_size']} | {r['micro_batch_size']} | {fit:.1f} | "
            f"{r['before_gib']:.1f} ({r['before_gib'] / fit - 1:+.1%}) | "
            f"{r['now_gib']:.1f} ({r['now_gib'] / fit - 1:+.1%}) |"
        )
    return lines


def main() -> int:
    rows = measure()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fsdp_analytic.json").write_text(json.dumps(rows, indent=1) + "\n")
    body = table(rows)
    md = [
        "# An FSDP rank derived from one device, against the rank's own fit",
        "",
        "Generated by `python benchmarks/fsdp_analytic.py` (see its docstring: profiles, "
        f"method, which were held out). What-if on {TARGET}, FSDP, no accumulation; per-rank "
        "traced bytes and the difference from the rank's fit (within its traced sizes). "
        "Before: the single-device peak less the parameters and optimizer state; now: from "
        "the fit's windows. Predictions: no GPU ran them.",
        "",
        *body,
    ]
    (RESULTS / "fsdp_analytic.md").write_text("\n".join(md) + "\n")
    print("\n".join(body[:4]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
