#!/usr/bin/env bash
# The CPU fast path's measurements (docs/benchmarks.md, "CPU fast path"), in one run:
#   1. one-batch decode (batch 1, 8, 32) per weight format, interleaved over repeats;
#   2. prefill of one 1024-token prompt per format;
#   3. through the HTTP API with default flags: 1 stream x 64 tokens and 32 concurrent x
#      96 tokens, with transformers' generate (its best dtype here) on the same requests;
#   4. llama-server on the same GGUF (if built: scripts/build_llama_server.sh), 1/8/32 streams;
#   5. OMP_WAIT_POLICY default vs PASSIVE, alone and beside a busy neighbour (one process
#      spinning on a core, bounded and killed after each run): one-batch decode, batch 1/32;
#   6. the CPU's serial loop (default) vs the overlap loop through the HTTP API, 1 stream.
# SKIP_ONE_BATCH=1, SKIP_SERVE=1, SKIP_LLAMA=1, SKIP_THREADS=1, SKIP_OVERLAP=1
# leave a part out.
# QUIET=0.5: before every run, wait (up to 5 min) until the 1-minute load average is
# below 0.5, so that no run starts in the wake of the one before (default: no wait).
# Results are appended as JSON lines to $OUT (default bench_out/cpu_fast_path.jsonl).
# Run it on a quiet machine (it prints the load average first).
set -euo pipefail
cd "$(dirname "$0")/.."
R=${R:-.venv/bin/radixlm}
OUT=${OUT:-bench_out/cpu_fast_path.jsonl}
REPEAT=${REPEAT:-3}
mkdir -p "$(dirname "$OUT")"
. scripts/quiet.sh
machine_header

declare -A FORMATS=(
  [f32]="--dtype float32 --engine-arg quantization=none"
  [bf16-dense]="--dtype bfloat16 --engine-arg quantization=none --engine-arg disable_weight_prepack=true"
  [bf16-prepacked]="--dtype bfloat16 --engine-arg quantization=none"
  [int4]="--dtype bfloat16 --engine-arg quantization=auto"
)
ORDER=(f32 bf16-dense bf16-prepacked int4)

if [ "${SKIP_ONE_BATCH:-0}" != 1 ]; then
  for i in $(seq "$REPEAT"); do
    for f in "${ORDER[@]}"; do
      echo "== one-batch decode: $f (round $i)"; quiet
      # shellcheck disable=SC2086
      $R bench one-batch ${FORMATS[$f]} --batch-sizes 1 8 32 --decode-steps 16 \
        --output-file "$OUT" | tail -5
    done
  done
  for i in $(seq "$REPEAT"); do
    for f in "${ORDER[@]}"; do
      echo "== one-batch prefill 1024: $f (round $i)"; quiet
      # shellcheck disable=SC2086
      $R bench one-batch ${FORMATS[$f]} --batch-sizes 1 --prompt-len 1024 --decode-steps 2 \
        --output-file "$OUT" | tail -4
    done
  done
fi

if [ "${SKIP_SERVE:-0}" != 1 ]; then
  # One run per server start (a server instance's speed varies between starts), seeds
  # 10, 20, 30, ...: 1 stream x 64 tokens and 32 concurrent x 96, each beside transformers.
  for i in $(seq "$REPEAT"); do
    for spec in "1 4 64" "32 32 96"; do
      set -- $spec
      echo "== HTTP API, default flags, concurrency $1 x $3 tokens, vs transformers (start $i)"
      quiet
      $R bench serve --dataset random --num-prompts "$2" --random-input-len 128 \
        --random-output-len "$3" --random-range-ratio 1 --max-concurrency "$1" --repeat 1 \
        --seed $((10 * i)) --llama-server none --transformers-baseline auto --disable-tqdm \
        --output-file "$OUT" | grep -E "^\[repeat"
    done
  done
fi

if [ "${SKIP_LLAMA:-0}" != 1 ] && [ -x .llama_cpp/bin/llama-server ]; then
  echo "== llama-server vs radixlm, 32 prompts x 128 tokens, 64 output, 1/8/32 streams"
  quiet
  $R bench serve --dataset random --num-prompts 32 --random-input-len 128 \
    --random-output-len 64 --random-range-ratio 1 --max-concurrency 1 8 32 --repeat 1 \
    --disable-tqdm --output-file "$OUT"
fi

threads_run() {  # $1 = policy (default|PASSIVE), $2 = neighbour (none|busy)
  local pid=""
  quiet
  if [ "$2" = busy ]; then
    timeout 300 python3 -c "while True: pass" & pid=$!
  fi
  echo "== threads: OMP_WAIT_POLICY=$1, neighbour $2"
  if [ "$1" = default ]; then
    env -u OMP_WAIT_POLICY "$R" bench one-batch --batch-sizes 1 32 --decode-steps 16 \
      --output-file "$OUT" | tail -4
  else
    OMP_WAIT_POLICY="$1" "$R" bench one-batch --batch-sizes 1 32 --decode-steps 16 \
      --output-file "$OUT" | tail -4
  fi
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; fi
}
if [ "${SKIP_THREADS:-0}" != 1 ]; then
  for i in $(seq "$REPEAT"); do
    for neighbour in none busy; do
      for policy in default PASSIVE; do
        threads_run "$policy" "$neighbour"
      done
    done
  done
fi

if [ "${SKIP_OVERLAP:-0}" != 1 ]; then
  echo "== serial (CPU default) vs overlap scheduler loop, HTTP API, 1 stream x 64 tokens"
  quiet
  $R bench serve --dataset random --num-prompts 4 --random-input-len 128 \
    --random-output-len 64 --random-range-ratio 1 --max-concurrency 1 --repeat "$REPEAT" \
    --llama-server none --ablation overlap:disable_overlap_schedule=false --disable-tqdm \
    --output-file "$OUT"
fi
