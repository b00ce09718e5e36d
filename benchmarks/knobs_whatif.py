"""What the what-if model predicts the knobs of issue 14 gain on H100s, row by row.

The published H100 runs of ``benchmarks/data/published_runs.csv`` (MosaicML llm-foundry: MPT
7B-30B on 8 H100-80GB, FSDP FULL_SHARD, bf16) are the starting points. Each row's own config is
predicted by the library function ``advisor predict --target`` calls
(:func:`advisor.recommending.predict`), then again with ONE knob changed:

* activation checkpointing ``none``, ``ops`` (selective per op), ``ops-half`` (torchtitan's
  per-op policy: every second matmul recomputed too), ``blocks:L/2`` (half the blocks) and
  ``full``;
* the loss in chunks (``loss_chunks``: the count the profiler's own rule picks for the row's
  micro-batch, ``profilers.phases_chunked.chosen_loss_chunks``);
* FSDP blocks kept gathered (``fsdp_reshard_after_forward`` false);
* ``compile`` (the what-if has no measured speed-up for it and says so: the row reports the
  reason, not a number).

Then the search's question at the row's global batch over its 8 GPUs: the best predicted
config that fits the GPU's memory (:data:`MEMORY_BUDGET`), over micro-batch ×
accumulation, with the founding knobs only (checkpointing none/full) against all of them
(ops, ops-half, blocks:K for K = L/4, L/2, 3L/4, chunked loss, kept gathered). These are
predictions of the what-if model (median |error| 4.9% on 26 held-out rows of the same tables,
``whatif_published.py``), not measurements: no GPU ran them.

Profiles are the trace-only profiles of ``whatif_published.py`` (meta facts, 1-/2-layer fake
traces; FSDP ranks traced on 3-/4-block copies), completed here with the modes and knobs the
published rows did not use and cached in the same files (``benchmarks/results/whatif_profiles``).
Tracing a missing shape takes minutes on 2 cores; with the cache the run takes seconds.

Run ``python benchmarks/knobs_whatif.py`` (``--rows R09,R10`` for a subset). Writes
``benchmarks/results/knobs_whatif.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import whatif_published as wp  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
ROWS = ("R09", "R10", "R26", "R27", "R28")
MODES = ("none", "ops", "ops-half", "full")
# A config fits when its budgeted per-rank peak (traced + fixed + fragmentation) is at most the
# GPU's whole memory, as whatif_published.py counts a published run's fit (they ran); the
# product's default --memory-budget 0.9 would leave 10% headroom on top.
MEMORY_BUDGET = 1.0


def complete_profile(row: wp.Row, rows: Sequence[wp.Row], say: Any = print) -> Any:
    """The row's trace-only profile with every mode of :data:`MODES` (single and FSDP), the
    chunked loss and the kept-gathered FSDP rank at the row's checkpointing."""
    extra = [
        dataclasses.replace(row, row=f"{row.row}-{m}", activation_checkpointing=m) for m in MODES
    ]
    profile = wp.profile_for(row, [*rows, *extra], say)
    chunks = wp.chunked_loss_count(row, profile)
    if chunks > 1:
        profile = wp.with_chunked_loss(row, rows, profile, chunks)
    return with_kept_gathered(row, rows, profile, say)


def with_kept_gathered(row: wp.Row, rows: Sequence[wp.Row], profile: Any, say: Any) -> Any:
    """``profile`` plus the FSDP rank's fits with every block kept gathered, for the row's
    checkpointing (3-/4-block copies, extended like the resharded ones), cached."""
    mode = row.activation_checkpointing
    if any(
        m.parallelism == "fsdp"
        and m.activation_checkpointing == mode
        and not m.fsdp_reshard_after_forward
        for m in profile.fits.memory
    ):
        return profile
    t0 = time.perf_counter()
    kept = wp.fsdp_memory_models(
        row,
        (mode,),
        profile.model.num_layers,
        wp.fsdp_sizes(row, rows),
        reshard_after_forward=False,
    )
    say(f"  traced kept-gathered FSDP ranks of {row.label} in {time.perf_counter() - t0:.0f} s")
    memory = (*profile.fits.memory, *kept)
    profile = dataclasses.replace(profile, fits=dataclasses.replace(profile.fits, memory=memory))
    wp.profile_cache().save(row.shape_key, profile.to_dict())
    return profile


def variants(row: wp.Row, profile: Any) -> list[tuple[str, dict[str, Any]]]:
    """(name, TrainConfig changes) of the row's config with one knob changed."""
    layers = profile.model.num_layers
    out: list[tuple[str, dict[str, Any]]] = [("as published", {})]
    for mode in ("none", "ops", "ops-half", f"blocks:{layers // 2}", "full"):
        if mode != row.activation_checkpointing:
            out.append((f"checkpointing {mode}", {"activation_checkpointing": mode}))
    chunks = wp.chunked_loss_count(row, profile)
    if chunks > 1:
        out.append((f"loss in {chunks} chunks", {"loss_chunks": chunks}))
    out.append(("FSDP kept gathered", {"fsdp_reshard_after_forward": False}))
    out.append(("torch.compile", {"compile": True}))
    return out


def cost_model(row: wp.Row, profile: Any) -> Any:
    """The what-if cost model ``advisor predict --target`` builds for the row (one per row: the
    predictions below share it), at :data:`MEMORY_BUDGET`."""
    return wp.row_cost_model(row, profile, MEMORY_BUDGET)


def predict(row: wp.Row, model: Any, changes: dict[str, Any]) -> dict[str, Any]:
    """One prediction as a table row: tokens/s/GPU, per-rank peak, fits; or why none."""
    from strategies.errors import Unpredictable

    try:
        found = model.predict_config(row.config().replace(**changes))
    except Unpredictable as exc:
        return {"reason": str(exc)}
    return {
        "tokens_per_s_per_gpu": found.tokens_per_s / row.n_gpus,
        "peak_gib": found.peak_memory_bytes / 2**30,
        "fits": bool(found.fits),
    }


def best(row: wp.Row, profile: Any, model: Any, all_knobs: bool) -> dict[str, Any]:
    """The fastest predicted config that fits, at the row's global batch over its GPUs (FSDP,
    bf16), over micro-batch × accumulation and the knobs (founding ones, or all)."""
    layers = profile.model.num_layers
    per_rank = row.global_batch_size // row.n_gpus
    modes = ["none", "full"]
    chunks = [1]
    reshard = [True]
    if all_knobs:
        modes += [
            "ops",
            "ops-half",
            *(f"blocks:{k}" for k in sorted({layers // 4, layers // 2, 3 * layers // 4})),
        ]
        if (c := wp.chunked_loss_count(row, profile)) > 1:
            chunks.append(c)
        reshard.append(False)
    top: dict[str, Any] | None = None
    unpredictable = 0
    for mode in modes:
        for micro in (d for d in range(1, per_rank + 1) if per_rank % d == 0):
            for c in chunks:
                for r in reshard:
                    changes = {
                        "activation_checkpointing": mode,
                        "micro_batch_size": micro,
                        "grad_accum_steps": per_rank // micro,
                        "loss_chunks": c,
                        "fsdp_reshard_after_forward": r,
                    }
                    found = predict(row, model, changes)
                    if "reason" in found:
                        unpredictable += 1
                        continue
                    if found["fits"] and (
                        top is None or found["tokens_per_s_per_gpu"] > top["tokens_per_s_per_gpu"]
                    ):
                        top = {**found, **changes}
    return {"best": top, "unpredictable": unpredictable}


def run(
    rows: Sequence[wp.Row], all_rows: Sequence[wp.Row], say: Any = print
) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        say(f"{row.row} {row.label} seq {row.seq_len} on {row.n_gpus} x {row.target}")
        profile = complete_profile(row, all_rows, say)
        model = cost_model(row, profile)
        base = predict(row, model, {})
        knobs = []
        for name, changes in variants(row, profile):
            found = predict(row, model, changes)
            if "tokens_per_s_per_gpu" in found and "tokens_per_s_per_gpu" in base:
                found["vs_published_config"] = (
                    found["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
                )
            knobs.append({"variant": name, **changes, **found})
        founding, every = best(row, profile, model, False), best(row, profile, model, True)
        gain = None
        if founding["best"] and every["best"]:
            gain = every["best"]["tokens_per_s_per_gpu"] / founding["best"]["tokens_per_s_per_gpu"]
        out.append(
            {
                "row": row.row,
                "label": row.label,
                "seq_len": row.seq_len,
                "gpus": row.n_gpus,
                "target": row.target,
                "global_batch_size": row.global_batch_size,
                "published": {
                    "micro_batch_size": row.micro_batch_size,
                    "grad_accum_steps": row.grad_accum_steps,
                    "activation_checkpointing": row.activation_checkpointing,
                    "tokens_per_s_per_gpu": row.tokens_per_s_per_gpu,
                },
                "knobs": knobs,
                "best_founding_knobs": founding,
                "best_all_knobs": every,
                "all_knobs_gain": gain,
            }
        )
    return out


def _cell(k: dict[str, Any]) -> str:
    if "reason" in k:
        return f"not predicted: {k['reason'].split(':')[0]}"
    ratio = k.get("vs_published_config")
    fits = "fits" if k["fits"] else "**does not fit**"
    return (
        f"{k['tokens_per_s_per_gpu']:,.0f} ({ratio:.3f}×), {k['peak_gib']:.1f} GiB, {fits}"
        if ratio is not None
        else f"{k['tokens_per_s_per_gpu']:,.0f}, {k['peak_gib']:.1f} GiB, {fits}"
    )


def _best_cell(found: dict[str, Any]) -> str:
    b = found["best"]
    if b is None:
        return "nothing fits"
    extra = []
    if b["loss_chunks"] > 1:
        extra.append(f"loss in {b['loss_chunks']} chunks")
    if not b["fsdp_reshard_after_forward"]:
        extra.append("kept gathered")
    knobs = ", ".join([b["activation_checkpointing"], *extra])
    return (
        f"{b['tokens_per_s_per_gpu']:,.0f} tok/s/GPU: {knobs}, micro-batch "
        f"{b['micro_batch_size']} × {b['grad_accum_steps']}, {b['peak_gib']:.1f} GiB"
    )


def table_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "# What the what-if predicts the knobs gain on H100s (predictions, no GPU run)",
        "",
        f"Memory budget {MEMORY_BUDGET:.0%} of the GPU's memory. Each knob alone on the published "
        "config: predicted tokens/s/GPU (× the published config's prediction), per-rank peak.",
        "",
    ]
    for r in results:
        p = r["published"]
        lines += [
            f"## {r['row']} {r['label']}, seq {r['seq_len']}, {r['gpus']} × {r['target']}, "
            f"global batch {r['global_batch_size']}",
            "",
            f"Published: {p['activation_checkpointing']}, micro-batch {p['micro_batch_size']} × "
            f"{p['grad_accum_steps']}, {p['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU measured.",
            "",
            "| variant | predicted |",
            "|---|---|",
            *(f"| {k['variant']} | {_cell(k)} |" for k in r["knobs"]),
            "",
            f"- best that fits, founding knobs (none/full): {_best_cell(r['best_founding_knobs'])}",
            f"- best that fits, all knobs: {_best_cell(r['best_all_knobs'])}",
            "- gain of the new knobs: "
            + (f"**{r['all_knobs_gain']:.3f}×**" if r["all_knobs_gain"] else "n/a"),
            "",
        ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated row ids")
    args = parser.parse_args(argv)
    all_rows = wp.read_rows()
    by_id = {r.row: r for r in all_rows}
    wanted = [s.strip() for s in args.rows.split(",") if s.strip()]
    missing = [w for w in wanted if w not in by_id]
    if missing:
        print(f"error: unknown rows {', '.join(missing)}: see {wp.DATA}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    results = run([by_id[w] for w in wanted], all_rows)
    lines = table_lines(results)
    print("\n".join(lines))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "knobs_whatif.json").write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / "knobs_whatif.md").write_text("\n".join(lines) + "\n")
    print(f"wrote benchmarks/results/knobs_whatif.{{json,md}} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
