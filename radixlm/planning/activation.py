"""Activation memory of one forward pass: an estimate from the model config and the batch.

Used three ways: the planner sizes the activation pool with the worst case of one prefill
chunk and of one decode step; the CPU activation budget (`ActivationGuard`) checks each
real batch before it runs; the OOM diagnosis says how much a failed batch needed.

More: docs/memory.md, "planning/activation.py".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixlm.models.model_config import ModelConfig

ALLOCATOR_OVERHEAD = 1.2
SAMPLER_COPIES = 4
# Attention backends whose kernels read the KV pool in place (no gathered K/V copy).
FUSED_BACKENDS = ("triton",)


@dataclass(frozen=True)
class ActivationModel:
    hidden: int
    intermediate: int  # per rank
    q_heads: int  # per rank
    kv_heads: int  # per rank
    head_dim: int
    vocab: int
    act_bytes: int
    kv_bytes: int
    gathers_kv: bool  # the torch backend gathers K/V; fused kernels do not

    @classmethod
    def from_config(cls, cfg: ModelConfig, act_bytes: int, kv_bytes: int, tp: int = 1,
                    attention_backend: str = "torch") -> "ActivationModel":
        return cls(hidden=cfg.hidden_size, intermediate=cfg.intermediate_size // tp,
                   q_heads=cfg.num_heads // tp, kv_heads=max(1, cfg.num_kv_heads // tp),
                   head_dim=cfg.head_dim, vocab=cfg.vocab_size, act_bytes=act_bytes,
                   kv_bytes=kv_bytes, gathers_kv=attention_backend not in FUSED_BACKENDS)

    # --- one batch -----------------------------------------------------------------

    def _layer_peak(self, tokens: int, attention_work: int) -> int:
        s, h, d = self.act_bytes, self.hidden, self.head_dim
        stream = 2 * tokens * h * s  # hidden state + residual stream
        norm = 2 * tokens * h * 4 + tokens * h * s
        attn = (tokens * (self.q_heads + 2 * self.kv_heads) * d * s
                + tokens * (self.q_heads + self.kv_heads) * d * s
                + tokens * self.q_heads * d * s + attention_work)
        mlp = 4 * tokens * self.intermediate * s
        return stream + max(norm, attn, mlp)

    def _logits(self, tokens: int, sampled: int) -> int:
        return (2 * tokens * self.hidden * self.act_bytes
                + sampled * self.vocab * (self.act_bytes + 4 + SAMPLER_COPIES * 4))

    def extend_bytes(self, extend_lens: list[int], seq_lens: list[int]) -> int:
        """An EXTEND (or MIXED) batch: request i computes extend_lens[i] new tokens and
        attends over seq_lens[i] (its prefix plus them)."""
        tokens = sum(extend_lens)
        work = 0
        if self.gathers_kv:  # requests run one at a time: the largest one counts
            work = max((seq * self.kv_heads * self.head_dim * 2 * (self.kv_bytes + self.act_bytes)
                        + ext * seq for ext, seq in zip(extend_lens, seq_lens)), default=0)
        peak = max(self._layer_peak(tokens, work), self._logits(tokens, len(extend_lens)))
        return int(peak * ALLOCATOR_OVERHEAD)

    def decode_bytes(self, batch: int, max_len: int) -> int:
        """A DECODE batch of `batch` requests, the longest holding `max_len` tokens."""
        work = 0
        if self.gathers_kv:
            work = (batch * max_len * self.kv_heads * self.head_dim * 2
                    * (self.kv_bytes + self.act_bytes) + batch * max_len * 9)
        peak = max(self._layer_peak(batch, work), self._logits(batch, batch))
        return int(peak * ALLOCATOR_OVERHEAD)

    # --- worst cases, for the plan ---------------------------------------------------

    def prefill_peak(self, chunk: int, context_len: int) -> int:
        """One prefill chunk of `chunk` tokens, at the worst place: the last chunk of a
        prompt that fills the context (it attends over context_len tokens)."""
        chunk = min(chunk, context_len)
        return self.extend_bytes([chunk], [context_len])

    def decode_peak(self, batch: int, context_len: int) -> int:
        """One decode step of `batch` requests, one of them at the full context."""
        return self.decode_bytes(batch, context_len)

    def max_chunk_within(self, budget: int, context_len: int, page_size: int = 1) -> int:
        """The largest prefill chunk (a page multiple) whose peak fits `budget` when it
        attends over `context_len` tokens (the worst case: pass the context; for given
        requests, their longest sequence); 0 if none."""
        lo, hi = 0, context_len // page_size  # in pages; peak grows with the chunk
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.prefill_peak(mid * page_size, context_len) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo * page_size

    def max_decode_batch_within(self, budget: int, max_len: int, limit: int) -> int:
        """The largest decode batch (<= limit) whose peak fits `budget`; 0 if none."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.decode_bytes(mid, max_len) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo
