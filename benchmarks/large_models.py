"""Large models profiled on this small host, and the what-if plans drawn from those profiles.

Issue 13 item 3: a profile keeps its ``--budget-s`` (within +10%) for any model size, the cheap
parts first, and a model too large for the host is traced without materialising it. Each case
here is the command a user planning a GPU cluster from a laptop-class host would type: a
default-budget ``advisor profile ... --trace-for cuda`` (the model built on the meta device and
traced on fake tensors, from copies of a few of its blocks), then ``advisor recommend
--target ...`` on that profile. Nothing is tuned here; the script only runs the CLI and reads
what it wrote.

For each case the table gives the profile's wall time from the shell (start-up included)
against its budget, what it traced (single-device groups, FSDP rank traces) and skipped, and
the plan (or the one-line reason there is none). The cases run one after the other (two
processes at once would share the two cores and slow both); the raw stdout/stderr and the
profile/plan files are kept under ``results/large_models/<case>/`` so every number can be
re-derived.

    python benchmarks/large_models.py            # all cases, ~25 min on 2 cores
    python benchmarks/large_models.py --only llama-70b mixtral

writes ``results/large_models.{json,md}``. Shapes with ``hf:`` need transformers
(``pip install -e '.[hf]'``); they are built from transformers' default configs, offline.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from profilers.rundir import PLAN, PROBES, PROFILE, REPORT, STUDY  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RAW = RESULTS / "large_models"
BUDGET_S = 120  # advisor profile's default, said explicitly so a changed default shows here
GIB = 2**30


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    profile: str  # advisor profile's model flags (everything but --out/--budget-s/--trace-for)
    recommend: str  # advisor recommend's flags (everything but --profile/--out)


H100_8 = "--target h100-80gb --world-size 8"


def _cluster(world: int) -> str:
    """``world`` H100s, 8 a node, joined by 8 NDR InfiniBand links a node."""
    return f"--target h100-80gb --world-size {world} --nodes {world // 8} --network ib-ndr-400-x8"


LLAMA = "--model llama-1b --model-arg tie_weights=false"
CASES: list[Case] = [
    Case(
        "llama-7b",
        "Llama 2 7B shape, seq 4096",
        f"{LLAMA} --model-arg n_layer=32 --model-arg n_embd=4096 --model-arg n_head=32 "
        "--model-arg n_kv_head=32 --model-arg ffn_hidden=11008 --model-arg vocab_size=32000 "
        "--seq-len 4096",
        f"{H100_8} --global-batch-size 64",
    ),
    Case(
        "qwen3.5-9b",
        "Qwen3.5-9B (`hf:qwen3_5_text`), seq 4096",
        "--model hf:qwen3_5_text --seq-len 4096",
        f"{H100_8} --global-batch-size 32",
    ),
    Case(
        "llama-70b",
        "Llama 3 70B shape, seq 2048",
        f"{LLAMA} --model-arg n_layer=80 --model-arg n_embd=8192 --model-arg n_head=64 "
        "--model-arg n_kv_head=8 --model-arg ffn_hidden=28672 --seq-len 2048",
        f"{_cluster(64)} --global-batch-size 512",
    ),
    Case(
        "mixtral",
        "Mixtral 8x7B (`hf:mixtral`), seq 4096, bf16",
        "--model hf:mixtral --seq-len 4096 --precision bf16",
        f"{_cluster(64)} --global-batch-size 512",
    ),
    Case(
        "maverick",
        "Llama 4 Maverick shape (`hf:llama4_text`, 128 experts every 2nd layer), seq 4096, bf16",
        "--model hf:llama4_text --model-arg interleave_moe_layer_step=2 "
        "--model-arg num_local_experts=128 --seq-len 4096 --precision bf16",
        f"{_cluster(512)} --global-batch-size 2048",
    ),
    Case(
        "deepseek-v3",
        "DeepSeek-V3 (`hf:deepseek_v3`), seq 4096, bf16",
        "--model hf:deepseek_v3 --seq-len 4096 --precision bf16",
        f"{_cluster(1024)} --global-batch-size 4096",
    ),
    Case(
        "jamba",
        "Jamba (`hf:jamba`: Mamba, attention, MoE), seq 4096, bf16",
        "--model hf:jamba --seq-len 4096 --precision bf16",
        f"{_cluster(64)} --global-batch-size 512",
    ),
    Case(
        "zamba2",
        "Zamba2 (`hf:zamba2`: Mamba-2, one shared attention block), seq 4096, bf16",
        "--model hf:zamba2 --seq-len 4096 --precision bf16",
        f"{H100_8} --global-batch-size 64",
    ),
]


def advisor(*args: str) -> list[str]:
    return [sys.executable, "-m", "advisor", *args]


def run(cmd: list[str], log: Path, timeout: float) -> tuple[int, float, str]:
    """(exit code, wall seconds, stderr+stdout) of ``cmd``; its output kept in ``log``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    start = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code = 124
        parts = (exc.stdout, exc.stderr)
        text = "".join(
            p.decode(errors="replace") if isinstance(p, bytes) else p or "" for p in parts
        )
        text += f"\n[killed after {timeout:.0f} s]"
    wall = time.perf_counter() - start
    log.write_text("$ " + " ".join(cmd[2:]) + f"\n[exit {code}, {wall:.1f} s]\n" + text)
    return code, wall, text


def probe_summary(probes_csv: Path) -> dict[str, Any]:
    """Counts of probes.csv's rows by status, and the memory groups it traced."""
    rows = list(csv.DictReader(probes_csv.open())) if probes_csv.exists() else []
    status = Counter(r["status"] for r in rows)
    single: Counter[str] = Counter()
    ranks: Counter[str] = Counter()
    for r in rows:
        if r["status"] != "ok" or r["probe"] not in ("memory", "memory_distributed"):
            continue
        group = f"{r['precision']}/{r['activation_checkpointing']}"
        name = r["name"]
        if r["probe"] == "memory_distributed":
            ranks[group + (" kept gathered" if "kept gathered" in name else "")] += 1
        elif "/lc" in name:
            single[group + " chunked loss"] += 1
        elif "x" in name.rsplit("/b=", 1)[-1]:
            single[group + " accumulating"] += 1
        else:
            single[group] += 1
    budget_rows = [
        r["reason"] for r in rows if r["status"] == "skipped" and "--budget-s" in r["reason"]
    ]
    return {
        "rows": len(rows),
        "status": dict(status),
        "single_traces": dict(single),
        "rank_traces": dict(ranks),
        "a_budget_row": budget_rows[0] if budget_rows else "",
    }


def plan_summary(out: Path) -> dict[str, Any]:
    plan_file = out / PLAN
    if not plan_file.exists():
        return {}
    plan = json.loads(plan_file.read_text())
    c, p, s = plan["config"], plan["predicted"], plan.get("search", {})
    return {
        "precision": c["precision"],
        "activation_checkpointing": c["activation_checkpointing"],
        "parallelism": c["parallelism"],
        "world_size": c["world_size"],
        "micro_batch_size": c["micro_batch_size"],
        "grad_accum_steps": c["grad_accum_steps"],
        "loss_chunks": c.get("loss_chunks", 1),
        "fsdp_reshard_after_forward": c.get("fsdp_reshard_after_forward", True),
        "peak_gib": p["peak_memory_bytes"] / GIB,
        "budget_gib": p["budget_bytes"] / GIB,
        "tokens_per_s": p["tokens_per_s"],
        "space_size": s.get("space_size"),
        "num_feasible": s.get("num_feasible"),
        "search_wall_s": s.get("wall_s"),
    }


def last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:") or "Error" in ln[:40]]
    return (errors or lines or [""])[-1]


def commands(case: Case) -> dict[str, str]:
    return {
        "profile_command": f"advisor profile {case.profile} --trace-for cuda",
        "recommend_command": f"advisor recommend {case.recommend}",
    }


def measure(case: Case) -> dict[str, Any]:
    where = RAW / case.key
    shutil.rmtree(where, ignore_errors=True)
    profile_dir, plan_dir = where / "profile", where / "plan"
    where.mkdir(parents=True)
    code, wall, text = run(
        advisor(
            "profile", *shlex.split(case.profile), "--trace-for", "cuda",
            "--budget-s", str(BUDGET_S), "--out", str(profile_dir), "--quiet",
        ),
        where / "profile.log",
        timeout=BUDGET_S * 6,
    )  # fmt: skip
    profile_json = profile_dir / PROFILE
    row: dict[str, Any] = {
        "case": case.key,
        "title": case.title,
        **commands(case),
        "profile_exit": code,
        "profile_wall_s": wall,
        "budget_s": BUDGET_S,
        "overrun": wall / BUDGET_S - 1.0,
    }
    if profile_json.exists():
        profile = json.loads(profile_json.read_text())
        row["profile_elapsed_s"] = profile.get("elapsed_s")
        row["num_params"] = profile["model"]["num_params"]
        row.update(probe_summary(profile_dir / PROBES))
    else:
        row["profile_error"] = last_error(text)
        return row
    code, wall, text = run(
        advisor(
            "recommend", "--profile", str(profile_json), *shlex.split(case.recommend),
            "--out", str(plan_dir), "--quiet",
        ),
        where / "recommend.log",
        timeout=600,
    )  # fmt: skip
    row["recommend_exit"], row["recommend_wall_s"] = code, wall
    row["plan"] = plan_summary(plan_dir) if code == 0 else {}
    if code != 0:
        row["recommend_error"] = last_error(text)
    # the study database and the report are large and re-derivable: keep the JSON and CSVs
    for junk in (STUDY, REPORT):
        for path in where.rglob(junk):
            path.unlink()
    return row


def traced(counts: dict[str, int]) -> str:
    """ "N: the groups (precision/checkpointing), then the chunked-loss and accumulating ones"."""
    if not counts:
        return "none"
    suffixes = ("", " chunked loss", " accumulating", " kept gathered")
    kinds: dict[str, list[str]] = {k: [] for k in suffixes}
    for group in sorted(counts):
        suffix = next((k for k in kinds if k and group.endswith(k)), "")
        kinds[suffix].append(group.removesuffix(suffix) if suffix else group)
    text = f"{sum(counts.values())}: " + ", ".join(kinds[""])
    for suffix, groups in kinds.items():
        if suffix and groups:
            text += f";{suffix}: " + ", ".join(groups)
    return text


def _gpus(recommend: str) -> str:
    """ "64 (8 nodes)" from a recommend command's --world-size and --nodes."""
    words = recommend.split()
    world = words[words.index("--world-size") + 1]
    nodes = words[words.index("--nodes") + 1] if "--nodes" in words else ""
    return f"{world} ({nodes} nodes)" if nodes else world


def _stop(error: str) -> str:
    """A recommend error in a few words: "nothing fits: X GiB a rank, Y GiB unshrinkable"."""
    needs = re.search(r"needs ([\d.]+) GiB", error)
    fixed = re.search(r"([\d.]+) GiB of each rank do not shrink", error)
    if needs and fixed:
        return f"nothing fits: {needs[1]} GiB a rank, {fixed[1]} GiB of it unshrinkable"
    return error.removeprefix("error: ")


def summary(rows: list[dict[str, Any]]) -> str:
    """The short table the README quotes: one line a model."""
    lines = [
        "| model | params | profile | traces: one device + FSDP ranks | H100-80GB GPUs, "
        "global batch | plan (micro-batch × accumulation) or stop |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "profile_error" in r:
            lines.append(f"| {r['title']} | ? | failed | | | {r['profile_error']} |")
            continue
        p = r.get("plan") or {}
        if p:
            extra = "" if p["loss_chunks"] == 1 else f", loss in {p['loss_chunks']} chunks"
            extra += "" if p["fsdp_reshard_after_forward"] else ", kept gathered"
            outcome = (
                f"{p['precision']}, {p['activation_checkpointing']}, "
                f"{p['parallelism'].upper()}, {p['micro_batch_size']} × {p['grad_accum_steps']}"
                f"{extra}: {p['peak_gib']:.1f} GiB, {p['tokens_per_s'] / 1e3:.1f}k tokens/s"
            )
        else:
            outcome = _stop(r.get("recommend_error", ""))
        words = r["recommend_command"].split()
        batch = words[words.index("--global-batch-size") + 1]
        lines.append(
            f"| {r['title']} | {r['num_params'] / 1e9:.2f}B | {r['profile_wall_s']:.0f} s | "
            f"{sum(r['single_traces'].values())} + {sum(r['rank_traces'].values())} | "
            f"{_gpus(r['recommend_command'])}, {batch} | {outcome} |"
        )
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict[str, Any]]) -> str:
    head = [
        "# Large models profiled on this host (`benchmarks/large_models.py`)",
        "",
        f"Each profile: `--trace-for cuda --budget-s {BUDGET_S}` (the default budget) on this "
        "repository's 2-core CPU host; wall time from the shell, start-up included. Then "
        "`advisor recommend` on it for the target shown. Predictions only: no GPU ran any of "
        "these. Raw logs and files: `results/large_models/<case>/`.",
        "",
        summary(rows),
        "In full:",
        "",
        "| case | params | profile wall (budget 120 s) | probes ok / skipped "
        "| single-device traces | FSDP rank traces | what-if | plan or stop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    body = []
    for r in rows:
        params = f"{r['num_params'] / 1e9:.2f}B" if "num_params" in r else "?"
        wall = f"{r['profile_wall_s']:.0f} s ({r['overrun']:+.0%})"
        if "profile_error" in r:
            body.append(
                f"| {r['title']} | {params} | {wall} | — | — | — | — | "
                f"profile failed: {r['profile_error']} |"
            )
            continue
        st = r["status"]
        probes = f"{st.get('ok', 0)} / {st.get('skipped', 0)}"
        if st.get("failed"):
            probes += f" ({st['failed']} failed)"
        target = " ".join(r["recommend_command"].split()[2:])
        p = r.get("plan") or {}
        if p:
            accum = f" × {p['grad_accum_steps']}"
            extra = "" if p["loss_chunks"] == 1 else f", loss in {p['loss_chunks']} chunks"
            if not p["fsdp_reshard_after_forward"]:
                extra += ", kept gathered"
            outcome = (
                f"{p['precision']} {p['activation_checkpointing']}, {p['parallelism']}×"
                f"{p['world_size']}, micro-batch {p['micro_batch_size']}{accum}{extra}: "
                f"{p['peak_gib']:.1f} GiB of {p['budget_gib']:.1f}, "
                f"{p['tokens_per_s'] / 1e3:.1f}k tokens/s ({p['num_feasible']} of "
                f"{p['space_size']} fit)"
            )
        else:
            outcome = f"exit {r.get('recommend_exit')}: {r.get('recommend_error', '')}"
        body.append(
            f"| {r['title']} | {params} | {wall} | {probes} | {traced(r['single_traces'])} | "
            f"{traced(r['rank_traces'])} | `{target}` | {outcome} |"
        )
    commands = [
        "",
        "The commands (each profile with `--out DIR`, each recommend with `--profile DIR`):",
        "",
    ]
    for r in rows:
        commands += [
            f"- {r['title']}:",
            "  ```",
            f"  {r['profile_command']}",
            f"  {r['recommend_command']}",
            "  ```",
        ]
    return "\n".join(head + body + commands) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="case keys to run (default: all)")
    parser.add_argument(
        "--render", action="store_true", help="re-write the table from the committed JSON only"
    )
    args = parser.parse_args()
    wanted = set(args.only or [c.key for c in CASES])
    unknown = wanted - {c.key for c in CASES}
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; choose from {[c.key for c in CASES]}")
    RAW.mkdir(parents=True, exist_ok=True)
    out_json = RESULTS / "large_models.json"
    previous = json.loads(out_json.read_text())["rows"] if out_json.exists() else []
    rows = {r["case"]: r for r in previous}
    for case in CASES:
        if args.render and case.key in rows:  # the case's words as they read now
            rows[case.key].update(title=case.title, **commands(case))
        if args.render or case.key not in wanted:
            continue
        print(f"{case.key}: profiling ...", flush=True)
        rows[case.key] = measure(case)
        r = rows[case.key]
        print(
            f"  {r['profile_wall_s']:.0f} s ({r['overrun']:+.0%}); "
            + (json.dumps(r.get("plan")) if r.get("plan") else r.get("recommend_error", "")),
            flush=True,
        )
    ordered = [rows[c.key] for c in CASES if c.key in rows]
    out_json.write_text(
        json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": ordered}, indent=1) + "\n"
    )
    text = markdown(ordered)
    (RESULTS / "large_models.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
