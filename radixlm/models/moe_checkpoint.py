"""Expert tensors of MoE checkpoints -> one HF-named tensor per expert and projection.

transformers 5 saves an MoE layer's experts fused: `mlp.experts.gate_up_proj`
[E, 2 * inter, hidden] (each expert's gate rows, then its up rows) and
`mlp.experts.down_proj` [E, hidden, inter]; older checkpoints store
`mlp.experts.{e}.{gate,up,down}_proj.weight`. The model loads the per-expert form
(models/moe.py: each expert is a GatedMLP), so fused tensors are split here, one expert
slice at a time (views: no copy of the whole stack).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from radixlm.models.linear import as_dense


def split_fused_experts(weights: Iterable[tuple[str, torch.Tensor]]
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        if name.endswith(".experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            stack = as_dense(tensor)
            inter = stack.shape[1] // 2
            for e in range(stack.shape[0]):
                yield f"{prefix}{e}.gate_proj.weight", stack[e, :inter]
                yield f"{prefix}{e}.up_proj.weight", stack[e, inter:]
        elif name.endswith(".experts.down_proj"):
            prefix = name[: -len("down_proj")]
            stack = as_dense(tensor)
            for e in range(stack.shape[0]):
                yield f"{prefix}{e}.down_proj.weight", stack[e]
        else:
            yield name, tensor
