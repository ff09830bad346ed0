# Sourced by the benchmark scripts: `quiet` waits (up to 5 min) until the 1-minute load
# average is below $QUIET (no wait when QUIET is unset), so that no run starts in the wake
# of the one before, then prints the load at the start; `machine_header` prints the load
# average, the CPU model and the flags that pick radixlm's CPU paths.
quiet() {
  [ -n "${QUIET:-}" ] || return 0
  for _ in $(seq 300); do
    awk -v q="$QUIET" '{exit !($1 < q)}' /proc/loadavg && break
    sleep 1
  done
  echo "(load average $(cut -d' ' -f1 /proc/loadavg) at the start)"
}

machine_header() {
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -m1 "model name" /proc/cpuinfo
  { grep -o -w -E "avx2|avx512f|avx512_bf16|amx_bf16|amx_tile|avx512_vnni" /proc/cpuinfo || true; } | sort -u | tr '\n' ' '
  echo
}
