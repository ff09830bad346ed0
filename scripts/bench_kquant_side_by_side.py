"""k-quant GGUFs at their own size, side by side in one process (issue 26 item 5).

    PYTHONPATH=$PWD python scripts/bench_kquant_side_by_side.py gemma    # Gemma 3 270M Q4_K_M
    PYTHONPATH=$PWD python scripts/bench_kquant_side_by_side.py default  # SmolLM2-135M Q4_1

gemma: the file loaded twice, --quantization none (all bf16, what main did for this file)
and auto (Q4_K as int4 groups, Q8_0/Q5_0/Q6_K as int8 groups, the tied head and the
embedding from int8 rows); weight bytes per format, decode steps at batch 1 and 8 timed
interleaved, the LM head alone. default: one auto load, decode steps with the head as int8
groups and as main's oneDNN-prepacked bf16 head (the same values), swapped in turn.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from radixlm.models import load_model
from radixlm.models.linear import LinearPolicy, weight_bytes_by_format
from radixlm.models.linear.method import PrepackedLinear
from radixlm.models.loader import default_model_path
from radixlm.models.packaged import gemma3_270m_gguf
from tests.conftest_models import PoolHarness


def decode_steps(variants: dict, cfg, batch: int, steps: int = 14) -> dict[str, float]:
    """variants: name -> (model, setup()); median decode step ms of each, interleaved."""
    hs, rows, times = {}, {}, {k: [] for k in variants}
    prompts = [torch.randint(100, 20000, (64,)).tolist() for _ in range(batch)]
    with torch.no_grad():
        for k, (model, setup) in variants.items():
            setup()
            hs[k] = PoolHarness(model, cfg, max_requests=batch, max_context=256,
                                num_slots=batch * 256, kv_dtype=torch.bfloat16)
            rows[k] = [hs[k].new_request() for _ in range(batch)]
            hs[k].extend(rows[k], prompts)
        for step in range(steps):
            for k, (model, setup) in variants.items():
                setup()
                t0 = time.perf_counter()
                hs[k].decode(rows[k], [7 + step] * batch)
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v[2:]) * 1e3 for k, v in times.items()}


def main(which: str) -> None:
    torch.manual_seed(0)
    variants = {}
    if which == "gemma":
        for q in ("none", "auto"):
            m, cfg = load_model(gemma3_270m_gguf(), torch.bfloat16, "cpu",
                                linear_policy=LinearPolicy(q))
            print(q, {k: f"{v / 2**20:.1f} MiB" for k, v in weight_bytes_by_format(m).items()})
            variants[q] = (m, lambda: None)
    else:
        m, cfg = load_model(default_model_path(), torch.bfloat16, "cpu",
                            linear_policy=LinearPolicy("auto"))
        heads = {"int8 head": m.logits_method,
                 "bf16 prepacked head": PrepackedLinear(
                     m.logits_method.dequantized_weight().bfloat16())}
        for k, head in heads.items():
            variants[k] = (m, lambda h=head: setattr(m, "logits_method", h))
    for batch in (1, 8):
        med = decode_steps(variants, cfg, batch)
        print(f"batch {batch}: decode step median " +
              ", ".join(f"{k} {v:.1f} ms" for k, v in med.items()), flush=True)
    x = torch.randn(1, cfg.hidden_size).bfloat16()
    ht = {k: [] for k in variants}
    with torch.no_grad():
        for _ in range(10):
            for k, (model, setup) in variants.items():
                setup()
                t0 = time.perf_counter()
                model.logits_method(x)
                ht[k].append(time.perf_counter() - t0)
    print("LM head, 1 row: median " +
          ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in ht.items()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gemma")
