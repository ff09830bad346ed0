"""Batch-invariant attention for --enable-deterministic-inference.

A query's output must not depend on the batch, the chunking or the cache state, so the
same query must always go through the same sequence of floating-point operations. The
default torch backend breaks that three ways (measured on the CPU): decode pads every
request's keys to the batch's longest sequence (SDPA over a masked, padded row differs
from the unpadded one), SDPA picks its blocking from the query and key counts (the last
prompt token computed in a prefill differs from the same token computed alone, as after
a radix cache hit or a chunk boundary), and batched GEMMs pick kernels by shape.

More: docs/deterministic.md, "attention/batch_invariant_backend.py".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixlm.attention.radix_attention import RadixAttention
    from radixlm.forward_batch import ForwardBatch

Q_TILE = 8  # query tokens per tile (R = Q_TILE * heads-per-KV-head rows per GEMM)
KV_TILE = 64  # keys per tile, at fixed absolute positions


@dataclass
class _TileMetadata:
    """Query tiles of one forward pass, sorted by how many key tiles they visit (most
    first), so the tiles active for key tile j are always the first n_active[j]."""
    token_index: torch.Tensor  # [n_tiles, Q_TILE] int64 flat token of each row, T = zero pad
    row_of_token: torch.Tensor  # [T] int64: token t is row row_of_token[t] of the tiles
    positions: torch.Tensor  # [n_tiles, Q_TILE] int64 query positions (pads copy a real one)
    kv_slots: torch.Tensor  # [n_tiles, max_key_tiles * KV_TILE] int64, 0 past a tile's end
    n_active: list[int]  # [max_key_tiles] tiles visiting key tile j


class BatchInvariantAttentionBackend(AttentionBackend):
    def __init__(self, q_tile: int = Q_TILE, kv_tile: int = KV_TILE) -> None:
        self.q_tile = q_tile
        self.kv_tile = kv_tile
        self.md: _TileMetadata | None = None

    def init_forward_metadata(self, fb: "ForwardBatch") -> None:
        qt, kt = self.q_tile, self.kv_tile
        if fb.forward_mode.is_decode():
            new_lens = [1] * fb.batch_size
            first_pos = [s - 1 for s in fb.seq_lens_cpu]
        else:
            new_lens = list(fb.extend_seq_lens_cpu)
            first_pos = list(fb.extend_prefix_lens_cpu)
        # Per tile: (request index, first flat token, first position, real tokens).
        tiles: list[tuple[int, int, int, int]] = []
        offset = 0
        for i, (n, p0) in enumerate(zip(new_lens, first_pos)):
            for s in range(0, n, qt):
                tiles.append((i, offset + s, p0 + s, min(qt, n - s)))
            offset += n
        total = offset
        # Key tiles a tile visits: enough for its last query at position p0 + real - 1.
        n_key_tiles = [(p0 + real - 1) // kt + 1 for _, _, p0, real in tiles]
        order = sorted(range(len(tiles)), key=lambda t: -n_key_tiles[t])  # stable
        tiles = [tiles[t] for t in order]
        n_key_tiles = [n_key_tiles[t] for t in order]
        max_kt = n_key_tiles[0]
        n_active = [sum(1 for n in n_key_tiles if n > j) for j in range(max_kt)]

        token_index, positions, kv_rows, kv_lens = [], [], [], []
        for (i, t0, p0, real), nkt in zip(tiles, n_key_tiles):
            token_index.append([t0 + r if r < real else total for r in range(qt)])
            positions.append([p0 + min(r, real - 1) for r in range(qt)])
            kv_rows.append(i)
            kv_lens.append(p0 + real)  # keys [0, kv_len) are real for this tile
        dev = fb.req_pool_indices.device
        token_index_t = torch.tensor(token_index, dtype=torch.int64, device=dev)
        width = max_kt * kt
        rows = fb.req_pool_indices[torch.tensor(kv_rows, dtype=torch.int64, device=dev)]
        req_to_token = fb.req_to_token_pool.req_to_token
        cols = torch.arange(width, device=dev)
        # Only the first kv_len entries of a row are meaningful; the rest read dummy slot 0
        # (finite K/V, weight 0). Columns past the table width are clamped, then masked.
        slots = req_to_token[rows[:, None], cols.clamp(max=req_to_token.shape[1] - 1)[None, :]]
        kv_len_t = torch.tensor(kv_lens, dtype=torch.int64, device=dev)
        slots = slots.to(torch.int64).masked_fill(cols[None, :] >= kv_len_t[:, None], 0)
        flat = token_index_t.view(-1)
        real_rows = (flat < total).nonzero().squeeze(1)
        row_of_token = torch.empty(total, dtype=torch.int64, device=dev)
        row_of_token[flat[real_rows]] = real_rows
        self.md = _TileMetadata(token_index=token_index_t, row_of_token=row_of_token,
                                positions=torch.tensor(positions, dtype=torch.int64, device=dev),
                                kv_slots=slots, n_active=n_active)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer: "RadixAttention", fb: "ForwardBatch") -> torch.Tensor:
        pool = fb.token_to_kv_pool
        pool.set_kv(layer.layer_id, fb.out_cache_loc, k, v)
        k_buf, v_buf = pool.get_kv(layer.layer_id)
        md = self.md
        qt, kt = self.q_tile, self.kv_tile
        n_tiles = md.token_index.shape[0]
        kvh, heads, d = layer.num_kv_heads, layer.num_heads, layer.head_dim
        group = heads // kvh
        rows = qt * group
        # [T+1, heads, d] (a zero row for the pads) -> tiles [n, Q, kvh, group, d] ->
        # [n, kvh, Q*group, d]: row r of a KV head is query r // group, its head r % group.
        q32 = torch.cat([q.float(), q.new_zeros(1, heads, d, dtype=torch.float32)])
        q32 = q32 * layer.scaling
        qt_ = q32[md.token_index].view(n_tiles, qt, kvh, group, d)
        qt_ = qt_.permute(0, 2, 1, 3, 4).reshape(n_tiles, kvh, rows, d)
        q_pos = md.positions.repeat_interleave(group, dim=1)  # [n, rows]
        key_off = torch.arange(kt, device=q.device)

        # Pass 1: scores of every (query tile, key tile) and each row's maximum.
        scores: list[torch.Tensor] = []
        row_max = torch.full((n_tiles, kvh, rows), float("-inf"), device=q.device)
        for j, n in enumerate(md.n_active):
            kj = self._gather(k_buf, md.kv_slots[:n, j * kt:(j + 1) * kt], kvh, d)
            s = torch.bmm(qt_[:n].reshape(n * kvh, rows, d), kj.transpose(1, 2))
            s = s.view(n, kvh, rows, kt)
            k_pos = (j * kt + key_off)[None, None, :]
            visible = k_pos <= q_pos[:n, :, None]  # causal
            if layer.sliding_window is not None:  # and within the window
                visible = visible & (k_pos > q_pos[:n, :, None] - layer.sliding_window)
            s = s.masked_fill(~visible[:, None], float("-inf"))
            scores.append(s)
            row_max[:n] = torch.maximum(row_max[:n], s.amax(dim=-1))

        # Pass 2: exp(s - max), summed and applied to V tile by tile in order j = 0, 1...
        denom = torch.zeros(n_tiles, kvh, rows, device=q.device)
        acc = torch.zeros(n_tiles, kvh, rows, d, device=q.device)
        for j, n in enumerate(md.n_active):
            p = torch.exp(scores[j] - row_max[:n, :, :, None])
            vj = self._gather(v_buf, md.kv_slots[:n, j * kt:(j + 1) * kt], kvh, d)
            pv = torch.bmm(p.view(n * kvh, rows, kt), vj).view(n, kvh, rows, d)
            denom[:n] = denom[:n] + p.sum(dim=-1)
            acc[:n] = acc[:n] + pv
        out = acc / denom[..., None]
        # Back to [n * Q, heads, d] rows, then to the flat token order.
        out = out.view(n_tiles, kvh, qt, group, d).permute(0, 2, 1, 3, 4).reshape(-1, heads, d)
        return out[md.row_of_token].to(q.dtype)

    @staticmethod
    def _gather(buf: torch.Tensor, slots: torch.Tensor, kvh: int, d: int) -> torch.Tensor:
        """K or V of `slots` [n, KV_TILE] as float32 [n * kvh, KV_TILE, d], contiguous."""
        n, kt = slots.shape
        x = buf[slots].float()  # [n, kt, kvh, d]
        return x.transpose(1, 2).reshape(n * kvh, kt, d)
