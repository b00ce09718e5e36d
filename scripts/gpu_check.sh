#!/usr/bin/env bash
# One prepared run on a lent GPU: exercises every CUDA path of the advisor and records predicted
# vs measured. Installs nothing from the network: optuna and the five packages it needs that the
# GPU image lacks come from wheels carried in ./wheels (scripts/fetch_gpu_wheels.sh); torch,
# pandas, jinja2, click, rich, nvidia-ml-py and pytest are on the image.
#
#   bash scripts/gpu_check.sh                # on the GPU machine; results in $OUT
#   GPU_CHECK_DEVICE=cpu MODEL=gpt-tiny SEQ=128 REAL_SCALE=0 bash scripts/gpu_check.sh  # CPU dry run
#
# The device tool brings back at most 8 files from $OUT, so the stages write under $WORK and the
# script packs $WORK (no checkpoints) into $OUT/results.tar.gz after every stage: a run cut short
# still returns what it measured. Every stage has its own time limit, all of them inside DEADLINE
# seconds, and the script goes on when one fails; stages.json says which passed. The timed
# stages before the correctness ones leave those their time (RESERVE): the timed limits add up
# to more than the deadline, and a slow real-scale run must cut the next timed run, not the
# checks of the CUDA paths.
#
# Order: the timed stages alone on the GPU (profile -> recommend with validation -> a training
# run of the plan, then real-scale training runs of published model shapes that
# benchmarks/whatif_measured.py predicts with `advisor predict --target h200`), then the
# correctness stages together (the GPU-marked tests -- the compile child with triton and the
# allocator peaks among them --, fp16 with GradScaler, DDP and FSDP through torchrun and NCCL at
# world size 1, `advisor predict`), then one more timed run alone (a mixture of experts, the
# first stage a short deadline skips). Paths covered: CUDA memory stats (max allocated/reserved,
# mem_get_info), NVML, tf32/bf16/fp16 GEMM peaks, CUDA-event timing, fp16 GradScaler, bf16
# autocast, NCCL, torch.compile on CUDA.
set -uo pipefail
cd "$(dirname "$0")/.."

DEVICE=${GPU_CHECK_DEVICE:-cuda}
MODEL=${MODEL:-gpt-small}
SEQ=${SEQ:-1024}
GBS=${GBS:-32}
PROFILE_BUDGET=${PROFILE_BUDGET:-75}
DEADLINE=${DEADLINE:-540}
REAL_SCALE=${REAL_SCALE:-1}
# Seconds the timed stages leave the correctness ones, which run together: they took 37 s on the
# H200 (benchmarks/results/gpu_h200_2026-12-04/stages.json); twice that.
KEEP_FOR_CHECKS=${KEEP_FOR_CHECKS:-75}
PY=${PYTHON:-python3}
OUT=${OUT:-benchmarks/results/gpu}
WORK=${WORK:-/tmp/gpu_check}
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK/status"
LOG="$WORK/log.txt"
: >"$LOG"

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if ! "$PY" -c "import optuna" 2>/dev/null; then
  if [ -d wheels ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      wheels/optuna-*.whl wheels/alembic-*.whl wheels/sqlalchemy-*.whl wheels/greenlet-*.whl \
      wheels/mako-*.whl wheels/colorlog-*.whl >>"$LOG" 2>&1 \
      || echo "optuna install from wheels/ failed" | tee -a "$LOG"
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
  else
    echo "optuna missing and no wheels/ directory: recommend will fail" | tee -a "$LOG"
  fi
fi

pack() {  # what the stages wrote so far, without weights, into $OUT (one file back)
  tar -C "$WORK" --exclude='checkpoints' --exclude='*.pt' --exclude='*.safetensors' \
    --exclude='study.db' -czf "$OUT/results.tar.gz.$BASHPID" . 2>/dev/null \
    && mv "$OUT/results.tar.gz.$BASHPID" "$OUT/results.tar.gz"
  cp "$LOG" "$OUT/log.txt"
}

stage() {  # stage NAME SECONDS COMMAND...: at most SECONDS, never past DEADLINE - RESERVE
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - SECONDS - 15 - RESERVE))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    echo "=== $name: skipped, the deadline is near" | tee -a "$LOG"
    echo "skipped 0" >"$WORK/status/$name"
    return 0
  fi
  echo "=== $name ($(date +%T), limit ${limit}s): $*" | tee -a "$LOG"
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "$rc $((SECONDS - started))" >"$WORK/status/$name"
  tail -n 5 "$WORK/$name.log" | sed "s/^/    [$name] /" >>"$LOG"
  echo "=== $name: exit $rc after $((SECONDS - started))s" | tee -a "$LOG"
  pack
}



RESERVE=0
stage env 30 bash -c "nvidia-smi || true; $PY -c 'import torch, sys; print(sys.version); \
print(torch.__version__, torch.cuda.is_available(), torch.version.cuda, \
torch.cuda.get_device_name() if torch.cuda.is_available() else None)'; \
$PY -c 'import optuna, pynvml; print(\"optuna\", optuna.__version__)'"

# --- timed, alone on the device -------------------------------------------------------------
RESERVE=$KEEP_FOR_CHECKS
stage profile $((PROFILE_BUDGET + 45)) "$PY" -m advisor profile --device "$DEVICE" --model "$MODEL" \
  --seq-len "$SEQ" --budget-s "$PROFILE_BUDGET" --out "$WORK/profile" --quiet
stage recommend 90 "$PY" -m advisor recommend --profile "$WORK/profile/profile.json" \
  --global-batch-size "$GBS" --validate-top "${VALIDATE_TOP:-2}" --device "$DEVICE" --out "$WORK/plan" \
  --quiet
stage train_plan 60 "$PY" -m advisor train --plan "$WORK/plan/plan.json" --steps 20 --device "$DEVICE" \
  --eval-every 0 --eval-batches 1 --checkpoint-every 1000 --quiet --out "$WORK/train_plan"

# A real-scale shape of published runs (llm-foundry's MPT 1B: no bias, vocabulary 50368), one
# GPU, bf16, sequence 2048, without and with full checkpointing: what
# benchmarks/whatif_measured.py predicts for that GPU. 90 s each: building 1.3B parameters on
# the host and the final checkpoint (16 GB with the optimizer state) take most of it.
mpt() {  # mpt NAME N_LAYER N_HEAD N_EMBD MICRO_BATCH CHECKPOINTING
  stage "real_$1" 90 "$PY" -m advisor train --model gpt-small --model-arg "n_layer=$2" \
    --model-arg "n_head=$3" --model-arg "n_embd=$4" --model-arg vocab_size=50368 \
    --model-arg bias=false --model-arg block_size=2048 --seq-len 2048 --data synthetic --precision bf16 \
    --micro-batch-size "$5" --grad-accum-steps 1 --activation-checkpointing "$6" --steps 10 \
    --eval-every 0 --eval-batches 1 --checkpoint-every 1000 --device "$DEVICE" --quiet --out "$WORK/real_$1"
  rm -rf "$WORK/real_$1/checkpoints"  # the final checkpoint: up to 17 GB of a 64 GB disk
}
# Eager attention beside SDPA at one shape (MPT 125M, sequence 2048, bf16, micro-batch 4): the
# same model but for how its attention runs (benchmarks/models/eager_gpt.py writes it out by
# hand), so whatif_measured.py holds the what-if's pricing of eager attention (its counted
# traffic over the T×T scores, profilers/eager_attention.py) and the predicted eager/SDPA ratio
# against measured ones. ~30 s each: a 125M model builds and saves quickly.
attn() {  # attn NAME MODEL
  stage "real_$1" 60 "$PY" -m advisor train --model "$2" --model-arg n_layer=12 \
    --model-arg n_head=12 --model-arg n_embd=768 --model-arg vocab_size=50368 \
    --model-arg bias=false --model-arg block_size=2048 --seq-len 2048 --data synthetic --precision bf16 \
    --micro-batch-size 4 --grad-accum-steps 1 --activation-checkpointing none --steps 10 \
    --eval-every 0 --eval-batches 1 --checkpoint-every 1000 --device "$DEVICE" --quiet --out "$WORK/real_$1"
  rm -rf "$WORK/real_$1/checkpoints"
}
# A mixture of experts at the same shape (every MLP 8 experts, 2 per token: 0.5B parameters),
# run as transformers runs MoE layers (benchmarks/models/moe_gpt.py: torch._grouped_mm over the
# stacked experts, the rows cast to the fp32 weights' dtype first): whatif_measured.py holds the
# what-if's expert pricing (profilers/expert_gemms.py) against it, and its bf16 run is the
# check that autocast reaches the grouped GEMMs on CUDA (advisor/trainer/autocast_ops.py).
moe() {  # moe NAME
  stage "real_$1" 60 "$PY" -m advisor train --model benchmarks/models/moe_gpt.py:moe_gpt \
    --model-arg n_layer=12 --model-arg n_head=12 --model-arg n_embd=768 --model-arg vocab_size=50368 \
    --model-arg bias=false --model-arg block_size=2048 --model-arg n_experts=8 --model-arg top_k=2 \
    --seq-len 2048 --data synthetic --precision bf16 \
    --micro-batch-size 4 --grad-accum-steps 1 --activation-checkpointing none --steps 10 \
    --eval-every 0 --eval-batches 1 --checkpoint-every 1000 --device "$DEVICE" --quiet --out "$WORK/real_$1"
  rm -rf "$WORK/real_$1/checkpoints"
}
if [ "$REAL_SCALE" = 1 ]; then
  mpt mpt1b_mb8_none 24 16 2048 8 none
  mpt mpt1b_mb16_full 24 16 2048 16 full
  attn mpt125m_mb4_sdpa gpt-small
  attn mpt125m_mb4_eager benchmarks/models/eager_gpt.py:eager_gpt
fi

# --- correctness, together -----------------------------------------------------------------
# The files that hold GPU-marked tests, named: collecting the whole suite would import
# packages the GPU image lacks (the export stacks' deepspeed, torchtitan, ...).
GPU_TEST_FILES=$(grep -rl "mark.gpu" tests | sort)
RESERVE=0
# shellcheck disable=SC2086
stage gpu_tests 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider -n 4 $GPU_TEST_FILES &
stage train_fp16 90 "$PY" -m advisor train --model "$MODEL" --seq-len "$SEQ" --precision fp16 \
  --micro-batch-size 4 --steps 10 --eval-every 0 --eval-batches 1 --checkpoint-every 1000 --device "$DEVICE" \
  --quiet --out "$WORK/train_fp16" &
for parallelism in ddp fsdp; do
  stage "train_${parallelism}_w1" 120 "$PY" -m advisor train --model "$MODEL" --seq-len "$SEQ" \
    --precision bf16 --parallelism "$parallelism" --world-size 1 --micro-batch-size 4 \
    --steps 10 --eval-every 0 --eval-batches 1 --checkpoint-every 1000 --device "$DEVICE" --quiet \
    --out "$WORK/train_${parallelism}_w1" &
done
stage predict 60 "$PY" -m advisor predict --profile "$WORK/profile/profile.json" --seq-len "$SEQ" \
  --global-batch-size "$GBS" --micro-batch-size 8 --precision bf16 &
wait

# --- timed again, alone: after the correctness stages so that a short deadline cuts this run,
# not them (the limits of the timed stages before add up to more than the deadline) ---------
if [ "$REAL_SCALE" = 1 ]; then
  moe moe8x125m_mb4
fi

"$PY" - "$WORK" >"$WORK/stages.json" <<'EOF'
import json, pathlib, sys
status = pathlib.Path(sys.argv[1]) / "status"
stages = {}
for f in sorted(status.iterdir()):
    rc, secs = f.read_text().split()
    stages[f.name] = {"exit": None if rc == "skipped" else int(rc), "seconds": int(secs)}
print(json.dumps(stages, indent=1))
EOF
"$PY" scripts/gpu_summary.py "$WORK" | tee -a "$LOG"
cp "$WORK/summary.md" "$WORK/summary.json" "$OUT/" 2>/dev/null
pack
