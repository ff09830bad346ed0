"""Rotary position embedding (neox / rotate-half layout, as in HF Llama).

The cos/sin of every position up to max_position_embeddings is computed once (in
float32, then stored in the model dtype exactly like HF casts its cos/sin) and indexed by
`positions` at each forward: no per-step trigonometry.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from radixlm.cpu_kernels.ops import eager_kernels

from radixlm.models.model_config import ModelConfig


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None,
                  freq_factors: tuple[float, ...] | None = None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in float32 for the given RoPE scaling."""
    # Same arithmetic as HF (int64 arange -> float, then divide) so results are bit-equal.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if freq_factors is not None:
        # GGUF `rope_freqs`: llama.cpp divides each frequency by its factor.
        inv_freq = inv_freq / torch.tensor(freq_factors, dtype=torch.float32)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "linear":
        # Scaling positions by 1/factor == scaling the frequencies by 1/factor.
        inv_freq = inv_freq / float(scaling["factor"])
    elif rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    return inv_freq


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency-dependent scaling.

    Wavelengths shorter than original_ctx / high_freq_factor keep their frequency, those
    longer than original_ctx / low_freq_factor are slowed down by `factor`, and the band
    in between interpolates linearly (in 1/wavelength) between the two.
    """
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_ctx / high) & ~(wavelen > old_ctx / low)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """`theta` given: that base without scaling or frequency factors (Gemma 3's local
    layers); else the config's RoPE."""

    def __init__(self, config: ModelConfig, theta: float | None = None) -> None:
        super().__init__()
        self.config = config
        self.theta = theta
        # cos_sin_cache[p] = [cos(p * f_0..f_{d/2-1}), sin(p * f_0..f_{d/2-1})]: [max_pos, head_dim]
        # Not in checkpoints (non-persistent); `reset_cache()` recomputes it after a model was
        # materialized from the meta device.
        self.register_buffer("cos_sin_cache", self._compute_cache(), persistent=False)

    def _compute_cache(self) -> torch.Tensor:
        c = self.config
        if torch.empty(()).is_meta:  # a model built on the meta device: reset_cache() fills
            # it once materialized (computing on meta runs torch's reference ops, whose
            # first use imports torch._dynamo: ~1.5 s of every start)
            return torch.empty(c.max_position_embeddings, c.head_dim)
        inv_freq = (rope_inv_freq(c.head_dim, self.theta, None) if self.theta is not None
                    else rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling,
                                       c.rope_freq_factors))
        pos = torch.arange(c.max_position_embeddings, dtype=torch.int64).to(torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]  # [max_pos, d/2], as HF's position * inv_freq
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)

    @torch.no_grad()
    def reset_cache(self) -> None:
        """Recompute the cache in float32 on the CPU, then copy it (cast) into place."""
        with torch.device("cpu"):
            cache = self._compute_cache()
        self.cos_sin_cache.copy_(cache)

    def forward(self, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, head_dim // 2] for the tokens at `positions` [T]; computed once per
        forward pass and shared by all layers."""
        cos, sin = self.cos_sin_cache[positions].to(dtype).chunk(2, dim=-1)
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 head_dim: int) -> torch.Tensor:
    """Rotate x [T, heads * head_dim] by the per-token angles cos/sin [T, head_dim // 2].
    On the CPU's eager forward: one C++ pass (`cpu_kernels/norm_rope.cpp`, same rounding)."""
    kernels = eager_kernels(x)
    if kernels is not None and cos.dtype == x.dtype:
        return kernels.rotary(x, cos, sin, head_dim)
    t = x.shape[0]
    x = x.view(t, -1, head_dim)
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
    # HF: x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), rotate_half(x) = cat(-x2, x1)
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.view(t, -1)
