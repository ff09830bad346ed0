"""The groups_f32 C++ kernel (`cpu_kernels/groups_f32.cpp`: int4 and int8 groups against
float32 activations, AVX2; int4 ones also against x quantized to int8 per group of 32)
and its weight layouts.

Output channels in blocks of 8 (the last block padded with q = 0 and zero scales), each
block's K columns in order, 8 channels a column:
* int4: [blocks, K] int32, words of 8 lanes: lane j of word c holds channel 8 b + j's
  columns 8 c .. 8 c + 7, column 8 c + t in bits 4 t .. 4 t + 3;
* int8: [blocks, K, 8] int8, [b, k, j] = channel 8 b + j, column k.
Scales per block and group: [blocks, groups, 8], float16 when every value survives the
round trip (GGUF's Q4_0 / Q4_1 halves), else float32. Each pack / unpack pair is exact
on the real rows.
"""

from __future__ import annotations

import torch

from radixlm.cpu_kernels.kernel_ops import kernel_op

BLOCK_N = 8


def groups_f32_kernel():
    """The kernel module when it built with AVX2, FMA and F16C, else None. Kernels build
    with -march=native (`cpu_kernels/build.py`), so this is the CPU as the compiler saw it."""
    from radixlm.cpu_kernels.build import load_kernel

    kernel = load_kernel("groups_f32")
    return kernel if kernel is not None and kernel.groups_f32_path() >= 1 else None


def groups_f32_usable() -> bool:
    """Do float32 runs have the kernel here (built: AVX2, FMA, F16C)?"""
    return groups_f32_kernel() is not None


# The entries as torch ops for compiled decode graphs (implemented by groups_f32.cpp).
@kernel_op("int4_f32_matmul(Tensor x, Tensor w, Tensor d, Tensor m, int n) -> Tensor")
@kernel_op("int4_f32_q8_matmul(Tensor x, Tensor w, Tensor d, Tensor m, int n) -> Tensor")
def _(x, w, d, m, n):
    return x.new_empty(x.shape[0], n)


@kernel_op("int8_f32_matmul(Tensor x, Tensor w, Tensor s, int group, int n) -> Tensor")
def _(x, w, s, group, n):
    return x.new_empty(x.shape[0], n)


def _padded(t: torch.Tensor) -> torch.Tensor:
    """Rows padded with zeros to a multiple of BLOCK_N."""
    rows = t.shape[0]
    pad = -rows % BLOCK_N
    if pad == 0:
        return t
    return torch.cat([t, t.new_zeros(pad, *t.shape[1:])])


def pack_int4_f32(q: torch.Tensor) -> torch.Tensor:
    """[rows, in] values 0..15 (in a multiple of 32) -> [blocks, in] int32."""
    qp = _padded(q.to(torch.int64))
    nb, cols = qp.shape[0] // BLOCK_N, qp.shape[1]
    qv = qp.view(nb, BLOCK_N, cols // 8, 8)                       # [nb, chan, word, t]
    words = (qv << (4 * torch.arange(8))).sum(dim=-1)              # < 2^32
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)  # as int32 bits
    return words.to(torch.int32).permute(0, 2, 1).reshape(nb, cols).contiguous()


def unpack_int4_f32(p: torch.Tensor, rows: int) -> torch.Tensor:
    """The inverse of `pack_int4_f32`: [blocks, in] -> [rows, in] uint8 0..15."""
    nb, cols = p.shape
    w = p.to(torch.int64).view(nb, cols // 8, BLOCK_N) & 0xFFFFFFFF
    q = (w.unsqueeze(-1) >> (4 * torch.arange(8))) & 15            # [nb, word, chan, t]
    return q.permute(0, 2, 1, 3).reshape(nb * BLOCK_N, cols)[:rows].to(torch.uint8).contiguous()


def pack_int8_f32(q: torch.Tensor) -> torch.Tensor:
    """[rows, in] int8 -> [blocks, in, 8] int8."""
    qp = _padded(q)
    nb, cols = qp.shape[0] // BLOCK_N, qp.shape[1]
    return qp.view(nb, BLOCK_N, cols).transpose(1, 2).contiguous()


def unpack_int8_f32(p: torch.Tensor, rows: int) -> torch.Tensor:
    """The inverse of `pack_int8_f32`: [blocks, in, 8] -> [rows, in] int8."""
    nb, cols, _ = p.shape
    return p.transpose(1, 2).reshape(nb * BLOCK_N, cols)[:rows].contiguous()


def int8_f32_rows(p: torch.Tensor, s: torch.Tensor,
                  ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `ids` (1-D) of the packed int8 weight and its blocked scales: ([len(ids), in]
    int8, [len(ids), groups] float32), an embedding lookup's (plain indexing: no view of
    the buffers, which compiled graphs of inference tensors refuse)."""
    blk, lane = ids // BLOCK_N, ids % BLOCK_N
    return p[blk, :, lane], s[blk, :, lane].float()


def block_scales_f32(*scales: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each [rows, groups] -> [blocks, groups, 8] (padded rows 0); float16 when that is
    exact for every value of every one, else float32."""
    blocked = []
    for t in scales:
        tp = _padded(t.float())
        blocked.append(tp.view(-1, BLOCK_N, tp.shape[1]).transpose(1, 2).contiguous())
    if all(torch.equal(b.half().float(), b) for b in blocked):
        return tuple(b.half() for b in blocked)
    return tuple(blocked)


def unblock_scales_f32(t: torch.Tensor, rows: int) -> torch.Tensor:
    """The inverse of `block_scales_f32` for one tensor: [rows, groups] float32."""
    nb, groups, _ = t.shape
    return t.float().transpose(1, 2).reshape(nb * BLOCK_N, groups)[:rows].contiguous()
