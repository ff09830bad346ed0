"""GGUF Q8_0 / Q5_0 / Q6_K blocks -> exact Int8Groups (models/linear/int8_groups.py).

Q8_0: d (f16), 32 int8: w = d * q (group 32). Q5_0: d, 32 five-bit values: w = d * (q -
16) (group 32). Q6_K: 256 weights in 16 groups of 16, w = d * sc[g] * (q - 32) with an
int8 sc per group: s = d * sc is exact in float32 (11 + 7 bits) and so is s * q. The
unpacking is `gguf_dequant`'s (tested bit for bit against the `gguf` package), stopped
before the multiplication.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from radixlm.models.gguf_dequant import _bits, _f16
from radixlm.models.linear.int8_groups import Int8Groups

_BLOCK_BYTES = {T.Q8_0: 34, T.Q5_0: 22, T.Q6_K: 210}


def is_int8_type(tensor_type: T) -> bool:
    return tensor_type in _BLOCK_BYTES


def _q8_0(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    return raw[:, 2:].contiguous().view(torch.int8), _f16(raw[:, :2]), 32


def _q5_0(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    n = raw.shape[0]
    qh = _bits(raw[:, 2:6], list(range(8)), 1).transpose(1, 2).reshape(n, 32)
    ql = _bits(raw[:, 6:], [0, 4], 0x0F).reshape(n, 32)
    return (ql | (qh << 4)).view(torch.int8) - 16, _f16(raw[:, :2]), 32


def _q6_k(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    n = raw.shape[0]
    scales = raw[:, 192:208].contiguous().view(torch.int8).float()
    s = _f16(raw[:, 208:210]) * scales  # [n, 16]
    ql = _bits(raw[:, :128].reshape(n, 2, 64), [0, 4], 0x0F).reshape(n, 8, 32)
    qh = _bits(raw[:, 128:192].reshape(n, 2, 32), [0, 2, 4, 6], 0x03).reshape(n, 8, 32)
    q = ((ql | (qh << 4)).view(torch.int8) - 32).reshape(n, 256)
    return q, s, 16


_UNPACK = {T.Q8_0: _q8_0, T.Q5_0: _q5_0, T.Q6_K: _q6_k}


def int8_groups_from_blocks(data: np.ndarray, tensor_type: T, rows: int,
                            cols: int) -> Int8Groups:
    """`data`: the tensor's raw bytes, rows of `cols` weights (HF's input features)."""
    blocks = np.ascontiguousarray(data).reshape(-1, _BLOCK_BYTES[tensor_type])
    if not blocks.flags.writeable:
        blocks = blocks.copy()
    q, s, group = _UNPACK[tensor_type](torch.from_numpy(blocks))
    return Int8Groups(q.reshape(rows, cols).contiguous(),
                      s.reshape(rows, cols // group).float().contiguous(), group)
