#!/usr/bin/env bash
# Decode throughput of the new model families, radixlm vs transformers `generate`, side by
# side (`radixlm bench offline`, engines interleaved within each run, medians over
# REPEAT): Gemma 3 270M (Q4_K_M GGUF, the packaged test model) and a tiny random Qwen3-MoE
# (scripts/random_moe.py), each at batch 1 (4 requests, one at a time: radixlm
# --max-running-requests 1, transformers static batches of 1) and batch 32 (32 requests
# at once). Short prompts (32-64 tokens) and OUTPUT_LEN (64) output tokens, so decode
# dominates; float32, greedy, ignore_eos. N1 (4): requests of the batch-1 runs.
#
# QUIET=1.0: before each run wait (up to 5 min) for the 1-minute load average to drop
# below 1.0. Results: JSON lines appended to $OUT (default bench_out/families.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench_out/families.jsonl}
REPEAT=${REPEAT:-3}
OUTPUT_LEN=${OUTPUT_LEN:-64}
N1=${N1:-4}  # requests of the batch-1 runs
MOE=${MOE:-bench_out/tiny-moe}
mkdir -p "$(dirname "$OUT")"
. scripts/quiet.sh
machine_header
GEMMA=$($PY -c "from radixlm.models.packaged import gemma3_270m_gguf; print(gemma3_270m_gguf())")
[ -d "$MOE" ] || $PY scripts/random_moe.py --out "$MOE"
for model in "$GEMMA" "$MOE"; do
  for bs in 1 32; do
    n=$([ "$bs" = 1 ] && echo "$N1" || echo 32)
    quiet
    echo "== $model batch $bs (load $(cut -d' ' -f1 /proc/loadavg))"
    $PY -m radixlm bench offline --model "$model" --dtype float32 --num-prompts "$n" \
      --input-len-min 32 --input-len-max 64 --output-len "$OUTPUT_LEN" --max-running-requests "$bs" \
      --baseline-batch-size "$bs" --max-total-tokens 8192 --repeat "$REPEAT" \
      --output-file "$OUT" 2>&1 | grep --line-buffered -v -E "Loading|it/s\]"
  done
done
