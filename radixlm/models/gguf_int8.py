"""GGUF Q8_0 / Q5_0 / Q6_K blocks -> exact Int8Groups (models/linear/int8_groups.py).

Q8_0: d (f16), 32 int8: w = d * q (group 32). Q5_0: d, 32 five-bit values: w = d * (q -
16) (group 32). Q6_K: 256 weights in 16 groups of 16, w = d * sc[g] * (q - 32) with an
int8 sc per group: s = d * sc is exact in float32 (11 + 7 bits) and so is s * q. The
unpacking is `gguf_dequant`'s (tested bit for bit against the `gguf` package), stopped
before the multiplication.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from radixlm.models.gguf_dequant import q5_0_parts, q6_k_parts, q8_0_parts, raw_blocks
from radixlm.models.linear.int8_groups import Int8Groups

# type -> (its blocks' integers and scales, weights per scale)
_UNPACK = {T.Q8_0: (q8_0_parts, 32), T.Q5_0: (q5_0_parts, 32), T.Q6_K: (q6_k_parts, 16)}


def is_int8_type(tensor_type: T) -> bool:
    return tensor_type in _UNPACK


def int8_group_size(tensor_type: T) -> int:
    """Weights per float32 scale in the Int8Groups of an int8 type."""
    return _UNPACK[tensor_type][1]


def int8_groups_from_blocks(data: np.ndarray, tensor_type: T, rows: int,
                            cols: int) -> Int8Groups:
    """`data`: the tensor's raw bytes, rows of `cols` weights (HF's input features)."""
    q, s = _UNPACK[tensor_type][0](raw_blocks(data, tensor_type))
    group = int8_group_size(tensor_type)
    return Int8Groups(q.reshape(rows, cols).contiguous(),
                      s.reshape(rows, cols // group).float().contiguous(), group)
