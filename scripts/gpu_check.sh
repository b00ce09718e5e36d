#!/usr/bin/env bash
# One prepared run on a lent GPU: exercises every CUDA path of the advisor and records predicted
# vs measured. Installs nothing from the network: optuna and its dependencies come from wheels
# carried in ./wheels (see scripts/fetch_gpu_wheels.sh); torch, pandas, jinja2, click, rich and
# nvidia-ml-py are on the GPU image.
#
#   bash scripts/gpu_check.sh                # on the GPU machine; results in $OUT
#   GPU_CHECK_DEVICE=cpu MODEL=gpt-tiny SEQ=128 bash scripts/gpu_check.sh   # dry run on a CPU
#
# Each stage has its own time limit and the script goes on when one fails; summary.json says
# which passed. Paths covered: CUDA memory stats (max allocated/reserved, mem_get_info), NVML,
# tf32/bf16/fp16 GEMM peaks, CUDA-event timing, fp16 GradScaler, bf16 autocast, NCCL through
# torchrun (DDP and FSDP at world size 1, and the comm probe when several GPUs are visible),
# the GPU-marked tests (the compile probe's child with triton and the allocator peaks among them),
# and profile -> recommend -> train with predicted vs measured.
set -uo pipefail
cd "$(dirname "$0")/.."

DEVICE=${GPU_CHECK_DEVICE:-cuda}
MODEL=${MODEL:-gpt-small}
SEQ=${SEQ:-1024}
GBS=${GBS:-32}
PROFILE_BUDGET=${PROFILE_BUDGET:-150}
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: > "$LOG"
declare -A STATUS

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1

if ! python -c "import optuna" 2>/dev/null; then
  if [ -d wheels ]; then
    python -m pip install -q --no-index --find-links wheels optuna >>"$LOG" 2>&1 \
      || echo "optuna install from wheels/ failed" | tee -a "$LOG"
  else
    echo "optuna missing and no wheels/ directory: recommend will fail" | tee -a "$LOG"
  fi
fi

stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $name ($(date +%T), limit ${limit}s): $*" | tee -a "$LOG"
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  STATUS[$name]="$rc $((SECONDS - started))"
  echo "=== $name: exit $rc after $((SECONDS - started))s" | tee -a "$LOG"
  return 0
}

advisor() { python -m advisor "$@"; }

stage env 30 bash -c "nvidia-smi || true; python -c 'import torch; print(torch.__version__, torch.cuda.is_available(), torch.version.cuda)'"
stage gpu_tests 210 python -m pytest -q -m gpu -p no:cacheprovider tests
stage profile $((PROFILE_BUDGET + 90)) advisor profile --device "$DEVICE" --model "$MODEL" \
  --seq-len "$SEQ" --budget-s "$PROFILE_BUDGET" --out "$OUT/profile" --quiet
stage predict 60 advisor predict --profile "$OUT/profile/profile.json" --seq-len "$SEQ" \
  --global-batch-size "$GBS" --micro-batch-size 8 --precision bf16
stage recommend 240 advisor recommend --profile "$OUT/profile/profile.json" \
  --global-batch-size "$GBS" --validate-top 3 --device "$DEVICE" --out "$OUT/plan" --quiet
stage train_plan 150 advisor train --plan "$OUT/plan/plan.json" --steps 30 --device "$DEVICE" \
  --eval-every 0 --quiet --out "$OUT/train_plan"
for precision in fp16 bf16; do
  stage "train_$precision" 90 advisor train --model "$MODEL" --seq-len "$SEQ" --precision "$precision" \
    --micro-batch-size 4 --steps 10 --eval-every 0 --device "$DEVICE" --quiet \
    --out "$OUT/train_$precision"
done
for parallelism in ddp fsdp; do
  stage "train_${parallelism}_w1" 120 advisor train --model "$MODEL" --seq-len "$SEQ" \
    --precision bf16 --parallelism "$parallelism" --world-size 1 --micro-batch-size 4 --steps 10 \
    --eval-every 0 --device "$DEVICE" --quiet --out "$OUT/train_${parallelism}_w1"
done

{
  echo "{"
  first=1
  for name in "${!STATUS[@]}"; do
    read -r rc secs <<<"${STATUS[$name]}"
    [ $first -eq 1 ] || echo ","
    first=0
    printf '  "%s": {"exit": %s, "seconds": %s}' "$name" "$rc" "$secs"
  done
  echo
  echo "}"
} > "$OUT/stages.json"
python scripts/gpu_summary.py "$OUT" | tee -a "$LOG"
