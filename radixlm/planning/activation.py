"""Activation memory of one forward pass: an estimate from the model config and the batch.

Used three ways: the planner sizes the activation pool with the worst case of one prefill
chunk and of one decode step; the CPU activation budget (`ActivationGuard`) checks each
real batch before it runs; the OOM diagnosis says how much a failed batch needed.

What is counted (bytes, per tensor-parallel rank; s = activation dtype bytes, T = tokens
in the batch, N = requests that sample, q/kv = query/KV heads of the rank, d = head dim,
H = hidden, I = intermediate of the rank, V = vocab). The layers run one after the other,
so the peak is the largest of these phases of one layer, plus what lives through all of
them (the hidden state and the residual stream, 2*T*H*s):
  * norm:      the float32 copies RMSNorm makes, 2*T*H*4, and its output T*H*s;
  * attention: q|k|v (T*(q+2kv)*d*s), rotated q and k (T*(q+kv)*d*s), the output
               (T*q*d*s), and the backend's work space:
      - torch backend, extend: one request at a time: its K and V gathered from the pool
        (seq*kv*d*(kv bytes + s), the cast to the activation dtype included) and its bool
        causal mask (ext*seq); decode: K and V of the whole batch gathered into a padded
        [N, max_len] layout (N*max_len*kv*d*2*(kv bytes + s)), the int64 gather index and
        bool mask (N*max_len*9);
      - fused kernels (triton): read the pool in place, nothing extra;
    SDPA's fused CPU/CUDA kernels do not materialize the score matrix, so none is counted;
  * MLP: gate|up (2*T*I*s), silu(gate) and the product (2*T*I*s);
  * logits: N*V*(s + 4) (the projection, then its float32 copy) and the sampler's
    float32 work on them (softmax, sort and cumsum for top-p/top-k: SAMPLER_COPIES*N*V*4).
The sum is multiplied by ALLOCATOR_OVERHEAD for the caching allocator's rounding and
fragmentation. It is an estimate of what this implementation allocates, not a bound.
"""

from __future__ import annotations

from dataclasses import dataclass

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
