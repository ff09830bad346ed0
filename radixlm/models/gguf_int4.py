"""GGUF Q4_0 / Q4_1 / Q4_K blocks -> exact Int4Groups (models/linear/int4_groups.py).

A block is 32 weights of one row: Q4_1 = d (f16), m (f16), 16 bytes of nibbles; Q4_0 =
d (f16), 16 bytes. Byte j of a block holds weight j in its low nibble and weight j + 16
in its high nibble. Q4_1: w = d * q + m; Q4_0: w = d * (q - 8) = d * q + m with m = -8 d
(exact: an 11-bit d times 8 is a power-of-two scaling, and d * q and d * (q - 8) have
at most 15 significant bits). Q4_K: 256 weights in 8 sub-blocks of 32, w = d * sc * q -
dmin * mn with six-bit sc, mn: groups of 32 with d = d * sc, m = -dmin * mn (exact in
float32; the unpacking is gguf_dequant's, tested against the `gguf` package).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType

from radixlm.models.linear.int4_groups import Int4Groups

_BLOCK = 32
# type -> bytes per block, whether the block has an m
_LAYOUTS = {GGMLQuantizationType.Q4_0: (18, False), GGMLQuantizationType.Q4_1: (20, True)}


def is_int4_type(tensor_type: GGMLQuantizationType) -> bool:
    return tensor_type in _LAYOUTS or tensor_type == GGMLQuantizationType.Q4_K


def _q4_k_groups(data: np.ndarray, rows: int, cols: int) -> Int4Groups:
    from radixlm.models.gguf_dequant import q4_k_parts, raw_blocks

    q, d, dm = q4_k_parts(raw_blocks(data, GGMLQuantizationType.Q4_K))  # d * sc, dmin * mn
    return Int4Groups(q.reshape(rows, cols).contiguous(), d.reshape(rows, cols // _BLOCK),
                      (-dm).reshape(rows, cols // _BLOCK), _BLOCK)


def int4_groups_from_blocks(data: np.ndarray, tensor_type: GGMLQuantizationType,
                            rows: int, cols: int) -> Int4Groups:
    """`data`: the tensor's raw bytes (uint8, [rows, row_bytes] or flat), rows of `cols`
    weights (GGUF's fastest dimension, HF's input features)."""
    if tensor_type == GGMLQuantizationType.Q4_K:
        return _q4_k_groups(data, rows, cols)
    block_bytes, has_m = _LAYOUTS[tensor_type]
    if cols % _BLOCK:
        raise ValueError(f"{tensor_type.name} row of {cols} weights is not whole blocks")
    blocks = np.ascontiguousarray(data).reshape(rows, cols // _BLOCK, block_bytes)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if has_m:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        nibbles = blocks[..., 4:]
    else:
        m = -8.0 * d
        nibbles = blocks[..., 2:]
    # [rows, blocks, 16] -> [rows, blocks, 2 (low, high), 16] -> weights 0..15, 16..31
    q = np.stack([nibbles & 0x0F, nibbles >> 4], axis=2).reshape(rows, cols)
    return Int4Groups(torch.from_numpy(q), torch.from_numpy(d), torch.from_numpy(m), _BLOCK)
