"""Test helpers for models: drive a model through the real pools, like the scheduler does.

`PoolHarness` owns a ReqToTokenPool, a TokenToKVPool, a KVSlotAllocator and the torch
attention backend (or shares a ModelRunner's: `on_runner`); `batch` builds the ForwardBatch
of one pass (slot allocation, req_to_token rows, positions, logits_indices), `extend` /
`decode` build and run it.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.attention import create_attention_backend
from radixlm.forward_batch import ForwardBatch, ForwardMode
from radixlm.mem import KVSlotAllocator, ReqToTokenPool, TokenToKVPool
from radixlm.models import ModelConfig


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to the largest |b| (b is the reference)."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


class PoolHarness:
    def __init__(self, model: nn.Module, config: ModelConfig, max_requests: int = 4,
                 max_context: int = 256, num_slots: int = 1024,
                 kv_dtype: torch.dtype = torch.float32) -> None:
        self.model = model
        self.req_to_token_pool = ReqToTokenPool(max_requests, max_context)
        self.token_to_kv_pool = TokenToKVPool(num_slots, config.num_layers, config.num_kv_heads,
                                              config.head_dim, kv_dtype)
        self.allocator = KVSlotAllocator(num_slots)
        # The backend the engine builds on the CPU: the C++ decode kernel where it built.
        self.backend = create_attention_backend(
            "torch", sliding_window=bool(config.sliding_layers and any(config.sliding_layers)))
        self.seq_lens: dict[int, int] = {}  # req_to_token row -> tokens with K/V in the pool

    @classmethod
    def on_runner(cls, runner) -> "PoolHarness":
        """A harness over a ModelRunner's own pools, allocator and attention backend."""
        h = cls.__new__(cls)
        h.model = runner.model
        h.req_to_token_pool = runner.req_to_token_pool
        h.token_to_kv_pool = runner.token_to_kv_pool
        h.allocator = runner.allocator
        h.backend = runner.attn_backend
        h.seq_lens = {}
        return h

    def new_request(self, share_prefix_of: int | None = None, prefix_len: int = 0) -> int:
        """A fresh req_to_token row; optionally reusing the first `prefix_len` KV slots of
        another request (what a radix-cache hit does)."""
        row = self.req_to_token_pool.alloc()
        assert row is not None, "out of request rows"
        self.seq_lens[row] = 0
        if share_prefix_of is not None and prefix_len:
            table = self.req_to_token_pool.req_to_token
            table[row, :prefix_len] = table[share_prefix_of, :prefix_len]
            self.seq_lens[row] = prefix_len
        return row

    def batch(self, mode: ForwardMode, rows: list[int], token_lists: list[list[int]],
              all_logits: bool = False) -> ForwardBatch:
        prefix_lens = [self.seq_lens[r] for r in rows]
        ext_lens = [len(t) for t in token_lists]
        out_locs, positions = [], []
        for row, prefix, toks in zip(rows, prefix_lens, token_lists):
            slots = self.allocator.alloc(len(toks))
            assert slots is not None, "out of KV slots"
            # Positions prefix .. prefix + ext - 1 of this request live in `slots`.
            self.req_to_token_pool.write(row, prefix, slots)
            out_locs.append(slots)
            positions.append(torch.arange(prefix, prefix + len(toks), device=slots.device))
            self.seq_lens[row] = prefix + len(toks)
        seq_lens = [p + e for p, e in zip(prefix_lens, ext_lens)]
        total = sum(ext_lens)
        # Last token of request i sits at flat index cumsum(ext_lens)[i] - 1.
        dev = self.req_to_token_pool.device
        logits_indices = (torch.arange(total) if all_logits
                          else torch.tensor(ext_lens).cumsum(0) - 1).to(dev)
        fb = ForwardBatch(
            forward_mode=mode, batch_size=len(rows),
            input_ids=torch.tensor([t for toks in token_lists for t in toks], dtype=torch.int64,
                                   device=dev),
            positions=torch.cat(positions).to(torch.int64),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev),
            out_cache_loc=torch.cat(out_locs).to(torch.int64),
            logits_indices=logits_indices.to(torch.int64),
            seq_lens_cpu=seq_lens,
            extend_prefix_lens_cpu=prefix_lens if mode is ForwardMode.EXTEND else None,
            extend_seq_lens_cpu=ext_lens if mode is ForwardMode.EXTEND else None,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            attn_backend=self.backend,
        )
        self.backend.init_forward_metadata(fb)
        return fb

    @torch.no_grad()
    def extend(self, rows: list[int], token_lists: list[list[int]],
               all_logits: bool = False) -> torch.Tensor:
        """One EXTEND pass: logits [T, V] if all_logits else [B, V] (last tokens)."""
        return self.model(self.batch(ForwardMode.EXTEND, rows, token_lists, all_logits))

    @torch.no_grad()
    def decode(self, rows: list[int], tokens: list[int]) -> torch.Tensor:
        """One DECODE pass, one new token per request: logits [B, V]."""
        return self.model(self.batch(ForwardMode.DECODE, rows, [[t] for t in tokens], False))

    def greedy(self, prompts: list[list[int]], max_new_tokens: int,
               stop_ids: list[int]) -> list[list[int]]:
        """Greedy generation for a batch: one EXTEND of all prompts, then batched DECODEs
        of the requests still running; a request stops after a stop token."""
        rows = [self.new_request() for _ in prompts]
        outs: list[list[int]] = [[] for _ in prompts]
        active = list(range(len(prompts)))
        logits = self.extend(rows, prompts)
        while True:
            still = []
            for i, row_logits in zip(active, logits):
                outs[i].append(int(row_logits.argmax()))
                if outs[i][-1] not in stop_ids and len(outs[i]) < max_new_tokens:
                    still.append(i)
            if not still:
                return outs
            active = still
            logits = self.decode([rows[i] for i in active], [outs[i][-1] for i in active])
