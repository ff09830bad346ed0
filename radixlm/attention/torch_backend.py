"""Torch attention backend: the reference backend, on any device torch runs on.

Extend loops over requests (one SDPA call each over K/V gathered from the pool; work per
step grows with the batch, not the tokens); a run of consecutive requests without a prefix
and of one length is one batched SDPA call over the step's own K/V (no gather). Decode, on
the CPU where the C++ kernel built (`cpu_kernels/decode_attention.cpp`), is one call per
layer reading K/V in place from the pool, with no host values (so compiled decode graphs
can hold it); elsewhere it is one batched attention (two matmuls) over K/V gathered into
a padded [B, max_seq_len] layout.
An extend batch's trailing one-token rows (a MIXED batch's running decodes) are a decode:
they take the decode path in one call, the rows before them the per-request loop.
A TARGET_VERIFY batch (speculative verify), with the kernel, writes its K/V into the pool
and then runs every token as a decode row of length position + 1 (row j of a request sees
its prefix and drafts 0..j: the causal mask), both in one kernel call per layer;
`verify_kernel` False sends it through the extend loop instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixlm.attention.base import AttentionBackend
from radixlm.cpu_kernels.ops import decode_attention_with_kv_write, paged_decode_attention

if TYPE_CHECKING:
    from radixlm.attention.radix_attention import RadixAttention
    from radixlm.forward_batch import ForwardBatch


@dataclass
class _DecodeMetadata:
    # [B * L] int64 KV slots, request-major (request b's L positions at [b*L, (b+1)*L));
    # padded positions point at dummy slot 0.
    kv_flat: torch.Tensor
    length: int  # L, the longest seq_len of the batch
    real: torch.Tensor  # [1, B, 1, L] bool, True where the key is real (kv head, request,
    # query head of the group, key) broadcast
    seq_lens: torch.Tensor  # [B]
    # sliding window -> `real` restricted to the last `window` keys (built on first use)
    windowed: dict[int, torch.Tensor] = field(default_factory=dict)

    def visible(self, window: int | None) -> torch.Tensor:
        if window is None:
            return self.real
        if window not in self.windowed:
            # The query sits at position seq_len - 1: keys k > seq_len - 1 - window.
            ar = torch.arange(self.length, device=self.real.device)
            recent = ar[None, :] >= (self.seq_lens[:, None] - window)
            self.windowed[window] = self.real & recent[None, :, None, :]
        return self.windowed[window]


@dataclass
class _ExtendMetadata:
    # Per request: the KV slots of all its positions [seq_len] and the bool causal mask
    # [extend_len, seq_len] (None when there is no prefix: plain is_causal).
    kv_indices: list[torch.Tensor]
    masks: list[torch.Tensor | None]
    token_offsets: list[int]  # start of each request's tokens in the flat T dimension
    prefix_lens: list[int]
    # Runs (first request, count) of consecutive requests with no prefix and one extend
    # length (`prefix_free_runs`): one batched SDPA call each over the step's own K/V.
    runs: list[tuple[int, int]] = field(default_factory=list)
    # sliding window -> per request mask [extend_len, seq_len] (built on first use)
    windowed: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def layer_masks(self, window: int | None) -> list[torch.Tensor | None]:
        if window is None:
            return self.masks
        if window not in self.windowed:
            masks = []
            for idx, prefix in zip(self.kv_indices, self.prefix_lens):
                seq = idx.shape[0]
                # Query j at position prefix + j sees keys (prefix + j - window, prefix + j].
                q_pos = torch.arange(prefix, seq, device=idx.device)[:, None]
                k_pos = torch.arange(seq, device=idx.device)[None, :]
                masks.append((k_pos <= q_pos) & (k_pos > q_pos - window))
            self.windowed[window] = masks
        return self.windowed[window]


def prefix_free_runs(prefix_lens: list[int], ext_lens: list[int]) -> list[tuple[int, int]]:
    """The requests as runs (first, count) in order: a run is either one request with a
    prefix, or consecutive prefix-free requests of one extend length (whose queries and
    K/V are then adjacent, equal-sized blocks of the flat token dimension)."""
    runs: list[tuple[int, int]] = []
    for i, (prefix, ext) in enumerate(zip(prefix_lens, ext_lens)):
        if runs and prefix == 0:
            first, n = runs[-1]
            if prefix_lens[first] == 0 and ext_lens[first] == ext:
                runs[-1] = (first, n + 1)
                continue
        runs.append((i, 1))
    return runs


def _run_blocks(x: torch.Tensor, off: int, n: int, ext: int) -> torch.Tensor:
    """Tokens [off, off + n * ext) of x [T, heads, d] as n requests' blocks
    [n, heads, ext, d] (a view)."""
    return x[off:off + n * ext].view(n, ext, *x.shape[1:]).transpose(1, 2)


@dataclass
class _VerifyMetadata:
    # Per flat token t of a TARGET_VERIFY batch: its request's req_to_token row and the
    # number of positions it sees (its position + 1).
    rows: torch.Tensor  # [T] int64
    lens: torch.Tensor  # [T] int64


class TorchAttentionBackend(AttentionBackend):
    def __init__(self, decode_kernel: bool = False, verify_kernel: bool = True) -> None:
        """decode_kernel: decode through radixlm::paged_decode_attention (CPU tensors);
        verify_kernel: TARGET_VERIFY batches too (only with decode_kernel)."""
        self.decode_kernel = decode_kernel
        self.verify_kernel = verify_kernel
        self.supports_decode_graphs = decode_kernel
        self.decode_md: _DecodeMetadata | None = None
        self.extend_md: _ExtendMetadata | None = None
        self.verify_md: _VerifyMetadata | None = None
        # Extend batches: the first request and flat token of the trailing one-token rows
        # that run as a decode (== batch size and T when there are none).
        self.tail_req = self.tail_tok = 0

    def init_forward_metadata(self, fb: "ForwardBatch") -> None:
        req_to_token = fb.req_to_token_pool.req_to_token
        if fb.forward_mode.is_decode():
            self._init_decode(fb.req_pool_indices, fb.seq_lens, max(fb.seq_lens_cpu),
                              req_to_token)
            return
        self.verify_md = None
        if fb.forward_mode.is_target_verify() and self.decode_kernel and self.verify_kernel:
            ext = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int64)
            rows = fb.req_pool_indices.to(torch.int64).repeat_interleave(
                ext, output_size=fb.input_ids.shape[0])
            self.verify_md = _VerifyMetadata(rows.contiguous(),
                                             (fb.positions.to(torch.int64) + 1).contiguous())
            return
        lens = fb.extend_seq_lens_cpu
        tail = len(lens)
        while tail > 0 and lens[tail - 1] == 1:
            tail -= 1
        if len(lens) - tail < 2:  # a lone one-token row stays in the loop
            tail = len(lens)
        self.tail_req, self.tail_tok = tail, sum(lens[:tail])
        if tail < len(lens):
            self._init_decode(fb.req_pool_indices[tail:], fb.seq_lens[tail:],
                              max(fb.seq_lens_cpu[tail:]), req_to_token)
        kv_indices, masks, offsets = [], [], []
        offset = 0
        rows_cpu = (fb.req_pool_indices_cpu if fb.req_pool_indices_cpu is not None
                    else fb.req_pool_indices.tolist())
        for row, prefix, ext in zip(rows_cpu[:tail], fb.extend_prefix_lens_cpu, lens):
            seq = prefix + ext
            kv_indices.append(req_to_token[row, :seq].to(torch.int64))
            if prefix == 0:
                masks.append(None)
            else:
                # Query j sits at absolute position prefix + j and sees keys 0..prefix + j.
                q_pos = torch.arange(prefix, seq, device=req_to_token.device)
                k_pos = torch.arange(seq, device=req_to_token.device)
                masks.append(k_pos[None, :] <= q_pos[:, None])
            offsets.append(offset)
            offset += ext
        prefixes = list(fb.extend_prefix_lens_cpu[:tail])
        self.extend_md = _ExtendMetadata(kv_indices, masks, offsets, prefixes,
                                         prefix_free_runs(prefixes, lens[:tail]))

    def _init_decode(self, rows_t: torch.Tensor, seq_lens: torch.Tensor, max_len: int,
                     req_to_token: torch.Tensor) -> None:
        if self.decode_kernel:
            return  # the kernel reads req_to_token and seq_lens itself
        rows = req_to_token[rows_t, :max_len].to(torch.int64)
        ar = torch.arange(max_len, device=rows.device)
        real = ar[None, :] < seq_lens[:, None]
        self.decode_md = _DecodeMetadata(kv_flat=rows.masked_fill(~real, 0).reshape(-1),
                                         length=max_len, real=real[None, :, None, :],
                                         seq_lens=seq_lens)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer: "RadixAttention", fb: "ForwardBatch") -> torch.Tensor:
        if fb.forward_mode.is_decode():
            return self._decode_rows(q, k, v, layer, fb, fb.out_cache_loc,
                                     fb.req_pool_indices, fb.seq_lens)
        if self.verify_md is not None and fb.forward_mode.is_target_verify():
            return self._verify_rows(q, k, v, layer, fb)
        b, t = self.tail_req, self.tail_tok
        if t == q.shape[0]:
            fb.token_to_kv_pool.set_kv(layer.layer_id, fb.out_cache_loc, k, v)
            return self._extend(q, k, v, *fb.token_to_kv_pool.get_kv(layer.layer_id), layer)
        out = torch.empty_like(q)
        out[t:] = self._decode_rows(q[t:], k[t:], v[t:], layer, fb, fb.out_cache_loc[t:],
                                    fb.req_pool_indices[b:], fb.seq_lens[b:])
        if t:
            fb.token_to_kv_pool.set_kv(layer.layer_id, fb.out_cache_loc[:t], k[:t], v[:t])
            out[:t] = self._extend(q[:t], k[:t], v[:t],
                                   *fb.token_to_kv_pool.get_kv(layer.layer_id), layer)
        return out

    def _verify_rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     layer: "RadixAttention", fb: "ForwardBatch") -> torch.Tensor:
        """A TARGET_VERIFY batch: all its K/V into the pool first (row j reads rows
        0..j-1's), then each token as a decode row of its own length, in one kernel call."""
        md = self.verify_md
        return decode_attention_with_kv_write(
            q, k, v, *fb.token_to_kv_pool.get_kv(layer.layer_id), fb.out_cache_loc,
            fb.req_to_token_pool.req_to_token, md.rows, md.lens, layer.scaling,
            layer.sliding_window or 0, kv_first=True)

    def _decode_rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     layer: "RadixAttention", fb: "ForwardBatch", loc: torch.Tensor,
                     rows: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """One query token per row (a decode, or an extend's trailing one-token rows)."""
        pool = fb.token_to_kv_pool
        k_buf, v_buf = pool.get_kv(layer.layer_id)
        if self.decode_kernel:
            window = layer.sliding_window or 0
            r2t = fb.req_to_token_pool.req_to_token
            if torch.compiler.is_dynamo_compiling():
                pool.set_kv(layer.layer_id, loc, k, v)
                return paged_decode_attention(q, k_buf, v_buf, r2t, rows, seq_lens,
                                              layer.scaling, window)
            # Eagerly one call writes the KV and attends (no index_put dispatches).
            return decode_attention_with_kv_write(q, k, v, k_buf, v_buf, loc, r2t, rows,
                                                  seq_lens, layer.scaling, window)
        pool.set_kv(layer.layer_id, loc, k, v)
        return self._decode(q, k_buf, v_buf, layer)

    def _decode(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                layer: "RadixAttention") -> torch.Tensor:
        """Two batched matmuls in float32 over K/V gathered head-first ([kv_heads, B, L,
        d], so that (kv head, request) is one contiguous batch of the matmuls). Each KV
        head's group of Q heads is one [group, d] x [d, L] product (GQA without repeating
        K/V). The gather is one index_select of whole slots (contiguous kv_heads x d rows:
        10x faster on the CPU than advanced indexing), then one transposing copy into
        float32. At batch 32 x 200 positions in bf16: 0.5 ms per layer vs 1.0 ms
        gathering with advanced indexing and 2.9 ms through SDPA's CPU kernel, which is
        built for long queries (docs/benchmarks.md, "CPU fast path")."""
        md = self.decode_md
        b, heads, d = q.shape
        kvh = layer.num_kv_heads
        length = md.length

        def gather(buf: torch.Tensor) -> torch.Tensor:  # -> [kvh, B, L, d] float32
            rows = buf.index_select(0, md.kv_flat)  # [B * L, kvh, d]
            return rows.transpose(0, 1).to(torch.float32, memory_format=torch.contiguous_format
                                           ).view(kvh, b, length, d)

        k, v = gather(k_buf), gather(v_buf)
        qg = q.view(b, kvh, heads // kvh, d).transpose(0, 1).float()  # [kvh, B, group, d]
        scores = torch.matmul(qg, k.transpose(-1, -2)).mul_(layer.scaling)  # [kvh, B, group, L]
        scores.masked_fill_(~md.visible(layer.sliding_window), float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [kvh, B, group, d]
        return out.transpose(0, 1).reshape(b, heads, d).to(q.dtype)

    def _extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor,
                v_buf: torch.Tensor, layer: "RadixAttention") -> torch.Tensor:
        """q [T, heads, d]; k, v [T, kvh, d] the step's own K/V, already in the pool.
        A request with a prefix (or a sliding-window mask) attends over its K/V gathered
        from the pool; a run of prefix-free requests over k/v themselves when the pool
        holds them exactly (same dtype), batched [n, heads, ext, d]."""
        md = self.extend_md
        out = torch.empty_like(q)
        gqa = layer.num_heads != layer.num_kv_heads
        masks = md.layer_masks(layer.sliding_window)
        own = k.dtype == k_buf.dtype == q.dtype
        for first, n in md.runs:
            mask, off = masks[first], md.token_offsets[first]
            if mask is None and own:
                ext = md.kv_indices[first].shape[0]  # no prefix: its whole sequence
                end = off + n * ext
                oi = F.scaled_dot_product_attention(
                    _run_blocks(q, off, n, ext), _run_blocks(k, off, n, ext),
                    _run_blocks(v, off, n, ext), is_causal=True, scale=layer.scaling,
                    enable_gqa=gqa)
                out[off:end] = oi.transpose(1, 2).reshape(end - off, *q.shape[1:])
                continue
            for i in range(first, first + n):
                idx, mask, off = md.kv_indices[i], masks[i], md.token_offsets[i]
                ext = idx.shape[0] - md.prefix_lens[i]
                qi = q[off:off + ext].transpose(0, 1).unsqueeze(0)  # [1, heads, ext, d]
                # index_select of whole slots: 2.4-5x faster on the CPU than k_buf[idx]
                # (advanced indexing) for 128-2048 positions.
                ki = k_buf.index_select(0, idx).transpose(0, 1).unsqueeze(0).to(q.dtype)
                vi = v_buf.index_select(0, idx).transpose(0, 1).unsqueeze(0).to(q.dtype)
                oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask,
                                                    is_causal=mask is None,
                                                    scale=layer.scaling, enable_gqa=gqa)
                out[off:off + ext] = oi[0].transpose(0, 1)
        return out
