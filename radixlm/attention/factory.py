"""Pick an attention backend by name (--attention-backend) and build it."""

from __future__ import annotations

import torch

from radixlm.attention.base import AttentionBackend


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
