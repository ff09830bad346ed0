"""The AMX tiles' fused gate_up epilogue (act(gate) * up written by the GEMM) vs the GEMM
then the act * up kernel, one engine, interleaved (the order flips every round):

    PYTHONPATH=$PWD python scripts/bench_gated_epilogue_ab.py MODEL|default BATCH ROUNDS

Per round and mode one static batch of BATCH 128-token prompts (fresh ones per mode: no
radix-cache hits) is prefilled in one step and decodes 16 steps; prints the prefill times
and median decode steps per mode and the ratios plain / fused. Needs a CPU with AMX-BF16
(elsewhere the tiles, and so the fused path, are not used and the modes are equal).
"""
import statistics, sys, time
from radixlm.engine import Engine
from radixlm.bench.one_batch import time_one_batch
from radixlm.bench.offline import prompt_vocab
from radixlm.bench.workload import RandomWorkload, random_prompts
from radixlm.models.loader import resolve_model_path
from radixlm.models.linear.bf16_tiles import TiledBf16Linear
real = TiledBf16Linear.gated_act_mul
model = None if sys.argv[1] == "default" else sys.argv[1]
B = int(sys.argv[2])
eng = Engine(resolve_model_path(model), max_running_requests=B, max_total_tokens=2*B*160+256,
             max_prefill_tokens=B*128, chunked_prefill_size=B*128, disable_overlap_schedule=True)
vocab, excl = prompt_vocab(eng)
res = {}
for i in range(int(sys.argv[3])):
    for mode in (("fused", "plain") if i % 2 == 0 else ("plain", "fused")):
        TiledBf16Linear.gated_act_mul = real if mode == "fused" else (lambda self, x, g: None)
        run = time_one_batch(eng, random_prompts(RandomWorkload(B, 128, 128, 16, 100 * i + (mode == "fused")), vocab, excl), 16)
        res.setdefault(mode, []).append((run.prefill_s * 1e3, statistics.median(run.decode_step_s) * 1e3))
for mode, v in res.items():
    print(mode, "prefill", ["%.0f" % a for a, _ in v], "step", ["%.1f" % b for _, b in v])
f, p = res["fused"], res["plain"]
print("prefill plain/fused %.3f, step plain/fused %.3f" % (statistics.median(a for a, _ in p) / statistics.median(a for a, _ in f),
      statistics.median(b for _, b in p) / statistics.median(b for _, b in f)))
