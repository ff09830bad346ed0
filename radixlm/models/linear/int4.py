"""Int4GroupwiseLinear: 4-bit weights in groups of 32 along the input features.

Four kernels for calls of at most `max_m` rows (more: the dense fallback,
`SmallBatchQuantized`), each keeping its own exact form of the groups:
* `use_f32` (float32 runs, e.g. on AVX2): `groups_f32.py`, x float32 unquantized (with
  `int8_activations`, opt-in: x quantized to int8 per group of 32, every call);
* `use_bf16` (the default on AVX512-BF16): `cpu_kernels/int4_bf16.cpp`, layout
  `int4_bf16_blocks.py`, x UNQUANTIZED (bf16 dot products, float32 sums; AMX tiles where
  the CPU has them); with AMX-BF16, calls past max_m up to `tiles_max_m` rows (None: all,
  and no fallback) on the tile GEMM, the groups dequantized into its B tiles per call;
* `use_blocks` (opt-in, `LinearPolicy.int4_int8_activations`): `cpu_kernels/int4_groups.cpp`,
  layout `int4_blocks.py`, x quantized to int8 per group of 32 (as llama.cpp's Q4_1 x Q8_1);
* otherwise PyTorch's `_weight_int4pack_mm_for_cpu` (bf16 x only), w = (q - 8) * scale +
  zero with scale = d, zero = m + 8 d in the activation dtype, beside the canonical groups.
`dequantized_weight()` gives the checkpoint's values bit for bit, past max_m the dense copy.
"""

from __future__ import annotations

import sys

import torch

from radixlm.cpu_kernels.kernel_ops import kernel_op
from radixlm.models.linear.bf16_tiles import bf16_tiles_kernel
from radixlm.models.linear.groups_f32 import (block_scales_f32, groups_f32_kernel,
                                              pack_int4_f32, unblock_scales_f32,
                                              unpack_int4_f32)
from radixlm.models.linear.int4_bf16_blocks import (block_scales, pack_bf16_blocks,
                                                     unblock_scales, unpack_bf16_blocks)
from radixlm.models.linear.int4_blocks import compact_scales, pack_blocks, unpack_blocks
from radixlm.models.linear.int4_groups import Int4Groups
from radixlm.models.linear.method import LinearMethod, SmallBatchQuantized

# The kernel packs output rows in blocks of 16 (it refuses other N).
KERNEL_ROW_MULTIPLE = 16


def int4_blocks_kernel():
    """The int4_groups C++ kernel module, or None (not built: aten's int4pack kernel)."""
    from radixlm.cpu_kernels.build import load_kernel

    return load_kernel("int4_groups")


# As a torch op for compiled decode graphs (implemented by int4_groups.cpp).
@kernel_op("int4_group_matmul(Tensor x, Tensor w, Tensor d, Tensor m) -> Tensor")
def _(x, w, d, m):
    return x.new_empty(x.shape[0], w.shape[0])


def int4_bf16_kernel():
    """The int4_bf16 C++ kernel module when it built with AVX512-BF16, else None."""
    from radixlm.cpu_kernels.build import load_kernel

    kernel = load_kernel("int4_bf16")
    return kernel if kernel is not None and kernel.int4_bf16_path() >= 1 else None


def int4_tiles_usable() -> bool:
    """Do int4 layers past the int4_bf16 kernel's rows run on the 4-bit AMX tiles here (both
    kernels built: an AMX-BF16 CPU whose OS grants the tile state)? The default policy
    then keeps no dense copy of them."""
    return int4_bf16_kernel() is not None and bf16_tiles_kernel() is not None


def int4_bf16_kernel_usable() -> bool:
    """The int4_bf16 kernel built with its AVX512-BF16 path. Kernels build with
    -march=native, keyed by the CPU's flags (`cpu_kernels/build.py`), so this is the CPU's
    avx512_bf16 flag as the compiler saw it (not `cpu_features.cpu_flags()`, which the test
    suite blanks to pin `--dtype auto`)."""
    return int4_bf16_kernel() is not None


# As a torch op for compiled decode graphs (implemented by int4_bf16.cpp).
@kernel_op("int4_bf16_matmul(Tensor x, Tensor w, Tensor d, Tensor m, int n) -> Tensor")
def _(x, w, d, m, n):
    return x.new_empty(x.shape[0], n)


# As a torch op for compiled decode graphs (implemented by bf16_tiles.cpp).
@kernel_op("int4_tiles_matmul(Tensor x, Tensor w, Tensor d, Tensor m, int n, Tensor? bias, "
           "bool exact_c) -> Tensor")
def _(x, w, d, m, n, bias, exact_c):
    return x.new_empty(x.shape[0], n)


def offset_exact(d: torch.Tensor, m: torch.Tensor) -> bool:
    """Is c = m - 128 d exact in float32 for every group (then the tile kernel's
    dequantization takes one FMA, (128 + q) d + c: `cpu_kernels/bf16_tiles.cpp`)? The
    difference is formed in float64, exact for operands within 2^20 of each other in
    magnitude (checked too; a zero m is exact)."""
    d64, m64 = d.double() * 128, m.double()
    exact = (m64 - d64).float().double() == m64 - d64
    ratio = m64.abs() / d64.abs().clamp_min(torch.finfo(torch.float64).tiny)
    near = (m64 == 0) | (d64 == 0) | ((ratio > 2.0 ** -20) & (ratio < 2.0 ** 20))
    return bool((exact & near).all())


def int4_bytes_per_weight(act_bytes: int, group_size: int = 32, blocks: bool = False,
                          scale_bytes: int = 2, bf16: bool = False, f32: bool = False) -> float:
    """What Int4GroupwiseLinear keeps per weight (its dense fallback not included). With
    the int4_groups kernel (`blocks`, opt-in: `LinearPolicy.int4_int8_activations`): the
    nibbles (0.5) and d, m of `scale_bytes` each (2: GGUF's Q4_0/Q4_1 halves; Q4_K's
    d * sc needs 4). Without: the canonical nibbles (0.5) and float32 d, m, aten's
    kernel's nibbles (0.5) and its scale/zero pair in the activation dtype. With the
    int4_bf16 kernel (`bf16`): the nibbles and float32 d, m (rows padded to 16 aside).
    With the groups_f32 kernel (`f32`): as `blocks` (rows padded to 8 aside)."""
    if bf16:
        return 0.5 + 8 / group_size
    if blocks or f32:
        return 0.5 + 2 * scale_bytes / group_size
    return 0.5 + 8 / group_size + 0.5 + 2 * act_bytes / group_size


def int4_kernel_runs_on(device: torch.device) -> bool:
    return device.type == "cpu" and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def int4_kernel_fits(groups: Int4Groups, blocks: bool = False, bf16: bool = False,
                     f32: bool = False) -> bool:
    """Can the layer's small calls run on a kernel: the int4_groups, int4_bf16 and groups_f32
    kernels (`blocks`, `bf16`, `f32`) take any row count at groups of 32, aten's int4pack
    whole blocks of 16 rows."""
    if blocks or bf16 or f32:
        return groups.group_size == 32
    return groups.shape[0] % KERNEL_ROW_MULTIPLE == 0


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[rows, in] values 0..15 -> [rows, in / 2] uint8, column 2j in the low nibble."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    return torch.stack([p & 15, p >> 4], dim=-1).view(p.shape[0], -1)


class Int4GroupwiseLinear(SmallBatchQuantized):
    format = "int4 groupwise"

    def __init__(self, groups: Int4Groups, fallback: LinearMethod | None, max_m: int,
                 act_dtype: torch.dtype = torch.bfloat16, use_blocks: bool = False,
                 use_bf16: bool = False, tiles_max_m: int | None = 0,
                 use_f32: bool = False, int8_activations: bool = False) -> None:
        """fallback None: every call past max_m on the 4-bit tiles (tiles_max_m None), or
        with use_f32 and int8_activations every call on that kernel. At most one of
        use_blocks, use_bf16, use_f32; int8_activations with use_f32 only."""
        every_call = use_f32 and int8_activations and fallback is None
        super().__init__(fallback, sys.maxsize if every_call else max_m)
        self.group_size = groups.group_size
        self.out_features, self.in_features = groups.shape
        self.act_dtype = act_dtype
        self._f32 = groups_f32_kernel() if use_f32 else None
        self.int8_activations = int8_activations
        if int8_activations and not use_f32:
            raise RuntimeError("int8_activations is the groups_f32 kernel's (use_f32); "
                               "use_blocks quantizes x itself")
        if use_f32:
            if self._f32 is None or groups.group_size != 32 or use_blocks or use_bf16:
                raise RuntimeError("use_f32: the groups_f32 kernel is not built for AVX2 here, "
                                   "the groups are not of 32, or another kernel was asked for")
            if fallback is None and not int8_activations:
                raise RuntimeError("use_f32 needs a dense fallback for calls past max_m "
                                   "(with int8_activations: every call on the kernel)")
            self.register_buffer("q_f32", pack_int4_f32(groups.q), persistent=False)
            d, m = block_scales_f32(groups.d, groups.m)
            self.register_buffer("d", d, persistent=False)
            self.register_buffer("m", m, persistent=False)
            self._kernel = self._bf16 = self._tiles = None
            return
        kernel = int4_blocks_kernel() if use_blocks else None
        if use_blocks and (kernel is None or groups.group_size != 32):
            raise RuntimeError("use_blocks: the int4_groups kernel is not built here, or the "
                               "groups are not of 32")
        self._kernel = kernel
        self._bf16 = int4_bf16_kernel() if use_bf16 and not use_blocks else None
        if use_bf16 and not use_blocks and (self._bf16 is None or groups.group_size != 32):
            raise RuntimeError("use_bf16: the int4_bf16 kernel is not built for AVX512-BF16 "
                               "here, or the groups are not of 32")
        if self._bf16 is not None or self._kernel is not None:  # one C++ kernel's layout
            name, pack, scales = (("q_bf16", pack_bf16_blocks, block_scales)
                                  if self._bf16 is not None
                                  else ("q_blocks", pack_blocks, compact_scales))
            self.register_buffer(name, pack(groups.q), persistent=False)
            d, m = scales(groups.d, groups.m)
            self.register_buffer("d", d, persistent=False)
            self.register_buffer("m", m, persistent=False)
            self._tiles = bf16_tiles_kernel() if self._bf16 is not None else None
            if self._tiles is not None:
                self._exact_c = offset_exact(d, m)
                self.use_tiles(tiles_max_m)
        else:
            self.register_buffer("q_packed", pack_nibbles(groups.q), persistent=False)
            self.register_buffer("d", groups.d.float().contiguous(), persistent=False)
            self.register_buffer("m", groups.m.float().contiguous(), persistent=False)
            self.register_buffer("kernel_weight",
                                 torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                                     groups.q.to(torch.int32).contiguous(), 1),
                                 persistent=False)
            # [groups, out, 2]: the kernel's (scale, zero) per group and output row.
            zero = groups.m.float() + 8 * groups.d.float()
            self.register_buffer("kernel_scale_zeros", torch.stack(
                [groups.d.float().t(), zero.t()], dim=-1).to(act_dtype).contiguous(),
                persistent=False)
        if fallback is None and not self.takes_every_large_call():
            raise RuntimeError("no dense fallback: needs the 4-bit AMX tiles for every call "
                               "past the kernel's rows (the int4_bf16 kernel, AMX-BF16, "
                               "tiles_max_m None)")

    def tiles(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        args = (x, self.q_bf16, self.d, self.m, self.out_features, bias, self._exact_c)
        if torch.compiler.is_dynamo_compiling():
            return torch.ops.radixlm.int4_tiles_matmul(*args)
        return self._tiles.bf16_tiles_q4_matmul(*args)

    def tiles_gated(self, x: torch.Tensor, gelu: bool) -> torch.Tensor:
        return self._tiles.bf16_tiles_q4_gated(x, self.q_bf16, self.d, self.m,
                                               self.out_features // 2, gelu, self._exact_c)

    def small(self, x: torch.Tensor) -> torch.Tensor:
        if self._f32 is not None:
            args = (x, self.q_f32, self.d, self.m, self.out_features)
            if self.int8_activations:
                if torch.compiler.is_dynamo_compiling():
                    return torch.ops.radixlm.int4_f32_q8_matmul(*args)
                return self._f32.int4_f32_q8_matmul(*args)
            if torch.compiler.is_dynamo_compiling():
                return torch.ops.radixlm.int4_f32_matmul(*args)
            return self._f32.int4_f32_matmul(*args)
        if self._bf16 is not None:
            if torch.compiler.is_dynamo_compiling():
                return torch.ops.radixlm.int4_bf16_matmul(x, self.q_bf16, self.d, self.m,
                                                          self.out_features)
            return self._bf16.int4_bf16_matmul(x, self.q_bf16, self.d, self.m, self.out_features)
        if self._kernel is not None:
            if torch.compiler.is_dynamo_compiling():
                return torch.ops.radixlm.int4_group_matmul(x, self.q_blocks, self.d, self.m)
            return self._kernel.int4_group_matmul(x, self.q_blocks, self.d, self.m)
        # (dtype checks, not no-op .to() calls: ~1.5 us each, 240 per decode step)
        xa = x if x.dtype == self.act_dtype else x.to(self.act_dtype)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            xa, self.kernel_weight, self.group_size, self.kernel_scale_zeros)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def kernel_bytes(self) -> int:
        if self._f32 is not None:
            held = (self.q_f32, self.d, self.m)
        elif self._bf16 is not None:
            held = (self.q_bf16, self.d, self.m)
        elif self._kernel is not None:
            held = (self.q_blocks, self.d, self.m)
        else:
            held = (self.kernel_weight, self.kernel_scale_zeros)
        return sum(t.numel() * t.element_size() for t in held)

    def groups(self) -> Int4Groups:
        if self._f32 is not None:
            d, m = (unblock_scales_f32(t, self.out_features) for t in (self.d, self.m))
            return Int4Groups(unpack_int4_f32(self.q_f32, self.out_features), d, m,
                              self.group_size)
        if self._bf16 is not None:
            d, m = unblock_scales(self.d, self.m, self.out_features)
            return Int4Groups(unpack_bf16_blocks(self.q_bf16, self.out_features), d, m,
                              self.group_size)
        if self._kernel is not None:
            return Int4Groups(unpack_blocks(self.q_blocks), self.d.float(), self.m.float(),
                              self.group_size)
        return Int4Groups(unpack_nibbles(self.q_packed), self.d, self.m, self.group_size)

    def dequantized_weight(self) -> torch.Tensor:
        return self.groups().dequantize()
