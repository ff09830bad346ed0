"""Mixtral (HF `MixtralForCausalLM`): Llama's attention with a sparse MoE block
(models/moe.py) in every layer; the top-k router probabilities are always
renormalized. Checkpoints name the block `block_sparse_moe` and the experts' gate, down
and up projections w1, w2, w3 (transformers 4.x); transformers 5 saves the fused
`mlp.experts.gate_up_proj` / `down_proj` tensors instead. Both load."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from radixlm.models.decoder import DecoderForCausalLM
from radixlm.models.moe_checkpoint import split_fused_experts

_RENAMES = ((".block_sparse_moe.", ".mlp."), (".w1.", ".gate_proj."),
            (".w2.", ".down_proj."), (".w3.", ".up_proj."))


class MixtralForCausalLM(DecoderForCausalLM):
    def checkpoint_tensors(self, weights: Iterable[tuple[str, torch.Tensor]]
                           ) -> Iterator[tuple[str, torch.Tensor]]:
        def renamed() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                for old, new in _RENAMES:
                    name = name.replace(old, new)
                yield name, tensor

        return split_fused_experts(renamed())
