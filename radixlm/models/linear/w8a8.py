"""W8A8Int8Linear: int8 weights x int8 activations through oneDNN's int8 GEMM (VNNI/AMX).

Weights: symmetric int8 per output channel (w = q * s_w, q in -127..127), made at load
from the layer's dense weight (for a GGUF int4 layer: its dequantized values), packed
once for oneDNN (`onednn.qlinear_prepack`). Activations: symmetric per token, stored as
uint8 with zero point 128 (x = (u - 128) * s_x, s_x = amax(|x_row|) / 127), quantized at
every call: oneDNN's VNNI kernel is u8 x s8 (int8 activations take a reference path,
~100x slower). `onednn.qlinear_pointwise` computes ((u - 128) @ q^T) * s_w in float32
with x_scale 1; the token scales and the bias are applied to its output, returned in
x's dtype.

SGLang's `w8a8_int8`, opt-in: needs torch's oneDNN int8 linear and VNNI/AMX int8 dot
products (`w8a8_kernel_available`; elsewhere the engine refuses it); without calibration
(SmoothQuant) the default model's logits move by ~20% (docs/benchmarks.md): not a default.
"""

from __future__ import annotations

import torch

from radixlm.models.linear.int8 import quantize_per_channel_int8
from radixlm.runtime import cpu_features
from radixlm.models.linear.method import LinearMethod


def w8a8_kernel_available(device: torch.device) -> bool:
    """torch's oneDNN int8 linear, on a CPU with int8 dot products (VNNI or AMX-INT8:
    without them its AVX2 path saturates 16-bit sums; `cpu_features.int8_dot_products`)."""
    return (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.onednn, "qlinear_prepack")
            and hasattr(torch.ops.onednn, "qlinear_pointwise")
            and cpu_features.int8_dot_products())


ACT_ZERO_POINT = 128


def quantize_per_token_u8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (u uint8 [M, K], scales float32 [M, 1]); x ~= (u - 128) * scales,
    u - 128 in -127..127 (symmetric int8 shifted by the zero point, rounded half up)."""
    # (Each step a plain same-shape or broadcast op: torch's vectorized paths; measured
    # faster than vector_norm(inf) and addcmul, which take scalar loops here.)
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp_min_(1e-30)
    # float32 x * 127 / amax + 128.5 in [1.5, 255.5]; the cast truncates: floor = round
    u = torch.mul(x, 127.0 / amax).add_(ACT_ZERO_POINT + 0.5).to(torch.uint8)
    return u, amax.div_(127.0)


class W8A8Int8Linear(LinearMethod):
    format = "w8a8 int8 (oneDNN)"

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, batch_hint: int = 32) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        # The int8 values in oneDNN's blocked layout (opaque: the only copy kept).
        self.register_buffer("packed", torch.ops.onednn.qlinear_prepack(
            q.contiguous(), [batch_hint, self.in_features]), persistent=False)
        self.register_buffer("scales", scales.float().contiguous(), persistent=False)
        self.register_buffer("zero_points", torch.zeros(1, dtype=torch.int64),  # all 0
                             persistent=False)

    @classmethod
    def from_dense(cls, weight: torch.Tensor) -> "W8A8Int8Linear":
        return cls(*quantize_per_channel_int8(weight))

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:
            return x.new_zeros(*lead, self.out_features)
        ux, xs = quantize_per_token_u8(x2)
        y = torch.ops.onednn.qlinear_pointwise(
            ux, 1.0, ACT_ZERO_POINT, self.packed, self.scales, self.zero_points, None, 1.0, 0,
            torch.float32, "none", [], "")
        y = y.mul_(xs)  # float32 in place (mixed-dtype ops take torch's slow paths)
        if bias is not None:
            y = y.add_(bias if bias.dtype == torch.float32 else bias.float())
        return (y if y.dtype == x.dtype else y.to(x.dtype)).reshape(*lead, self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        # x = I: each row quantizes exactly (u = 255 on the diagonal, 128 elsewhere) and
        # picks out one column of q * s_w (float32 rounding only).
        eye = torch.eye(self.in_features, dtype=torch.float32)
        return self.forward(eye).t().contiguous()
