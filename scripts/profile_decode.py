"""Where a decode (or prefill) step's time goes: py-spy samples `radixlm bench one-batch`
(native frames included) and this script sorts the samples of the stepping thread into
categories by the frames they contain.

    python scripts/profile_decode.py --batch-size 32 [--decode-steps 64] [-- --dtype ...]
    python scripts/profile_decode.py --phase prefill --batch-size 32 --decode-steps 1

Prints the share of samples per category (the GEMMs by kernel, the C++ kernels by name,
the torch ops the model dispatches, sampling, the scheduler's Python) for the decode
steps only (samples under the prefill and the start-up are left out), and the hottest
leaf frames of the "other" category. py-spy samples the main thread, which is also
OpenMP's thread 0: its samples are the step's wall time.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile

# First match (in this order) of a substring anywhere in the stack names the category.
CATEGORIES = [
    ("LM head GEMM, final norm", ("parallel_logits",)),
    ("int4 GEMM (int4_bf16 kernel or aten int4pack)", ("Int4GroupwiseLinear.small",
                                                       "int4pack_mm")),
    ("int8 GEMM (aten int8pack)", ("Int8WeightOnlyLinear", "int8pack_mm")),
    ("int8-group kernel (GGUF Q8_0/Q5_0/Q6_K)", ("Int8GroupwiseLinear",)),
    ("5-bit group kernel (q5_bf16)", ("Q5GroupwiseLinear",)),
    ("bf16 GEMM on AMX tiles", ("TiledBf16Linear.forward", "TiledBf16Linear.gated_act_mul",
                                "bf16_tiles_matmul")),
    ("oneDNN GEMM (prepacked bf16/f32)", ("PrepackedLinear.forward", "_linear_pointwise")),
    ("dense GEMM (F.linear)", ("DenseLinear.forward",)),
    ("C++ decode attention", ("paged_decode_attention",)),
    ("C++ norm / add+norm", ("rms_norm",)),
    ("C++ RoPE", ("rotary",)),
    ("C++ SiLU*up / GELU*up", ("silu_mul", "gelu_tanh_mul")),
    ("attention (torch path)", ("_extend (", "_decode (", "scaled_dot_product")),
    ("sampling", ("sampler.py", "sample (")),
    ("embedding", ("embedding",)),
]


def step_call_frame(phase: str = "decode") -> str:
    """The end of py-spy's name for the frame of time_one_batch's `engine.step()` of that
    phase (the first step() call in it is the prefill, the second the decode steps)."""
    import inspect

    from radixlm.bench import one_batch

    lines, first = inspect.getsourcelines(one_batch.time_one_batch)
    calls = [first + i for i, text in enumerate(lines) if "engine.step()" in text]
    return f"one_batch.py:{calls[1 if phase == 'decode' else 0]})"


def categorize(stack: str) -> str:
    for name, keys in CATEGORIES:
        if any(k in stack for k in keys):
            return name
    if "forward (radixlm/models" in stack or "models/decoder.py" in stack:
        return "model: other torch ops and Python"
    if "executor/" in stack:
        return "executor (forward batch, graphs)"
    if "scheduler/" in stack:
        return "scheduler Python"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--phase", choices=("decode", "prefill"), default="decode",
                    help="the steps to sort: decode (default) or the batch's prefill")
    ap.add_argument("--rate", type=int, default=400, help="py-spy samples per second")
    ap.add_argument("--raw", help="keep py-spy's raw samples here (with --reuse: read them)")
    ap.add_argument("--reuse", action="store_true", help="analyse --raw without recording")
    ap.add_argument("--show", help="also print the hottest stacks of this category")
    ap.add_argument("bench_args", nargs="*", help="more `radixlm bench one-batch` flags (after --)")
    a = ap.parse_args()
    raw = a.raw or tempfile.NamedTemporaryFile(suffix=".txt", delete=False).name
    if not a.reuse:
        record(a, raw)
    report(a, raw)
    if not a.raw:
        os.unlink(raw)


def record(a: argparse.Namespace, raw: str) -> None:
    cmd = [sys.executable, "-m", "radixlm", "bench", "one-batch", "--batch-sizes",
           str(a.batch_size), "--decode-steps", str(a.decode_steps), "--prompt-len",
           str(a.prompt_len), "--repeat", "3", *a.bench_args]
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    subprocess.run([py_spy if os.path.exists(py_spy) else "py-spy", "record", "--native", "-r", str(a.rate), "-f", "raw", "-o", raw,
                    "--", *cmd], check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def report(a: argparse.Namespace, raw: str) -> None:
    mark = step_call_frame(a.phase)
    shown: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    with open(raw) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            # Only the phase's steps: inside that engine.step() call of time_one_batch.
            if mark not in stack or not n.isdigit():
                continue
            inner = stack[stack.index(mark):]
            c, k = categorize(inner), int(n)
            counts[c] += k
            total += k
            if c.startswith(("model: other", "other", "executor", "scheduler")):
                leaves[inner.split(";")[-1]] += k
            if a.show and c.startswith(a.show):
                shown[";".join(f.split(" (")[0] for f in inner.split(";")[-12:])] += k
    print(f"{a.phase}-step samples: {total} (batch {a.batch_size})")
    for c, k in counts.most_common():
        print(f"  {100 * k / max(total, 1):5.1f}%  {c}")
    print("hottest leaf frames outside the named kernels:")
    for leaf, k in leaves.most_common(15):
        print(f"  {100 * k / max(total, 1):5.1f}%  {leaf[:150]}")
    for stack, k in shown.most_common(8):
        print(f"  {100 * k / max(total, 1):5.1f}%  {stack[-400:]}")


if __name__ == "__main__":
    main()
