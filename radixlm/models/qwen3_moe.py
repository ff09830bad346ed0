"""Qwen3-MoE (HF `Qwen3MoeForCausalLM`): Qwen3's attention (q/k norm) with a sparse MoE
block (models/moe.py) in every layer not listed in `dense_mlp_layers`; routing
renormalizes the top-k probabilities when the config's `norm_topk_prob` says so."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from radixlm.models.decoder import DecoderForCausalLM
from radixlm.models.moe_checkpoint import split_fused_experts


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    def checkpoint_tensors(self, weights: Iterable[tuple[str, torch.Tensor]]
                           ) -> Iterator[tuple[str, torch.Tensor]]:
        return split_fused_experts(weights)
