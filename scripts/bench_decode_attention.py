"""Old vs new CPU decode attention kernel, side by side in one process.

    python scripts/bench_decode_attention.py [--rounds 15] [--old-ref 84df147]

The new kernel is this checkout's `radixlm/cpu_kernels/decode_attention.cpp` (built or
found in the cache as the engine does); the old one is the same file at git `--old-ref`
(default: the last commit before the block kernel), built once into the cache under the
name decode_attention_old (with that commit's headers, the same flags). Shapes: the
default model's attention (SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64;
`--heads/--kv-heads/--head-dim` to change), slots scattered over the pool as a long-running
allocator leaves them. Configurations: batch 32 x 160 positions, one layer (its K/V hot in
the caches) and 30 layers (each its own pool buffer, as in a decode step), batch 1 x 160;
float32 and bfloat16. Each round times old then new (interleaved); the table gives the
median per-layer-call time over the rounds and old / new, and the same for the fastest
round (on a loaded machine the least disturbed one). `--paths` adds this checkout's
kernel built without its AMX kernel (new-dp: the AVX512-BF16 dot products, as CPUs
without AMX run it) and without either bf16 kernel (new-f32: the float32 block kernel),
timed in the same rounds; each line gives old / kernel as the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from radixlm.cpu_kernels.build import build_extension, load_kernel  # noqa: E402
from radixlm.runtime.cache_dir import cache_root  # noqa: E402

KERNEL_DIR = "radixlm/cpu_kernels"


def build_old(ref: str):
    """The decode attention kernel as of git `ref`, built from a copy in the cache."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", ref], check=True,
                            capture_output=True, text=True).stdout.strip()
    src_dir = cache_root() / "bench_src" / commit[:12]
    src_dir.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", commit, KERNEL_DIR + "/"],
                           check=True, capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith(".h") or name.endswith("decode_attention.cpp"):
            text = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{name}"], check=True,
                                  capture_output=True, text=True).stdout
            target = src_dir / Path(name).name
            if not target.exists() or target.read_text() != text:
                target.write_text(text)
    module = build_extension("decode_attention_old", src_dir / "decode_attention.cpp")
    if module is None:
        raise SystemExit(f"the kernel at {ref} did not build")
    return module


def make_layers(n_layers: int, batch: int, length: int, heads: int, kv_heads: int, d: int,
                dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    slots = batch * length
    pool = [(torch.randn(slots + 1, kv_heads, d, generator=g).to(dtype),
             torch.randn(slots + 1, kv_heads, d, generator=g).to(dtype)) for _ in range(n_layers)]
    r2t = (torch.randperm(slots, generator=g) + 1).int().view(batch, length).contiguous()
    rows = torch.arange(batch)
    lens = torch.full((batch,), length, dtype=torch.int64)
    q = torch.randn(batch, heads, d, generator=g).to(dtype)
    return q, pool, r2t, rows, lens


def time_pass(fn, q, pool, r2t, rows, lens, scale, calls: int, clock) -> float:
    """Seconds per layer call: `calls` calls cycling over the layers of `pool`."""
    t0 = clock()
    for i in range(calls):
        k_buf, v_buf = pool[i % len(pool)]
        fn(q, k_buf, v_buf, r2t, rows, lens, scale, 0)
    return (clock() - t0) / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--old-ref", default="84df147", help="git ref of the old kernel")
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--length", type=int, default=160)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--paths", action="store_true",
                    help="also time this checkout's dp and float32 block paths (variants built "
                         "with -DRADIXLM_DECODE_AMX=0 / -DRADIXLM_DECODE_DPBF16=0)")
    ap.add_argument("--only", default="", help="comma-separated config labels to run, e.g. f32-32x1")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: this process's CPU time (on a loaded machine the time a thread "
                         "waits for a core is not the kernel's; with --threads 1 the kernel runs "
                         "on the calling thread)")
    args = ap.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    old = build_old(args.old_ref).paged_decode_attention
    new_mod = load_kernel("decode_attention")
    if new_mod is None:
        raise SystemExit("this checkout's kernel did not build")
    new = new_mod.paged_decode_attention
    kernels = {"old": old, "new": new}
    if args.paths:
        source = REPO / KERNEL_DIR / "decode_attention.cpp"
        for name, flags in (("new-dp", ("-DRADIXLM_DECODE_AMX=0",)),
                            ("new-f32", ("-DRADIXLM_DECODE_AMX=0", "-DRADIXLM_DECODE_DPBF16=0"))):
            module = build_extension(f"decode_attention_bench_{name[4:]}", source, flags)
            if module is None:
                raise SystemExit(f"the {name} variant did not build")
            kernels[name] = module.paged_decode_attention
    h, kvh, d, L = args.heads, args.kv_heads, args.head_dim, args.length
    scale = d ** -0.5
    print(f"torch threads {torch.get_num_threads()}, heads {h}/{kvh}, head_dim {d}, "
          f"{args.rounds} rounds (median), {args.clock} clock, old = {args.old_ref}")
    print(f"{'config':<34} {'old ms':>8} {'new ms':>8} {'old/new':>8}   (min: old, new, old/new)")
    configs = [(32, 1, 10), (32, 30, 30), (1, 1, 200), (1, 30, 300)]
    for dtype in (torch.float32, torch.bfloat16):
        for batch, n_layers, calls in configs:
            short = f"{'f32' if dtype == torch.float32 else 'bf16'}-{batch}x{n_layers}"
            if args.only and short not in args.only.split(","):
                continue
            q, pool, r2t, rows, lens = make_layers(n_layers, batch, L, h, kvh, d, dtype)
            ref = old(q, *pool[0], r2t, rows, lens, scale, 0).float()
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(new(q, *pool[0], r2t, rows, lens, scale, 0).float(), ref,
                                       rtol=tol, atol=tol)
            times = {name: [] for name in kernels}
            for _ in range(args.rounds):
                for name, fn in kernels.items():
                    times[name].append(time_pass(fn, q, pool, r2t, rows, lens, scale, calls, clock))
            t_old, t_new = (statistics.median(times[k]) * 1e3 for k in ("old", "new"))
            m_old, m_new = (min(times[k]) * 1e3 for k in ("old", "new"))
            label = f"{str(dtype).split('.')[-1]} B={batch} L={L} layers={n_layers}"
            print(f"{label:<34} {t_old:8.3f} {t_new:8.3f} {t_old / t_new:7.2f}x   "
                  f"({m_old:.3f}, {m_new:.3f}, {m_old / m_new:.2f}x)", flush=True)
            if args.paths:
                ratios = {name: statistics.median(o / t for o, t in zip(times["old"], ts))
                          for name, ts in times.items() if name != "old"}
                print(" " * 36 + ", ".join(f"{name} {statistics.median(times[name]) * 1e3:.3f} ms "
                                           f"({ratio:.2f}x)" for name, ratio in ratios.items()),
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
