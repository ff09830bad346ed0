"""Compile the attention kernels for a CUDA architecture without a GPU (ahead of time).

Triton's interpreter (the CPU tests) runs the kernels as numpy code and checks their
results, but it does not type-check them the way the GPU compiler does (loop-carried
types, tl.dot shape limits, ...). This lowers every kernel through Triton's real pipeline
(TTIR -> TTGIR -> LLVM -> PTX -> cubin with the ptxas bundled in the triton wheel) for a
target such as sm_90, so a kernel that would not compile on the GPU fails on the CPU.

    python -m radixlm.attention.triton_kernels.compile_check [--arch 90] [--dtype bf16 fp32]

Must run without TRITON_INTERPRET=1 (interpreted kernels cannot be compiled).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time

_TORCH_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _kernel_specs(dtype: str) -> list[tuple[str, object, dict[str, str], dict[str, object], int]]:
    """(name, jit kernel, pointer/float argument types, constexprs, num_stages) for the
    tiles the backend launches by default (TritonAttentionConfig) on a 64-dim GQA model."""
    from radixlm.attention.triton_backend import TritonAttentionConfig
    from radixlm.attention.triton_kernels.decode_attention import _decode_stage1, _decode_stage2
    from radixlm.attention.triton_kernels.extend_attention import _extend_kernel

    cfg = TritonAttentionConfig()
    precision = "ieee" if dtype == "fp32" else "tf32"
    t = f"*{dtype}"
    lookups = {"Req_to_token": "*i32", "Req_pool_indices": "*i64", "Seq_lens": "*i64",
               "Num_splits": "*i32", "Prefix_lens": "*i32", "Extend_lens": "*i32",
               "Extend_start": "*i32", "Mid_o": "*fp32", "Mid_lse": "*fp32", "sm_scale": "fp32"}
    tensors = {name: t for name in ("Q", "K_buf", "V_buf", "K_ext", "V_ext", "O")}
    types = {**tensors, **lookups}
    return [
        ("decode_stage1", _decode_stage1, types,
         dict(GROUP=4, HEAD_DIM=64, BLOCK_H=16, BLOCK_D=64, BLOCK_N=cfg.decode_block_n,
              DOT_PRECISION=precision), 2),
        ("decode_stage2", _decode_stage2, types, dict(HEAD_DIM=64, BLOCK_D=64), 2),
        ("extend", _extend_kernel, types,
         dict(GROUP=4, HEAD_DIM=64, BLOCK_M=cfg.extend_block_m, BLOCK_N=cfg.extend_block_n,
              BLOCK_D=64, DOT_PRECISION=precision), 1),
    ]


def compile_kernels(arch: int, dtypes: list[str], num_warps: int = 4) -> dict[str, float]:
    """Compile every kernel for sm_<arch>; returns seconds per kernel. Raises on failure."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_check needs TRITON_INTERPRET unset")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    timings: dict[str, float] = {}
    for dtype in dtypes:
        for name, kernel, types, consts, num_stages in _kernel_specs(dtype):
            params = list(inspect.signature(kernel.fn).parameters)
            # Arguments not named in `types` are strides: plain ints.
            signature = {p: "constexpr" if p in consts else types.get(p, "i32") for p in params}
            constexprs = {(params.index(k),): v for k, v in consts.items()}
            t0 = time.perf_counter()
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                      target=GPUTarget("cuda", arch, 32),
                                      options={"num_warps": num_warps, "num_stages": num_stages})
            assert compiled.asm.get("cubin"), f"{name}: no cubin produced"
            timings[f"{name}[{dtype}]"] = time.perf_counter() - t0
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90")
    parser.add_argument("--dtype", nargs="+", default=["bf16", "fp32"],
                        choices=sorted(_TORCH_DTYPE_NAMES))
    args = parser.parse_args(argv)
    import triton

    for name, secs in compile_kernels(args.arch, args.dtype).items():
        print(f"compiled {name} for sm_{args.arch} (triton {triton.__version__}) in {secs:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
