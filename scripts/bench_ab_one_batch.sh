#!/usr/bin/env bash
# A/B of `radixlm bench one-batch` between this checkout and another one (e.g. a worktree
# of the commit before a change: git worktree add ../base HEAD~1), interleaved over
# REPEAT rounds, each run its own process, with this checkout's venv:
#   scripts/bench_ab_one_batch.sh ../base [more one-batch flags]
# Results: one-batch's JSON lines in $OUT (default bench_out/ab_one_batch.jsonl), each with
# a "tree" field naming the checkout that ran.
# QUIET=0.5 waits (up to 5 min) before each run for the 1-minute load average to drop.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=$(cd "$1" && pwd); shift
HERE=$(pwd)
PY=${PY:-$HERE/.venv/bin/python}
OUT=${OUT:-bench_out/ab_one_batch.jsonl}
REPEAT=${REPEAT:-3}
mkdir -p "$(dirname "$OUT")"
. scripts/quiet.sh
machine_header
for i in $(seq "$REPEAT"); do
  for tree in "$HERE" "$BASE"; do
    quiet
    echo "== round $i: $tree (load $(cut -d' ' -f1 /proc/loadavg))"
    tmp=$(mktemp)
    (cd "$tree" && PYTHONPATH="$tree" "$PY" -m radixlm bench one-batch --output-file "$tmp" "$@" \
      | grep -E "batch [0-9]+:")
    "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); r['tree']=sys.argv[2]; \
print(json.dumps(r))" "$tmp" "$tree" >> "$OUT"
    rm -f "$tmp"
  done
done
