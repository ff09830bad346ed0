"""The gated MLP of a decoder layer (SwiGLU or GeGLU), also each expert of a MoE block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.cpu_kernels.ops import eager_kernels
from radixlm.models.model_config import ModelConfig
from radixlm.models.parallel_context import ParallelContext
from radixlm.models.parallel_layers import ColumnParallelLinear, RowParallelLinear, even_shard


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); act = SiLU (SwiGLU) or tanh-GELU (GeGLU); rows of
    gate_up_proj are [gate; up]. `reduce=False` leaves the row-parallel sum to the caller
    (a MoE block adds its experts first, then all-reduces once)."""

    def __init__(self, config: ModelConfig, ctx: ParallelContext,
                 intermediate_size: int | None = None, reduce: bool = True) -> None:
        super().__init__()
        # Each rank: its intermediate/tp gate rows, then the same up rows, so chunk(2)
        # below pairs gate and up of the same features.
        inter = intermediate_size or config.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(
            config.hidden_size, [even_shard(s, inter, ctx, "intermediate features")
                                 for s in ("gate", "up")],
            bias=config.mlp_bias, ctx=ctx)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias=config.mlp_bias,
                                           ctx=ctx, what="intermediate features",
                                           reduce=reduce)
        self.gelu = config.hidden_act == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up_proj = self.gate_up_proj
        # One call where gate_up's method fuses act * up into its GEMM (AMX tiles).
        gated = gate_up_proj.method_gated
        if gated is not None:
            fused = gated(x, self.gelu)
            if fused is not None:
                return self.down_proj.forward(fused)
        # .forward, not __call__: see models/decoder.py's docstring.
        gate_up = gate_up_proj.forward(x)
        kernels = eager_kernels(gate_up)
        if kernels is not None:
            act_mul = kernels.gelu_tanh_mul if self.gelu else kernels.silu_mul
            return self.down_proj.forward(act_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj.forward(act * up)
