#!/usr/bin/env bash
# OMP_WAIT_POLICY on an idle machine and beside a busy neighbour (docs/tuning.md,
# "Threads"; docs/benchmarks.md): one-batch decode of the default model at batch 1 and 32
# with libgomp's default (spin, then sleep) and with PASSIVE, alone and while one other
# process spins on a core (a bounded busy loop, killed after each run). Interleaved
# rounds; JSON lines to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
R=${R:-.venv/bin/radixlm}
OUT=${OUT:-bench_out/threads.jsonl}
REPEAT=${REPEAT:-2}
mkdir -p "$(dirname "$OUT")"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
run() {  # $1 = policy (default|PASSIVE), $2 = neighbour (none|busy)
  local pid=""
  if [ "$2" = busy ]; then
    timeout 300 python3 -c "while True: pass" & pid=$!
  fi
  echo "== OMP_WAIT_POLICY=$1, neighbour $2"
  if [ "$1" = default ]; then
    env -u OMP_WAIT_POLICY "$R" bench one-batch --batch-sizes 1 32 --decode-steps 16 \
      --output-file "$OUT" | tail -4
  else
    OMP_WAIT_POLICY="$1" "$R" bench one-batch --batch-sizes 1 32 --decode-steps 16 \
      --output-file "$OUT" | tail -4
  fi
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
}
for i in $(seq "$REPEAT"); do
  for neighbour in none busy; do
    for policy in default PASSIVE; do
      run "$policy" "$neighbour"
    done
  done
done
