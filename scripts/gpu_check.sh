#!/usr/bin/env bash
# One prepared check for a GPU machine with no internet (issue 9): the GPU tests, then
# short benchmarks, then a summary table (printed last, also in $OUT/summary.txt).
#
#   scripts/gpu_check.sh                 # on the GPU machine, from the repo root
#   scripts/gpu_check.sh --cpu-dry-run   # here: same steps on the CPU, tiny shapes
#
# Options: --budget SECONDS (default 480: every step is cut to what is left of it, and
# skipped when under 15 s are left), --cpu-dry-run.
# Environment: OUT (output folder, default ./gpu_check_out), PYTHON (default python3, or
# .venv/bin/python in a dry run).
# Missing pure-Python dependencies travel as wheels: run scripts/gpu_wheels.sh here first
# (it fills the git-ignored .whl/), carry .whl, and this script installs them into
# /tmp/radixlm_site. Every step is guarded: a failure or timeout is recorded in the
# summary and the script goes on. Files under $OUT: gpu_check.log (all output),
# steps.tsv, bench.jsonl (benchmark JSON lines), summary.txt.
set -u
cd "$(dirname "$0")/.."

BUDGET=480
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry-run) DRY=1 ;;
    --budget) BUDGET="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"; STEPS="$OUT/steps.tsv"; BENCH="$OUT/bench.jsonl"
: >"$LOG"; : >"$STEPS"; : >"$BENCH"
if [ -z "${PYTHON:-}" ]; then
  if [ $DRY = 1 ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
WORK="$(mktemp -d /tmp/radixlm_gpu_check.XXXXXX)"
DEADLINE=$((SECONDS + BUDGET))
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# step NAME LIMIT_S CMD...: run CMD under min(LIMIT_S, time left); record the outcome.
step() {
  local name="$1" limit="$2"; shift 2
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 15 ]; then
    printf '%s\tSKIPPED\t0\tout of the %s s budget\n' "$name" "$BUDGET" >>"$STEPS"; return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== [$name] (limit ${limit}s) $*" | tee -a "$LOG"
  local t0=$SECONDS rc
  timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1; rc=$?
  local status=ok
  if [ $rc = 124 ] || [ $rc = 137 ]; then status="TIMEOUT"; elif [ $rc != 0 ]; then status="FAIL(rc=$rc)"; fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" $((SECONDS - t0)) "grep -n '\[$name\]' gpu_check.log" >>"$STEPS"
  echo "=== [$name] $status in $((SECONDS - t0))s" | tee -a "$LOG"
  [ $rc = 0 ]
}

# --- 0. wheels of our pure-Python deps the machine lacks (gguf, pyzmq; see gpu_wheels.sh)
if ls .whl/*.whl >/dev/null 2>&1; then
  step wheels 60 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/radixlm_site .whl/*.whl \
    && export PYTHONPATH="/tmp/radixlm_site${PYTHONPATH:+:$PYTHONPATH}"
fi

# --- 1. environment
step env 30 bash -c "nvidia-smi || true; $PYTHON -c 'import sys, torch; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available()); \
import triton; print(\"triton\", triton.__version__); \
torch.cuda.is_available() and print(torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'"
step import 60 "$PYTHON" -c "import radixlm.engine, radixlm.attention.triton_backend, radixlm.bench.offline; print('ok')"

if [ $DRY = 1 ]; then
  ARCH=90; DEVICE_ARGS=(--engine-arg device=cpu); DTYPE=float32
  PRESETS=(tiny); MODEL_DEVICE=cpu
  OFFLINE=(--num-prompts 4 --input-len-min 8 --input-len-max 16 --output-len 4 --repeat 1
           --max-running-requests 4 --max-total-tokens 512 --num-threads 2)
  ONE_BATCH=(--batch-sizes 1 2 --prompt-len 8 --decode-steps 2 --copy-mib 8 --num-threads 2)
  OVERLAP=(--num-prompts 4 --output-len 4 --repeat 1 --num-threads 2
           --engine-arg max_total_tokens=512 --engine-arg max_running_requests=4)
  TESTS=(tests/unit/test_triton_attention.py -k "default_tiles or mixed")
  COMPILE_DTYPES=(bf16)
else
  ARCH=$("$PYTHON" -c "import torch; c = torch.cuda.get_device_capability(); print(c[0] * 10 + c[1])" 2>/dev/null || echo 90)
  DEVICE_ARGS=(); DTYPE=auto
  PRESETS=(smollm2-135m llama-1b); MODEL_DEVICE=cuda
  OFFLINE=(--num-prompts 128 --input-len-min 128 --input-len-max 512 --output-len 128
           --repeat 2 --max-running-requests 128 --max-total-tokens 131072)
  ONE_BATCH=(--batch-sizes 1 32 128 --prompt-len 512 --decode-steps 16 --repeat 2)
  OVERLAP=(--num-prompts 64 --output-len 64 --repeat 3)
  COMPILE_DTYPES=(bf16 fp32)
  TESTS=(tests/unit/test_triton_attention.py tests/unit/test_triton_compile.py
         tests/integration/test_triton_engine.py tests/integration/test_decode_graphs.py
         tests/unit/test_cuda_streams.py tests/unit/test_cuda_overlap.py)
fi

# --- 2. the kernels compile for this GPU; the triton backend equals the torch backend
step compile 120 env -u TRITON_INTERPRET "$PYTHON" -m radixlm.attention.triton_kernels.compile_check \
  --arch "$ARCH" --dtype "${COMPILE_DTYPES[@]}"
XDIST=()
"$PYTHON" -c "import xdist" 2>/dev/null && [ $DRY = 0 ] && XDIST=(-n 4)
step tests 200 "$PYTHON" -m pytest -q -ra -p no:cacheprovider "${XDIST[@]}" "${TESTS[@]}"

# --- 3. random-weight models of real shapes (no weights can be downloaded)
MODELS=()
for preset in "${PRESETS[@]}"; do
  step "model-$preset" 90 "$PYTHON" scripts/random_llama.py --preset "$preset" \
    --out "$WORK/$preset" --device "$MODEL_DEVICE" \
    --dtype "$([ $DRY = 1 ] && echo float32 || echo bfloat16)" && MODELS+=("$WORK/$preset")
done

# Ablations that exist in this checkout's ServerArgs (the flags land in several issues).
has_flag() { "$PYTHON" -c "import dataclasses, sys; from radixlm.config import ServerArgs; \
sys.exit(0 if '$1' in {f.name for f in dataclasses.fields(ServerArgs)} else 1)" 2>/dev/null; }
ABLATIONS=(--ablation torch-attn:attention_backend=torch)
has_flag disable_overlap_schedule && ABLATIONS+=(--ablation no-overlap:disable_overlap_schedule=true)
has_flag disable_cuda_graph && ABLATIONS+=(--ablation no-cuda-graph:disable_cuda_graph=true)

# In a dry run the triton engine runs interpreted: set only for the benchmark steps.
bench() {
  if [ $DRY = 1 ]; then TRITON_INTERPRET=1 "$PYTHON" -m radixlm bench "$@"
  else "$PYTHON" -m radixlm bench "$@"; fi
}
export -f bench; export DRY PYTHON

# --- 4. offline throughput: triton (+ overlap, + cuda graphs when present) vs ablations
for m in "${MODELS[@]}"; do
  step "offline-$(basename "$m")" 150 bash -c 'bench "$@"' _ offline --model "$m" --dtype "$DTYPE" \
    --baseline none "${OFFLINE[@]}" "${DEVICE_ARGS[@]}" --engine-arg attention_backend=triton \
    "${ABLATIONS[@]}" --output-file "$BENCH"
done

# --- 5. one-batch decode: step time, achieved bandwidth, share of the measured roofline
# (triton with CUDA graphs -- the default on CUDA --, triton eager, torch).
for m in "${MODELS[@]}"; do
  for variant in triton triton-no-graph torch; do
    case $variant in
      triton-no-graph) EARGS=(--engine-arg attention_backend=triton
                              --engine-arg disable_cuda_graph=true) ;;
      *) EARGS=(--engine-arg attention_backend=$variant) ;;
    esac
    step "one-batch-$(basename "$m")-$variant" 90 bash -c 'bench "$@"' _ one-batch --model "$m" \
      --dtype "$DTYPE" "${ONE_BATCH[@]}" "${DEVICE_ARGS[@]}" "${EARGS[@]}" --output-file "$BENCH"
  done
done

# --- 6. overlap on vs off with the device-clock bubble (issue 5's < 2% and 1.1x goals)
for m in "${MODELS[@]}"; do
  step "overlap-$(basename "$m")" 120 bash -c 'bench "$@"' _ overlap --model "$m" \
    --workload decode "${OVERLAP[@]}" "${DEVICE_ARGS[@]}" --engine-arg dtype=$DTYPE \
    --output-file "$BENCH"
done

rm -rf "$WORK"
"$PYTHON" scripts/gpu_check_summary.py "$OUT" | tee "$OUT/summary.txt"
