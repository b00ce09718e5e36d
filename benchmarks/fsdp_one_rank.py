"""An FSDP rank's memory from one traced micro-batch size, against the rank's own fit.

A profile whose budget ends during its per-rank FSDP traces keeps one rank trace of a group
and no per-rank fit (a fit needs two sizes). The what-if then derived the rank from the single
device's fit: its activations, which in 16 bits hold autocast's copies of every weight that a
rank with a bf16 parameter policy does not keep. Since 2026-12-06 it anchors the rank on that
one trace instead (``strategies.cost.CostModel._anchored_fsdp_memory``: the trace resharded
window by window, plus the single device's growth from the traced micro-batch to the
candidate's).

The reference is the rank's own fit, from the profile's three traced sizes; each row keeps one
of those traces only (the group's fit and its other traces removed) and predicts again, as a
short budget would have left it; "analytic" removes them all (the formula from one device).
Every number is the what-if's per-rank traced bytes (before the fragmentation margin and the
fixed overhead) on 8 H100-80GB (FSDP, bf16, sequence 4096, no accumulation).

The profile (``results/fsdp_one_rank/profile.json``, with its probes.csv) is Qwen3.5's default
text config (hf:qwen3_5_text, 8.95B parameters: 24 gated-delta-rule and 8 attention layers),
taken on this repository's 2-core CPU host on 2026-12-06 with ``advisor profile --model
hf:qwen3_5_text --seq-len 4096 --precision bf16 --trace-for cuda --budget-s 420`` (re-taken
later that day, the same command, after the day's trace mends and with the primed tracer):
FSDP×2 rank traces and single-device fits of bf16 none, full and ops at micro-batches 1, 4 and
8 (the first profile: bf16/none only on both; its bf16/full ranks, at 1 and 4, had no
single-device fit, which both the one-trace anchor and the formula need). A model the
method was not tuned on (it has no constant to tune); no GPU ran it.

Run ``python benchmarks/fsdp_one_rank.py``: prints the table, writes
``results/fsdp_one_rank.md`` and ``.json``. Seconds.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from profilers.rundir import PROFILE as PROFILE_FILE  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PROFILE = RESULTS / "fsdp_one_rank" / PROFILE_FILE
TARGET, WORLD, MICRO = "h100-80gb", 8, (1, 2, 4, 8)
# The first profile (2026-12-06) had bf16/none only: its budget traced bf16/full for the ranks
# (micro-batches 1 and 4) but not on one device, whose fit the anchor and the formula both
# need. The re-taken one has none, full and ops on both (blocks:K ranks are priced from the
# none/full line, not anchored: left out).
SETTINGS = ("none", "full", "ops")


def rank_bytes(profile: Any, checkpointing: str, micro: int) -> int:
    """The what-if's per-rank traced bytes of bf16/``checkpointing`` at ``micro`` on
    :data:`WORLD` H100s, priced as fsdp_analytic prices its rows (the same target)."""
    from benchmarks.fsdp_analytic import cost_model, traced_bytes

    return traced_bytes(cost_model(profile, WORLD), "bf16", checkpointing, WORLD, micro)


def of_group(record: Any, checkpointing: str) -> bool:
    """Whether a trace's spec or a fit is of the FSDP rank group of bf16/``checkpointing``
    (one loss chunk, resharded after forward)."""
    return bool(
        record.parallelism == "fsdp"
        and record.precision == "bf16"
        and record.activation_checkpointing == checkpointing
        and record.loss_chunks == 1
        and record.fsdp_reshard_after_forward
    )


def without_rank_group(profile: Any, checkpointing: str, keep: int | None) -> Any:
    """``profile`` without the FSDP fit of bf16/``checkpointing`` and without its rank traces
    but the one at micro-batch ``keep`` (None: none of them)."""
    memory = tuple(
        t
        for t in profile.memory
        if not of_group(t.spec, checkpointing) or t.spec.micro_batch_size == keep
    )
    fits = tuple(m for m in profile.fits.memory if not of_group(m, checkpointing))
    return dataclasses.replace(
        profile, memory=memory, fits=dataclasses.replace(profile.fits, memory=fits)
    )


def measure() -> list[dict[str, Any]]:
    from profilers.profile_record import load_profile

    profile = load_profile(PROFILE)
    rows = []
    for checkpointing in SETTINGS:
        traced = sorted(
            t.spec.micro_batch_size
            for t in profile.memory
            if of_group(t.spec, checkpointing) and t.spec.grad_accum_steps == 1
        )
        for micro in MICRO:
            row: dict[str, Any] = {
                "checkpointing": checkpointing,
                "micro_batch_size": micro,
                "fit_gib": rank_bytes(profile, checkpointing, micro) / 2**30,
            }
            for keep in traced:
                one = without_rank_group(profile, checkpointing, keep)
                row[f"one_trace_b{keep}_gib"] = rank_bytes(one, checkpointing, micro) / 2**30
            none = without_rank_group(profile, checkpointing, None)
            row["analytic_gib"] = rank_bytes(none, checkpointing, micro) / 2**30
            row["traced_sizes"] = traced
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for checkpointing in SETTINGS:
        group = [r for r in rows if r["checkpointing"] == checkpointing]
        sizes = group[0]["traced_sizes"]
        head = " | ".join(f"one trace, b={b}" for b in sizes)
        lines += [
            f"**bf16/{checkpointing}** (rank traced at micro-batches {sizes})",
            "",
            f"| micro-batch | rank's fit GiB | {head} | analytic (one device) |",
            "| ---: | ---: | " + " | ".join("---:" for _ in sizes) + " | ---: |",
        ]
        for r in group:
            fit = r["fit_gib"]

            def cell(value: float, fit: float = fit) -> str:
                return f"{value:.1f} ({value / fit - 1:+.1%})"

            cells = " | ".join(cell(r[f"one_trace_b{b}_gib"]) for b in sizes)
            lines.append(
                f"| {r['micro_batch_size']} | {fit:.1f} | {cells} | {cell(r['analytic_gib'])} |"
            )
        lines.append("")
    return lines


def main() -> int:
    rows = measure()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fsdp_one_rank.json").write_text(json.dumps(rows, indent=1) + "\n")
    body = table(rows)
    md = [
        "# An FSDP rank from one traced micro-batch size, against the rank's own fit",
        "",
        "Generated by `python benchmarks/fsdp_one_rank.py` from `fsdp_one_rank/profile.json` "
        f"(Qwen3.5's default text config, 8.95B, sequence 4096, bf16; what-if on {WORLD} × "
        f"{TARGET}, FSDP, no accumulation). Per-rank traced bytes, GiB, and the difference "
        "from the rank's fit (from every traced size). Predictions: no GPU ran them.",
        "",
        *body,
    ]
    (RESULTS / "fsdp_one_rank.md").write_text("\n".join(md))
    print("\n".join(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
