"""GGUF block dequantization in torch: Q8_0, Q5_0 and the k-quants Q4_K, Q5_K, Q6_K.

The same arithmetic as the `gguf` package's numpy dequantizers (the reference: the tests
compare bit for bit), as whole-tensor torch ops on the raw blocks, so they run on torch's
threads (gguf's numpy code is single-threaded). Other types fall back to gguf.

More: docs/models.md, "models/gguf_dequant.py".
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize

_BLOCK_BYTES = {T.Q8_0: 34, T.Q5_0: 22, T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}
_BLOCK_WEIGHTS = {T.Q8_0: 32, T.Q5_0: 32, T.Q4_K: 256, T.Q5_K: 256, T.Q6_K: 256}


def supported(tensor_type: T) -> bool:
    return tensor_type in _BLOCK_BYTES


def dequantize(data: np.ndarray, tensor_type: T, shape: tuple[int, ...]) -> torch.Tensor:
    """A GGUF tensor's raw data -> float32 tensor of `shape` (HF order: slowest first).
    F32 data is copied (the mmap is read-only); F16/BF16 and other types via gguf."""
    if tensor_type in _BLOCK_BYTES:
        return _DEQUANT[tensor_type](raw_blocks(data, tensor_type)).reshape(shape)
    arr = gguf_dequantize(data, tensor_type).reshape(shape)
    return torch.from_numpy(np.array(arr, dtype=np.float32, copy=True))


def raw_blocks(data: np.ndarray, tensor_type: T) -> torch.Tensor:
    """A tensor's raw bytes -> uint8 [blocks, block bytes] (copied when `data` is a view of
    the read-only mmap: torch wants a writeable array)."""
    blocks = np.ascontiguousarray(data).reshape(-1, _BLOCK_BYTES[tensor_type])
    if not blocks.flags.writeable:
        blocks = blocks.copy()
    return torch.from_numpy(blocks)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] bytes -> [n, 1] float32."""
    return b.contiguous().view(torch.float16).float()


def _bits(b: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    """[..., k] uint8 -> [..., len(shifts), k]: (b >> s) & mask for each shift."""
    s = torch.tensor(shifts, dtype=torch.uint8).view(-1, 1)
    return (b.unsqueeze(-2) >> s) & mask


# `*_parts`: a block's integers and scales before the multiplication (the exact int4 /
# int8 groups of gguf_int4.py / gguf_int8.py are these); `_q*` their float32 values.

def q8_0_parts(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> q int8 [n, 32], d [n, 1]: w = d * q."""
    return raw[:, 2:].contiguous().view(torch.int8), _f16(raw[:, :2])


def q5_0_parts(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> q int8 [n, 32] (already minus 16), d [n, 1]: w = d * q."""
    n = raw.shape[0]
    # Bit i of the little-endian uint32 qh = bit i % 8 of byte i // 8.
    qh = _bits(raw[:, 2:6], list(range(8)), 1).transpose(1, 2).reshape(n, 32)
    ql = _bits(raw[:, 6:], [0, 4], 0x0F).reshape(n, 32)
    return (ql | (qh << 4)).view(torch.int8) - 16, _f16(raw[:, :2])


def _q8_0(raw: torch.Tensor) -> torch.Tensor:
    q, d = q8_0_parts(raw)
    return q.float() * d


def _q5_0(raw: torch.Tensor) -> torch.Tensor:
    q, d = q5_0_parts(raw)
    return d * q.float()


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins: bytes 0-3 hold scales 0-3 (low 6
    bits) and the top 2 bits of scales 4-7, bytes 4-7 the same for the mins, bytes 8-11
    the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble)."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k4_scales(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = raw.shape[0]
    sc, mn = _scale_min_k4(raw[:, 4:16])
    d = (_f16(raw[:, 0:2]) * sc.float()).view(n, 8, 1)
    dm = (_f16(raw[:, 2:4]) * mn.float()).view(n, 8, 1)
    return d, dm


def q4_k_parts(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> q uint8 [n, 8, 32] (0..15), d [n, 8, 1], dm [n, 8, 1]: w = d * q - dm."""
    n = raw.shape[0]
    d, dm = _k4_scales(raw)
    # [n, 4 chunks, 32] -> [n, 4, 2 (low, high), 32] -> 8 sub-blocks
    return _bits(raw[:, 16:].reshape(n, 4, 32), [0, 4], 0x0F).reshape(n, 8, 32), d, dm


def _q4_k(raw: torch.Tensor) -> torch.Tensor:
    q, d, dm = q4_k_parts(raw)
    return (d * q.float() - dm).reshape(raw.shape[0], 256)


def _q5_k(raw: torch.Tensor) -> torch.Tensor:
    n = raw.shape[0]
    d, dm = _k4_scales(raw)
    qh = _bits(raw[:, 16:48], list(range(8)), 1)  # [n, 8 sub-blocks, 32]
    ql = _bits(raw[:, 48:].reshape(n, 4, 32), [0, 4], 0x0F).reshape(n, 8, 32)
    q = (ql | (qh << 4)).float()
    return (d * q - dm).reshape(n, 256)


def q6_k_parts(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> q int8 [n, 16, 16] (already minus 32), s [n, 16, 1] = d * sc: w = s * q."""
    n = raw.shape[0]
    scales = raw[:, 192:208].contiguous().view(torch.int8).float()
    s = (_f16(raw[:, 208:210]) * scales).view(n, 16, 1)
    # Low nibbles: two 64-byte halves, each [low 4 bits | high 4 bits] -> 4 x 32 weights
    # per half; high 2 bits: two 32-byte halves, shifts 0, 2, 4, 6 -> 4 x 32 per half.
    ql = _bits(raw[:, :128].reshape(n, 2, 64), [0, 4], 0x0F).reshape(n, 8, 32)
    qh = _bits(raw[:, 128:192].reshape(n, 2, 32), [0, 2, 4, 6], 0x03).reshape(n, 8, 32)
    return ((ql | (qh << 4)).view(torch.int8) - 32).reshape(n, 16, 16), s


def _q6_k(raw: torch.Tensor) -> torch.Tensor:
    q, s = q6_k_parts(raw)
    return (s * q.float()).reshape(raw.shape[0], 256)


_DEQUANT = {T.Q8_0: _q8_0, T.Q5_0: _q5_0, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k}
