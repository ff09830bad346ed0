#!/usr/bin/env bash
# radixlm against its peers through the HTTP API, default flags on every side, the same
# GGUF weights and the same random prompts (issue 26's "Measure"): transformers `generate`
# (in-process, its fastest dtype here), llama.cpp's `llama-server` at its defaults
# (`--no-repack` only on AMX Xeons, which `radixlm bench serve` adds itself) and vLLM's CPU
# backend. One `radixlm bench serve` per model starts radixlm and llama-server itself and
# runs transformers beside them (their caches emptied between runs); vLLM is started here,
# once per concurrency, and measured with `--base-url`.
#
#   scripts/bench_peers.sh                       # default model and Gemma 3 270M
#   MODELS=default CONCURRENCY="8 32" PEERS=vllm scripts/bench_peers.sh
#
# Set-up, once (never part of `make test`): scripts/build_llama_server.sh, and
# ../shared/peers/setup_vllm_cpu.sh .peers (its model dir is the default GGUF in bf16);
# for Gemma, `python scripts/gguf_to_hf.py GEMMA.gguf .peers/gemma3-270m-hf` (in the vLLM
# venv). A peer that is not set up is skipped with a line that says so.
# VLLM_ARGS: more `vllm serve` flags (e.g. "--dtype float32": its start script asks for
# bfloat16, the checkpoint's dtype, which an AVX2-only CPU emulates).
# QUIET=0.5 waits before each run until the load average is below 0.5 (scripts/quiet.sh).
# Results: JSON lines appended to $OUT (default bench_out/peers.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
R=${R:-.venv/bin/radixlm}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench_out/peers.jsonl}
MODELS=${MODELS:-"default gemma"}
PEERS_DIR=${PEERS_DIR:-.peers}
VLLM_PORT=${VLLM_PORT:-30123}
NUM_PROMPTS=${NUM_PROMPTS:-32}
PEERS=${PEERS:-"radixlm vllm"}  # radixlm: radixlm + llama-server + transformers in one run
mkdir -p "$(dirname "$OUT")"
. scripts/quiet.sh
machine_header

load() {  # the common load: random 128-token prompts, 64 output tokens, fixed seed
  echo --dataset random --num-prompts "$NUM_PROMPTS" --random-input-len 128 \
    --random-output-len 64 --random-range-ratio 1 --seed 7 --disable-tqdm \
    --output-file "$OUT"
}

vllm_run() {  # $1 = HF model dir, $2 = one concurrency; model_args: the same prompts' tokenizer
  if [ ! -x "$PEERS_DIR/vllm-venv/bin/vllm" ] || [ ! -f "$1/config.json" ]; then
    echo "== vLLM CPU: not set up ($PEERS_DIR/vllm-venv, $1): skipped"; return 0
  fi
  # A fresh vLLM per concurrency: its prefix cache (on by default, no reset endpoint
  # outside its dev mode) would otherwise serve the repeated prompts of the next run.
  echo "== vLLM CPU on $1, concurrency $2${VLLM_ARGS:+ ($VLLM_ARGS)}"
  quiet
  # shellcheck disable=SC2086
  PEERS_DIR="$PEERS_DIR" VLLM_MODEL_DIR="$1" setsid ../shared/peers/start_vllm_cpu.sh \
    "$VLLM_PORT" --served-model-name peer ${VLLM_ARGS:-} > bench_out/vllm_server.log 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$VLLM_PORT/health" >/dev/null && break
    kill -0 "$pid" 2>/dev/null || { echo "vLLM exited (bench_out/vllm_server.log)"; return 0; }
    sleep 1
  done
  # shellcheck disable=SC2046
  $R bench serve --base-url "http://127.0.0.1:$VLLM_PORT" --backend vllm "${model_args[@]}" \
    $(load) --max-concurrency $2 || true
  kill -TERM -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

for m in $MODELS; do
  case $m in
    default)
      model_args=(); hf="$PEERS_DIR/smollm2-hf"; conc=${CONCURRENCY:-"1 8 32"} ;;
    gemma)
      gguf=$($PY -c "from radixlm.models.packaged import gemma3_270m_gguf; print(gemma3_270m_gguf())")
      model_args=(--model "$gguf"); hf="$PEERS_DIR/gemma3-270m-hf"; conc=${CONCURRENCY:-"1 8"} ;;
    *) echo "unknown model $m (default, gemma)" >&2; exit 2 ;;
  esac
  echo "== $m: radixlm, llama-server, transformers; concurrency $conc"
  quiet
  # shellcheck disable=SC2046
  if [[ " $PEERS " == *" radixlm "* ]]; then
    $R bench serve "${model_args[@]}" $(load) --max-concurrency $conc \
      --transformers-baseline auto
  fi
  if [[ " $PEERS " == *" vllm "* ]]; then
    for c in $conc; do vllm_run "$hf" "$c"; done
  fi
done
