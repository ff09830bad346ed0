"""Triton attention backend: the decode (split-KV) and extend kernels of
radixlm/attention/triton_kernels/ over the pool and req_to_token.

The default on CUDA. On the CPU it runs only under TRITON_INTERPRET=1 (the tests compare
it with the torch backend there); it is far too slow to serve that way.

Per forward pass, `init_forward_metadata` builds the device index tensors every layer
shares; the per-layer `forward` writes the new K/V into the pool (as the torch backend
does) and launches the kernels. DECODE takes the decode kernels; EXTEND and MIXED (a
decode riding along as a one-token extend) take the extend kernel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.attention.base import AttentionBackend
from radixlm.attention.triton_kernels import decode_attention_fwd, extend_attention_fwd
from radixlm.attention.triton_kernels.decode_attention import alloc_mid, num_kv_splits_for

if TYPE_CHECKING:
    from radixlm.attention.radix_attention import RadixAttention
    from radixlm.forward_batch import ForwardBatch


@dataclass(frozen=True)
class TritonAttentionConfig:
    """Kernel tiling. Decode splits a request's KV into ceil(seq_len / min_split_tokens)
    parts, at most max_kv_splits (more parallelism for small batches of long sequences)."""

    max_kv_splits: int = 16
    min_split_tokens: int = 256
    decode_block_n: int = 64
    extend_block_m: int = 64
    extend_block_n: int = 64
    num_warps: int = 4


@dataclass
class _DecodeMetadata:
    num_kv_splits: torch.Tensor  # [B] int32, per request, on the device
    # Stage-1 scratch shared by the layers of this pass (made by the first layer; every
    # layer of a model has the same heads and head_dim).
    mid: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class _ExtendMetadata:
    prefix_lens: torch.Tensor  # [B] int32
    extend_lens: torch.Tensor  # [B] int32
    extend_start: torch.Tensor  # [B] int32: first row of request b in the flat T dimension
    max_extend_len: int


class TritonAttentionBackend(AttentionBackend):
    # Decode: num_kv_splits comes from seq_lens on the device, the grid from the batch size.
    supports_decode_graphs = True

    def __init__(self, device: torch.device, config: TritonAttentionConfig | None = None) -> None:
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("the triton attention backend runs on the CPU only under "
                             "TRITON_INTERPRET=1 (slow, for tests); use --attention-backend torch")
        self.device = device
        self.config = config or TritonAttentionConfig()
        self.decode_md: _DecodeMetadata | None = None
        self.extend_md: _ExtendMetadata | None = None

    def init_forward_metadata(self, fb: "ForwardBatch") -> None:
        if fb.forward_mode.is_decode():
            self.decode_md = _DecodeMetadata(num_kv_splits_for(
                fb.seq_lens, self.config.max_kv_splits, self.config.min_split_tokens))
            return
        # Staged with the batch (no host->device copy here); extend_start[b] = ext[0] +
        # ... + ext[b-1], the flat T layout of ForwardBatch.
        prefix, ext, starts = fb.extend_index_tensors()
        self.extend_md = _ExtendMetadata(prefix, ext, starts,
                                         max(fb.extend_seq_lens_cpu, default=0))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer: "RadixAttention", fb: "ForwardBatch") -> torch.Tensor:
        pool = fb.token_to_kv_pool
        pool.set_kv(layer.layer_id, fb.out_cache_loc, k, v)
        k_buf, v_buf = pool.get_kv(layer.layer_id)
        q = _last_dim_contiguous(q)
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        req_to_token = fb.req_to_token_pool.req_to_token
        cfg = self.config
        if fb.forward_mode.is_decode():
            md = self.decode_md
            if md.mid is None or md.mid[0].shape[1:] != (q.shape[1], cfg.max_kv_splits, q.shape[2]):
                md.mid = alloc_mid(q.shape[0], q.shape[1], q.shape[2], cfg.max_kv_splits, q.device)
            decode_attention_fwd(q, k_buf, v_buf, o, req_to_token, fb.req_pool_indices,
                                 fb.seq_lens, md.num_kv_splits, cfg.max_kv_splits,
                                 layer.scaling, block_n=cfg.decode_block_n,
                                 num_warps=cfg.num_warps, mid=md.mid)
            return o
        md = self.extend_md
        # The kernel reads the new tokens' K/V from k, v in the pool's dtype, as the
        # prefix (so both parts of the softmax see the same rounding).
        k = _last_dim_contiguous(k.to(pool.dtype))
        v = _last_dim_contiguous(v.to(pool.dtype))
        extend_attention_fwd(q, k, v, o, k_buf, v_buf, req_to_token, fb.req_pool_indices,
                             md.prefix_lens, md.extend_lens, md.extend_start,
                             md.max_extend_len, layer.scaling, block_m=cfg.extend_block_m,
                             block_n=cfg.extend_block_n, num_warps=cfg.num_warps)
        return o


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()
