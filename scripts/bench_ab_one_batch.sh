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
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -m1 "model name" /proc/cpuinfo
grep -o -w -E "avx2|avx512f|avx512_bf16|amx_bf16|amx_tile|avx512_vnni" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
for i in $(seq "$REPEAT"); do
  for tree in "$HERE" "$BASE"; do
    if [ -n "${QUIET:-}" ]; then
      for _ in $(seq 300); do awk -v q="$QUIET" '{exit !($1 < q)}' /proc/loadavg && break; sleep 1; done
    fi
    echo "== round $i: $tree (load $(cut -d' ' -f1 /proc/loadavg))"
    tmp=$(mktemp)
    (cd "$tree" && PYTHONPATH="$tree" "$PY" -m radixlm bench one-batch --output-file "$tmp" "$@" \
      | grep -E "batch [0-9]+:")
    "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); r['tree']=sys.argv[2]; \
print(json.dumps(r))" "$tmp" "$tree" >> "$OUT"
    rm -f "$tmp"
  done
done
