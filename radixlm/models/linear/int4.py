"""Int4GroupwiseLinear: 4-bit weights in groups of 32 along the input features.

Kept twice, both exact: the canonical groups (q packed two per byte, d and m in float32;
`dequantized_weight()` gives the checkpoint's values bit for bit) and the form of
PyTorch's CPU int4 kernel (`aten._convert_weight_to_int4pack_for_cpu` /
`_weight_int4pack_mm_for_cpu`), which computes w = (q - 8) * scale + zero with the
scales and zeros in the activation dtype: scale = d, zero = m + 8 d. The kernel runs on
bfloat16 activations only (its float32 path is a slow reference); calls of more than
`max_m` rows take the dense fallback (`SmallBatchQuantized`).
"""

from __future__ import annotations

import torch

from radixlm.models.linear.int4_groups import Int4Groups
from radixlm.models.linear.method import LinearMethod, SmallBatchQuantized

# The kernel packs output rows in blocks of 16 (it refuses other N).
KERNEL_ROW_MULTIPLE = 16


def int4_bytes_per_weight(act_bytes: int, group_size: int = 32) -> float:
    """What Int4GroupwiseLinear keeps per weight (its dense fallback not included): the
    canonical nibbles (0.5) and float32 d, m, the kernel's nibbles (0.5) and its
    scale/zero pair in the activation dtype."""
    return 0.5 + 8 / group_size + 0.5 + 2 * act_bytes / group_size


def int4_kernel_runs_on(device: torch.device) -> bool:
    return device.type == "cpu" and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def int4_kernel_fits(groups: Int4Groups) -> bool:
    return groups.shape[0] % KERNEL_ROW_MULTIPLE == 0


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[rows, in] values 0..15 -> [rows, in / 2] uint8, column 2j in the low nibble."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    return torch.stack([p & 15, p >> 4], dim=-1).view(p.shape[0], -1)


class Int4GroupwiseLinear(SmallBatchQuantized):
    format = "int4 groupwise"

    def __init__(self, groups: Int4Groups, fallback: LinearMethod, max_m: int,
                 act_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(fallback, max_m)
        self.group_size = groups.group_size
        self.out_features, self.in_features = groups.shape
        self.register_buffer("q_packed", pack_nibbles(groups.q), persistent=False)
        self.register_buffer("d", groups.d.float().contiguous(), persistent=False)
        self.register_buffer("m", groups.m.float().contiguous(), persistent=False)
        self.register_buffer("kernel_weight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            groups.q.to(torch.int32).contiguous(), 1), persistent=False)
        # [groups, out, 2]: the kernel's (scale, zero) per group and output row.
        zero = groups.m.float() + 8 * groups.d.float()
        self.register_buffer("kernel_scale_zeros", torch.stack(
            [groups.d.float().t(), zero.t()], dim=-1).to(act_dtype).contiguous(),
            persistent=False)
        self.act_dtype = act_dtype

    def small(self, x: torch.Tensor) -> torch.Tensor:
        # (dtype checks, not no-op .to() calls: ~1.5 us each, 240 per decode step)
        xa = x if x.dtype == self.act_dtype else x.to(self.act_dtype)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            xa, self.kernel_weight, self.group_size, self.kernel_scale_zeros)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def kernel_bytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for t in (self.kernel_weight, self.kernel_scale_zeros))

    def groups(self) -> Int4Groups:
        return Int4Groups(unpack_nibbles(self.q_packed), self.d, self.m, self.group_size)

    def dequantized_weight(self) -> torch.Tensor:
        return self.groups().dequantize()
