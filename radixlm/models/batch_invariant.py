"""The batch-invariant GEMM of --enable-deterministic-inference (every linear layer runs
it as a DenseLinear: models/linear/policy.py).

Why: a GEMM library picks its kernel (and with it the order in which it sums over the
reduction dimension K) from the shape of the call. On the 2-core AVX2 CPU this project
is developed on, MKL gives a token's row of `x @ W.T` three different bit patterns
depending only on how many rows M the call has (M = 1, M = 2..3, M >= 4: measured, see
docs/deterministic.md); cuBLAS likewise switches tile configs and split-K by M. So a
request's hidden states depend on how many other tokens share its forward pass.

More: docs/deterministic.md, "models/batch_invariant.py".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Rows per GEMM call. 32 keeps prefill GEMMs near full speed on the CPU (per-row cost at
# M = 32 within a few % of M = 256) and wastes at most 31 rows of a decode batch.
DEFAULT_ROW_TILE = 32


@dataclass(frozen=True)
class BatchInvariantOps:
    row_tile: int = DEFAULT_ROW_TILE

    def __post_init__(self) -> None:
        if self.row_tile < 1:
            raise ValueError(f"row_tile must be >= 1, got {self.row_tile}")

    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] @ weight[N, K].T (+ bias), every GEMM on exactly row_tile rows."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        m, t = x2.shape[0], self.row_tile
        padded = -(-m // t) * t  # m rounded up to whole tiles
        if padded != m:
            x2 = torch.cat([x2, x2.new_zeros(padded - m, x2.shape[1])])
        x2 = x2.contiguous()
        wt = weight.t()
        out = x2.new_empty(padded, weight.shape[0])
        # Tile i is rows [i*t, (i+1)*t): one fixed-shape [t, K] x [K, N] call each.
        for start in range(0, padded, t):
            torch.mm(x2[start:start + t], wt, out=out[start:start + t])
        out = out[:m]
        if bias is not None:
            out = out + bias
        return out.reshape(*lead, weight.shape[0])
