"""Attention backends: read K/V through req_to_token, write new K/V at out_cache_loc."""

from radixlm.attention.base import AttentionBackend
from radixlm.attention.factory import create_attention_backend
from radixlm.attention.radix_attention import RadixAttention

__all__ = ["AttentionBackend", "RadixAttention", "create_attention_backend"]
