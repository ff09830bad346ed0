"""Int8WeightOnlyLinear: symmetric per-output-channel int8 weights (w = q * s, q in
-127..127), applied by PyTorch's CPU weight-only kernel (`aten._weight_int8pack_mm`) for
calls of at most `max_m` rows; larger calls take the dense fallback, which holds the same
dequantized values (`SmallBatchQuantized`). Made from a dense weight at load with
`--quantization int8`.
"""

from __future__ import annotations

import torch

from radixlm.models.linear.method import LinearMethod, SmallBatchQuantized


def quantize_per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (q int8 [out, in], scales float32 [out]); an all-zero row gets
    scale 1 (q = 0)."""
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


def int8_kernel_available(device: torch.device) -> bool:
    return device.type == "cpu" and hasattr(torch.ops.aten, "_weight_int8pack_mm")


class Int8WeightOnlyLinear(SmallBatchQuantized):
    format = "int8 weight-only"

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, fallback: LinearMethod,
                 max_m: int, act_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(fallback, max_m)
        self.register_buffer("q", q.contiguous(), persistent=False)
        self.register_buffer("scales", scales.float(), persistent=False)
        self.register_buffer("kernel_scales", scales.to(act_dtype), persistent=False)
        self.act_dtype = act_dtype

    @staticmethod
    def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return q.float() * scales.float()[:, None]

    def small(self, x: torch.Tensor) -> torch.Tensor:
        xa = x if x.dtype == self.act_dtype else x.to(self.act_dtype)
        y = torch.ops.aten._weight_int8pack_mm(xa, self.q, self.kernel_scales)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def kernel_bytes(self) -> int:
        return self.q.numel() + self.kernel_scales.numel() * self.kernel_scales.element_size()

    def dequantized_weight(self) -> torch.Tensor:
        return self.dequantize(self.q, self.scales)
