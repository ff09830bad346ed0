"""The AttentionBackend interface and the registry that picks one by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.attention.radix_attention import RadixAttention
    from radixlm.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    # Decode metadata computed on the device from the batch's tensors alone (no host
    # values, shapes fixed by the batch size): what a captured CUDA graph or a compiled
    # decode graph (executor/decode_graph_runner.py) needs.
    supports_decode_graphs: bool = False

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Precompute per-pass metadata (index tensors, masks) shared by all layers."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer: "RadixAttention", forward_batch: "ForwardBatch") -> torch.Tensor:
        """q: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim] of the new tokens.

        Writes k, v into token_to_kv_pool at forward_batch.out_cache_loc (mutates the
        pool), then returns the attention output [T, heads, head_dim].
        """


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_attention_backend_name(name: str, device: torch.device,
                                   sliding_window: bool = False) -> str:
    """auto: triton on CUDA (torch when triton is not installed, or when the model has
    sliding-window layers, which the triton kernels do not mask), torch elsewhere."""
    if name == "triton" and sliding_window:
        raise ValueError("--attention-backend triton does not implement sliding-window "
                         "attention (this model's local layers, e.g. Gemma 3); use "
                         "--attention-backend torch (or auto)")
    if name != "auto":
        return name
    if sliding_window:
        return "torch"
    return "triton" if device.type == "cuda" and triton_available() else "torch"


def create_attention_backend(name: str, device: torch.device | None = None,
                             sliding_window: bool = False) -> AttentionBackend:
    """`sliding_window`: the model has layers with a window (RadixAttention)."""
    device = device or torch.device("cpu")
    name = resolve_attention_backend_name(name, device, sliding_window)
    if name == "torch":
        from radixlm.cpu_kernels.ops import decode_attention_available
        from radixlm.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend(decode_kernel=device.type == "cpu"
                                     and decode_attention_available())
    if name == "triton":
        if not triton_available():
            raise ValueError("--attention-backend triton needs the triton package (pip install triton)")
        from radixlm.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend(device)
    raise ValueError(f"unknown attention backend {name!r}; available: auto, torch, triton")
