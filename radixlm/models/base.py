"""The model interface the executor relies on, whatever the architecture."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from radixlm.forward_batch import ForwardBatch
    from radixlm.models.linear import LinearPolicy
    from radixlm.models.model_config import ModelConfig


@runtime_checkable
class CausalLM(Protocol):
    config: "ModelConfig"

    def forward(self, forward_batch: "ForwardBatch") -> torch.Tensor:
        """Run all tokens of the batch; writes their K/V into the pool (through the
        attention backend). Returns float32 logits [len(logits_indices), vocab]."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (HF-named) checkpoint tensors into the parameters; every parameter
        must be covered, else ValueError."""

    def finalize_linear(self, policy: "LinearPolicy") -> None:
        """Build the LM head's LinearMethod (models/linear/); the decoder layers' linear
        layers build their own (`apply_linear_policy` visits every module)."""

    def init_non_persistent_buffers(self) -> None:
        """(Re)compute buffers that are not in checkpoints, e.g. the RoPE cos/sin cache;
        needed after the model was materialized from the meta device."""
