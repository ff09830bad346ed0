"""LinearPolicy: which LinearMethod each linear layer gets, decided once at load.

    deterministic inference (`gemm` set)  -> DenseLinear on that GEMM (batch-invariant)
    --quantization auto, bf16, GGUF Q4_0/Q4_1/Q4_K -> Int4GroupwiseLinear (int4_bf16;
                                          float32 on AVX2: groups_f32, int8 groups too)
    --quantization auto, bf16 CPU, GGUF Q5_0 -> Q5GroupwiseLinear (q5_bf16, AVX512-BF16)
    --quantization auto, bf16 CPU, GGUF Q8_0/Q5_0/Q6_K -> Int8GroupwiseLinear (a large LM
                                          head: `make_head_method`); each of the three
                                          + dense fallback, none on AMX-BF16
    --quantization int8, bfloat16 run     -> Int8WeightOnlyLinear (+ dense fallback)
    --quantization w8a8_int8, CPU         -> W8A8Int8Linear (oneDNN int8 x int8, every call)
    otherwise, CPU float32/bfloat16       -> TiledBf16Linear (bf16, AMX) or PrepackedLinear
    otherwise                             -> DenseLinear (F.linear)
CUDA: dense weights, the checkpoint's values. Each TP rank builds its own shards' methods.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from radixlm.models.linear.bf16_tiles import TiledBf16Linear, bf16_tiles_fit
from radixlm.models.linear.groups_f32 import groups_f32_usable
from radixlm.models.linear.int4 import (Int4GroupwiseLinear, int4_bf16_kernel_usable,
                                        int4_blocks_kernel, int4_kernel_fits,
                                        int4_kernel_runs_on, int4_tiles_usable)
from radixlm.models.linear.int4_groups import Int4Groups
from radixlm.models.linear.int8 import (Int8WeightOnlyLinear, int8_kernel_available,
                                        quantize_per_channel_int8)
from radixlm.models.linear.int8_groups import (Int8Groups, Int8GroupwiseLinear,
                                               int8_groups_kernel_runs_on, int8_tiles_fit)
from radixlm.models.linear.method import (DenseLinear, Gemm, LinearMethod, PrepackedLinear,
                                          onednn_prepack_available, storage_key)
from radixlm.models.linear.q5_bf16 import Q5GroupwiseLinear, fits_q5, q5_bf16_kernel_usable
from radixlm.models.linear.w8a8 import W8A8Int8Linear, w8a8_kernel_available

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("auto", "none", "int8", "w8a8_int8")
# Rows up to which the weight-only kernels beat oneDNN's bf16 GEMM for this project's
# shapes (int4: 3.2 vs 7.8 ms per decode step at 1 row, 4.4 at 4, 8.1 vs 8.0 at 8;
# docs/benchmarks.md, "Linear methods").
DEFAULT_SMALL_BATCH_MAX_M = 4
# Rows up to which the int4_bf16 kernel (int4 weights x bf16 activations, AVX512-BF16)
# beats oneDNN's bf16 GEMM on the same shapes: it unpacks each weight block once for all
# rows, 1.3x faster than dense at 8 rows (scripts/bench_int4_kernel.py, docs/benchmarks.md
# "int4 x bf16 kernel").
DEFAULT_INT4_BF16_MAX_M = 8
# Rows up to which the int8-group methods (Q8_0/Q5_0/Q6_K projections, the int8 LM head)
# stay on their kernel: 8. With the weight read prefetched, Gemma 3's decode steps of 5, 6
# and 8 rows are 1.20x / 1.15x / 1.05x faster than with 4 and oneDNN's AMX bf16 GEMM
# beyond (docs/benchmarks.md, "Software prefetch"), and a speculative verify of up to 8
# rows (speculative/verify_rows.py) keeps the int4 x bf16 kernels' 8 rows.
DEFAULT_INT8_GROUPS_MAX_M = 8
# Rows up to which the groups_f32 kernel (int4 / int8 groups x float32 activations, AVX2)
# serves a float32 run's quantized layers, the dense float32 GEMM past them: the default
# model's decode steps on a Zen 3 EPYC, against the dense float32 weights, 2.92x / 1.82x /
# 1.36x / 1.05x faster at 1 / 16 / 32 / 64 requests (docs/benchmarks.md, "int4 and int8
# groups against float32 activations").
DEFAULT_GROUPS_F32_MAX_M = 64


@dataclass(frozen=True)
class LinearPolicy:
    quantization: str = "none"
    prepack: bool = True
    gemm: Gemm | None = None  # set: every layer is DenseLinear on this GEMM
    small_batch_max_m: int = DEFAULT_SMALL_BATCH_MAX_M
    int4_bf16_max_m: int = DEFAULT_INT4_BF16_MAX_M  # (the larger of the two applies)
    # Past the int4 kernel's rows, on a CPU with AMX-BF16 (amx_tiles), int4 layers stay
    # 4-bit: the tile GEMM dequantizes the groups into its B tiles per call, the same
    # products as a dense bf16 copy (models/linear/int4.py). None (default): every call,
    # and no dense copy is kept (2 bytes a weight less); N: up to N rows, the dense copy
    # past them; <= the kernel's rows: off. Per layer 1.33x / 1.10x / 1.08x the dense
    # copy's speed at 16 / 32 / 64 rows, 1.00x / 0.93-0.96x at 256 / 1024 (a 1024-token
    # prefill 0.96x); docs/benchmarks.md, "4-bit groups dequantized into AMX tiles".
    int4_tiles_max_m: int | None = None
    int8_groups_max_m: int = DEFAULT_INT8_GROUPS_MAX_M
    # The same for the 5-bit (Q5_0) and int8-group (Q8_0 / Q6_K projections, the int8 LM
    # head) methods: past their kernels' rows, on AMX-BF16, their groups dequantized into
    # the tile GEMM's B tiles (the dense copy's products, bit for bit). None: every call,
    # no dense copy; N: up to N rows; <= the kernel's rows: off.
    # docs/benchmarks.md, "5-bit and int8 groups dequantized into AMX tiles".
    q5_tiles_max_m: int | None = None
    int8_tiles_max_m: int | None = None
    # Prepacked bf16 dense weights (and the quantized methods' dense fallbacks) on
    # radixlm's AMX tile kernel where the CPU has AMX-BF16, instead of oneDNN's: decode
    # steps of 16 / 32 rows 1.26x faster on the default model and Gemma 3, prefill of
    # 1024 tokens 0.93-0.95x (models/linear/bf16_tiles.py; docs/benchmarks.md, "bf16
    # GEMMs on AMX tiles").
    amx_tiles: bool = True
    # 5-bit groups (GGUF Q5_0) on the q5_bf16 kernel (0.69 B/weight) rather than as int8
    # groups (1.125), for calls of up to small_batch_max_m rows (fewer than int8 groups'
    # int8_groups_max_m, so it caps a Gemma verify at 4 rows). Its per-row cost is bf16 dot
    # products: cache-resident calls of 2+ rows are slower than int8 VNNI, whole-model
    # decode steps of 1 and 4 rows 7-12% faster; AMX bf16 GEMMs win from a few rows
    # (docs/benchmarks.md, "q5_bf16 kernel").
    q5_kernel: bool = True
    # int4 small calls on the int4_groups C++ kernel (x quantized to int8 per group of 32,
    # one 0.625 B/weight copy) instead of aten's int4pack (bf16 x, 1.375 B/weight): 1.3x
    # faster at one row, but the default model's decode logits move 2-3x more (0.036 /
    # 0.076 vs 0.018 / 0.027 relative) and a parity prompt's greedy text changes. In
    # float32 runs the groups_f32 kernel's int4 layers take x quantized the same way (its
    # int4_f32_q8_matmul, the same words) for every call, prefill included, and keep no
    # dense float32 copy: on a Zen 3 EPYC 1.5-1.9x the dense GEMM per layer from 64 to
    # 1024 rows, decode steps 1.12x / 1.24x / 1.34x at 1 / 4 / 32 requests, two of the
    # three parity prompts' greedy texts changed at near-ties (docs/benchmarks.md, "int4
    # x int8 activations in float32 runs"). Its int8-group layers keep x unquantized.
    int4_int8_activations: bool = False
    groups_f32_max_m: int = DEFAULT_GROUPS_F32_MAX_M

    @staticmethod
    def groups_f32(dtype: torch.dtype) -> bool:
        """Do a float32 run's int4 and int8-group layers take the groups_f32 kernel (built:
        AVX2, FMA, F16C)?"""
        return dtype == torch.float32 and groups_f32_usable()

    def __post_init__(self) -> None:
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}, "
                             f"got {self.quantization!r}")

    def keeps_int4(self, dtype: torch.dtype, device: torch.device) -> bool:
        """Do a checkpoint's int4 layers stay 4-bit in a run of `dtype` on `device` (so
        loaders hand over their groups, not only dense values)? --quantization auto, not
        deterministic, a device the int4 kernels run on, bfloat16 activations or float32
        ones with the groups_f32 kernel built."""
        return (self.quantization == "auto" and self.gemm is None
                and (dtype == torch.bfloat16 or self.groups_f32(dtype))
                and int4_kernel_runs_on(device))

    def int8_tiles(self, groups: Int8Groups, q5: bool = False) -> int | None:
        """The tiles_max_m an int8-group (or with `q5`, 5-bit) method of these groups gets
        (0: off)."""
        limit = self.q5_tiles_max_m if q5 else self.int8_tiles_max_m
        return limit if self.amx_tiles and int8_tiles_fit(groups) else 0

    def keeps_int8(self, dtype: torch.dtype, device: torch.device) -> bool:
        """Do a checkpoint's int8-group tensors (Q8_0, Q5_0, Q6_K) stay int8? As
        `keeps_int4`: bfloat16 with the int8_groups C++ kernel built, or float32 with
        the groups_f32 one."""
        return (self.quantization == "auto" and self.gemm is None and device.type == "cpu"
                and ((dtype == torch.bfloat16 and int8_groups_kernel_runs_on(device))
                     or self.groups_f32(dtype)))


def make_linear_method(weight: torch.Tensor, int4: Int4Groups | None,
                       policy: LinearPolicy, int8: Int8Groups | None = None) -> LinearMethod:
    """The method for one layer: `weight` is its dense (dequantized) weight [out, in] on
    its device in the run dtype; `int4` / `int8` its exact groups when the checkpoint
    had them."""
    if policy.gemm is not None:
        return DenseLinear(weight, policy.gemm, format="dense (batch-invariant GEMM)")
    device, dtype = weight.device, weight.dtype

    def dense(w: torch.Tensor) -> LinearMethod:
        if policy.prepack and policy.amx_tiles and bf16_tiles_fit(w):
            return TiledBf16Linear(w)
        if policy.prepack and onednn_prepack_available(dtype, device):
            return PrepackedLinear(w)
        return DenseLinear(w)

    if policy.quantization == "w8a8_int8" and w8a8_kernel_available(device):
        return W8A8Int8Linear.from_dense(weight)
    if policy.quantization == "w8a8_int8" and device.type == "cpu":
        raise ValueError("--quantization w8a8_int8 needs torch's oneDNN int8 linear and a CPU "
                         "with int8 dot products (avx512_vnni, avx_vnni or amx_int8): without "
                         "them oneDNN's int8 GEMM saturates its sums; use --quantization auto")
    if int4 is not None and policy.keeps_int4(dtype, device):
        if policy.groups_f32(dtype):
            if int4_kernel_fits(int4, f32=True):
                # x as int8: every call on the kernel (faster than the dense float32 GEMM
                # at any row count measured), no dense copy
                q8 = policy.int4_int8_activations
                return Int4GroupwiseLinear(int4, None if q8 else dense(weight),
                                           policy.groups_f32_max_m, act_dtype=dtype,
                                           use_f32=True, int8_activations=q8)
        else:
            blocks = policy.int4_int8_activations and int4_blocks_kernel() is not None
            bf16 = not blocks and int4_bf16_kernel_usable()
            if int4_kernel_fits(int4, blocks, bf16):
                max_m = policy.small_batch_max_m
                if bf16:
                    max_m = max(max_m, policy.int4_bf16_max_m)
                on_tiles = bf16 and policy.amx_tiles and int4_tiles_usable()
                tiles = policy.int4_tiles_max_m if on_tiles else 0
                return Int4GroupwiseLinear(int4, None if tiles is None else dense(weight), max_m,
                                           use_blocks=blocks, use_bf16=bf16, tiles_max_m=tiles)
    if int8 is not None and policy.keeps_int8(dtype, device):
        if policy.groups_f32(dtype):
            if int8.group_size in (16, 32):
                return Int8GroupwiseLinear(int8, dense(weight), policy.groups_f32_max_m,
                                           act_dtype=dtype, use_f32=True)
        else:
            q5 = policy.q5_kernel and q5_bf16_kernel_usable() and fits_q5(int8)
            tiles = policy.int8_tiles(int8, q5)
            fallback = None if tiles is None else dense(weight)
            if q5:
                return Q5GroupwiseLinear(int8, fallback, policy.small_batch_max_m,
                                         tiles_max_m=tiles)
            return Int8GroupwiseLinear(int8, fallback, policy.int8_groups_max_m,
                                       tiles_max_m=tiles)
    if (policy.quantization == "int8" and dtype == torch.bfloat16
            and int8_kernel_available(device)):
        q, scales = quantize_per_channel_int8(weight)
        fallback = dense(Int8WeightOnlyLinear.dequantize(q, scales).to(dtype))
        return Int8WeightOnlyLinear(q, scales, fallback, policy.small_batch_max_m)
    return dense(weight)


# Vocabulary rows from which the LM head keeps int8 groups for calls of at most
# `int8_groups_max_m` rows (larger: the AMX tiles, or its dense prepacked fallback) and a
# tied embedding reads them, its dense table dropped. Quiet 2-vCPU EPYC (Zen 4), two threads
# (scripts/bench_int8_groups.py, docs/benchmarks.md), int8 over prepacked bf16 at 1 / 2 /
# 4 rows: 1.46x / 1.48x / 0.85x on Gemma 3's 262144 x 640 head, 2.23x / 2.30x / 0.99x on
# SmolLM2's 49152 x 576. The same row limit as the projections keeps a speculative
# verify (<= that many rows) on the kernel that computed the decode steps' logits.
INT8_HEAD_MIN_ROWS = 32768


def make_head_method(weight: torch.Tensor, int8: Int8Groups | None,
                     policy: LinearPolicy) -> LinearMethod:
    """The LM head's method: its int8 groups (calls of up to `int8_groups_max_m` rows) over
    the AMX tiles or the dense method of the same values (larger calls; `int8_tiles`)
    when the policy keeps int8 and the
    vocabulary is large (the head then reads the most bytes of any weight), else what
    `make_linear_method` gives a dense weight. A tied embedding then reads the int8 rows.
    A float32 run with the groups_f32 kernel takes every call on it (no dense copy)."""
    if (int8 is not None and int8.shape[0] >= INT8_HEAD_MIN_ROWS and int8.group_size in (16, 32)
            and policy.keeps_int8(weight.dtype, weight.device)
            and policy.groups_f32(weight.dtype)):
        return Int8GroupwiseLinear(int8, None, policy.groups_f32_max_m, act_dtype=weight.dtype,
                                   use_f32=True)
    if (int8 is not None and int8.shape[0] >= INT8_HEAD_MIN_ROWS
            and policy.keeps_int8(weight.dtype, weight.device)):
        tiles = policy.int8_tiles(int8)
        fallback = None if tiles is None else make_linear_method(weight, None, policy)
        return Int8GroupwiseLinear(int8, fallback, policy.int8_groups_max_m, tiles_max_m=tiles)
    return make_linear_method(weight, None, policy)


def apply_linear_policy(model: nn.Module, policy: LinearPolicy) -> None:
    """Build every layer's method (modules with `finalize_linear(policy)`), then log the
    formats chosen."""
    for module in list(model.modules()):
        finalize = getattr(module, "finalize_linear", None)
        if finalize is not None:
            finalize(policy)
    counts = Counter(type(m).__name__ for m in top_level_methods(model))
    logger.info("linear methods: %s", ", ".join(f"{n} x{c}" for n, c in sorted(counts.items())))


def _fallback_ids(model: nn.Module) -> set[int]:
    """The dense fallbacks held by quantized methods (SmallBatchQuantized.fallback)."""
    return {id(getattr(m, "fallback")) for m in model.modules() if hasattr(m, "fallback")}


def top_level_methods(model: nn.Module) -> list[LinearMethod]:
    """Every layer's method (not the fallbacks inside quantized methods)."""
    fallbacks = _fallback_ids(model)
    return [m for m in model.modules() if isinstance(m, LinearMethod) and id(m) not in fallbacks]


def method_storage_keys(model: nn.Module) -> set[tuple[int, int]]:
    """The memory of every method's tensors (fallbacks included)."""
    return {storage_key(t) for m in model.modules() if isinstance(m, LinearMethod)
            for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]}


def weight_bytes_by_format(model: nn.Module) -> dict[str, int]:
    """Bytes the model holds per weight format: each LinearMethod's own buffers under its
    format (a quantized method's dense fallback under the fallback's format, marked), the
    rest (embedding, norms, RoPE cache) under "other"; each tensor once."""
    seen: set[tuple[int, int]] = set()
    out: dict[str, int] = {}

    def add(key: str, tensors) -> None:
        for t in tensors:
            if storage_key(t) not in seen:
                seen.add(storage_key(t))
                out[key] = out.get(key, 0) + t.numel() * t.element_size()

    fallbacks = _fallback_ids(model)
    for m in model.modules():
        if isinstance(m, LinearMethod):
            key = m.format + (" (fallback for large batches)" if id(m) in fallbacks else "")
            add(key, [*m.parameters(recurse=False), *m.buffers(recurse=False)])
    add("other (embedding, norms, RoPE)", [*model.parameters(), *model.buffers()])
    return {k: v for k, v in out.items() if v}
