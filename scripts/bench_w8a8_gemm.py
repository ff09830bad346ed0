"""int8 x int8 GEMM candidates vs the bf16 and int4 linear methods, one process, CPU.

    python scripts/bench_w8a8_gemm.py [--rows 1,4,8,16,32,1024] [--rounds 5] [--models smollm2,gemma3]

Per (model, M) the time of one decoder layer's linear calls (q/k/v, o, gate, up, down:
each shape of the model once, gate and up fused as SGLang does) through:

  bf16        PrepackedLinear (oneDNN bf16, weight prepacked; today's dense path)
  int4        aten._weight_int4pack_mm_for_cpu, groups of 32 (today's default for <= 4 rows)
  qlinear     W8A8Int8Linear: onednn.qlinear_pointwise, u8 activations (per token,
              symmetric, zero point 128), s8 weights (per output channel)
  int_mm      torch._int_mm (s8 x s8 -> s32), then both scales in float32
  fbgemm_dyn  quantized.linear_dynamic (fbgemm; per-tensor u8 activations; float32 in/out)

Every int8 time includes quantizing the bf16 activations (amax, scale, round) and the
conversion of the output back to bf16. Rounds interleave the methods; the table gives the
median over rounds of the per-call mean (microseconds per layer) and bf16 / method.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from radixlm.models.linear.method import PrepackedLinear  # noqa: E402
from radixlm.models.linear.w8a8 import W8A8Int8Linear  # noqa: E402

# (out, in) per linear call of one decoder layer.
SHAPES = {
    "smollm2": [(576 + 2 * 192, 576), (576, 576), (3072, 576), (576, 1536)],
    "gemma3": [(1024 + 2 * 256, 640), (640, 1024), (4096, 640), (640, 2048)],
}


def quantize_per_token_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp_min_(1e-30)
    return torch.mul(x, 127.0 / amax).round_().to(torch.int8), amax.div_(127.0)


def build(n: int, k: int, m: int) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    w = torch.randn(n, k) * 0.05
    ws = w.abs().amax(1) / 127
    qw = torch.round(w / ws[:, None]).clamp(-127, 127).to(torch.int8)
    wb = w.bfloat16()
    pre = PrepackedLinear(wb)
    # int4 groups of 32 (asymmetric, as Q4_1), the kernel's layout
    g = w.view(n, k // 32, 32)
    lo, hi = g.amin(-1), g.amax(-1)
    d = ((hi - lo) / 15).clamp_min(1e-8)
    q4 = torch.round((g - lo[..., None]) / d[..., None]).clamp(0, 15).to(torch.int32).view(n, k)
    packed4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4, 1)
    sz = torch.stack([d.t(), (lo + 8 * d).t()], -1).bfloat16().contiguous()
    wzp = torch.zeros(n, dtype=torch.int64)
    qwt = qw.t()
    wsf = ws.float()
    torch.backends.quantized.engine = "fbgemm"
    fb = torch.ops.quantized.linear_prepack(
        torch.quantize_per_channel(w, ws.double(), wzp, 0, torch.qint8), None)

    w8a8 = W8A8Int8Linear(qw, ws, batch_hint=m)

    def int_mm(x):
        qx, xs = quantize_per_token_int8(x)
        return (torch._int_mm(qx, qwt).float() * xs * wsf).bfloat16()

    return {
        "bf16": lambda x: pre(x),
        "int4": lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed4, 32, sz),
        "qlinear": lambda x: w8a8(x),
        "int_mm": int_mm,
        "fbgemm_dyn": lambda x: torch.ops.quantized.linear_dynamic(x.float(), fb).bfloat16(),
    }


def time_calls(fns: list[Callable[[], object]], seconds: float) -> float:
    for f in fns:
        f()
    n, t0 = 0, time.perf_counter()
    while True:
        for f in fns:
            f()
        n += 1
        dt = time.perf_counter() - t0
        if dt > seconds and n >= 3:
            return dt / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,4,8,16,32,1024")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.15)
    p.add_argument("--models", default="smollm2,gemma3")
    p.add_argument("--methods", default="bf16,int4,qlinear,int_mm,fbgemm_dyn")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: torch's default; 1 steadies a loaded machine)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    methods = a.methods.split(",")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; us per layer "
          f"(all its linear calls), median of {a.rounds} rounds; (x) = bf16 / method")
    print(f"{'model':8} {'M':>5} " + " ".join(f"{m:>17}" for m in methods))
    for model in a.models.split(","):
        for m in map(int, a.rows.split(",")):
            layers = [build(n, k, m) for n, k in SHAPES[model]]
            xs = [torch.randn(m, k).bfloat16() for _, k in SHAPES[model]]
            times: dict[str, list[float]] = {name: [] for name in methods}
            for _ in range(a.rounds):
                for name in methods:
                    calls = [lambda f=layer[name], x=x: f(x) for layer, x in zip(layers, xs)]
                    times[name].append(time_calls(calls, a.seconds))
            med = {k: statistics.median(v) for k, v in times.items()}
            base = med.get("bf16", 1.0)
            print(f"{model:8} {m:>5} " + " ".join(
                f"{med[k]:9.1f} ({base / med[k]:4.2f}x)" for k in methods), flush=True)


if __name__ == "__main__":
    main()
