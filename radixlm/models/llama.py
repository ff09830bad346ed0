"""The Llama family: Llama 2/3/3.x, SmolLM2, Mistral, Qwen2/2.5.

They differ only in configuration: GQA head counts, RoPE theta/scaling, q/k/v bias
(Qwen2), tied embeddings. Projections are fused (q|k|v -> qkv_proj, gate|up ->
gate_up_proj) so each layer runs two matmuls fewer; `load_weights` fills the fused
parameters from HF's separate tensors.

Tokens of all requests are one flat dimension T (see ForwardBatch); nothing here
depends on how T splits into requests except the attention backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.attention import RadixAttention
from radixlm.models.linear import (DenseLinear, LinearMethod, LinearPolicy, as_dense,
                                   make_linear_method)
from radixlm.models.model_config import ModelConfig
from radixlm.models.parallel_context import SINGLE, ParallelContext, kv_head_range
from radixlm.models.parallel_layers import (ColumnParallelLinear, ParallelLMHead,
                                            RowParallelLinear, VocabParallelEmbedding,
                                            even_shard, parallel_logits, qkv_shards)
from radixlm.models.rms_norm import RMSNorm
from radixlm.models.rope import RotaryEmbedding, apply_rotary

if TYPE_CHECKING:
    from radixlm.executor.forward_batch import ForwardBatch


class LlamaAttention(nn.Module):
    """Under tensor parallelism a rank holds num_heads / tp Q heads and the KV heads they
    use (`qkv_shards`); sizes below are the rank's own."""

    def __init__(self, config: ModelConfig, layer_id: int, ctx: ParallelContext) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        num_heads = config.num_heads // ctx.tp_size
        k0, k1 = kv_head_range(config.num_kv_heads, ctx.tp_size, ctx.tp_rank)
        self.q_size = num_heads * config.head_dim
        self.kv_size = (k1 - k0) * config.head_dim
        # Rows of qkv_proj: [0, q_size) = q, then k, then v (kv_size each).
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size, qkv_shards(config.num_heads, config.num_kv_heads,
                                           config.head_dim, ctx),
            bias=config.attention_bias, ctx=ctx)
        self.o_proj = RowParallelLinear(config.num_heads * config.head_dim, config.hidden_size,
                                        bias=config.attention_out_bias, ctx=ctx,
                                        what="attention head features")
        self.attn = RadixAttention(num_heads, k1 - k0, config.head_dim,
                                   scaling=config.head_dim ** -0.5, layer_id=layer_id)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], hidden: torch.Tensor,
                forward_batch: "ForwardBatch") -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        # q's and k's heads are adjacent columns [0, q_size + kv_size): one rotation for
        # both (elementwise, so the same numbers as two; half the small ops).
        qk = apply_rotary(qkv[:, :self.q_size + self.kv_size], *rope, self.head_dim)
        q, k = qk.split([self.q_size, self.kv_size], dim=-1)
        v = qkv[:, self.q_size + self.kv_size:]
        return self.o_proj(self.attn(q, k, v.contiguous(), forward_batch))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); rows of gate_up_proj are [gate; up]."""

    def __init__(self, config: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        # Each rank: its intermediate/tp gate rows, then the same up rows, so chunk(2)
        # below pairs gate and up of the same features.
        inter = config.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(
            config.hidden_size, [even_shard(s, inter, ctx, "intermediate features")
                                 for s in ("gate", "up")],
            bias=config.mlp_bias, ctx=ctx)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias=config.mlp_bias,
                                           ctx=ctx, what="intermediate features")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, ctx: ParallelContext) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, ctx)
        self.mlp = LlamaMLP(config, ctx)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], hidden: torch.Tensor,
                forward_batch: "ForwardBatch") -> torch.Tensor:
        # Pre-norm residual blocks, in HF's order of additions (matters in bf16).
        hidden = hidden + self.self_attn(rope, self.input_layernorm(hidden), forward_batch)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, ctx)
        self.rotary_emb = RotaryEmbedding(config)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, ctx) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, forward_batch: "ForwardBatch") -> torch.Tensor:
        """Hidden states [T, hidden] after the last layer, before the final norm."""
        hidden = self.embed_tokens(forward_batch.input_ids)
        rope = self.rotary_emb(forward_batch.positions, hidden.dtype)
        for layer in self.layers:
            hidden = layer(rope, hidden, forward_batch)
        return hidden


# HF checkpoint name fragment -> (our fused parameter's fragment, shard name).
_STACKED_PARAMS = (
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", "gate"),
    (".up_proj.", ".gate_up_proj.", "up"),
)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, ctx: ParallelContext = SINGLE) -> None:
        super().__init__()
        self.config = config
        self.ctx = ctx
        self.model = LlamaModel(config, ctx)
        # Tied: the logits reuse embed_tokens.weight directly, so the tie cannot be broken
        # by moving/materializing parameters (to_empty re-creates each Parameter).
        self.lm_head = (None if config.tie_word_embeddings
                        else ParallelLMHead(config.vocab_size, config.hidden_size, ctx))
        # The logits projection's LinearMethod, built by finalize_linear (F.linear on the
        # head's weight until then).
        self.logits_method: LinearMethod | None = None

    def forward(self, forward_batch: "ForwardBatch") -> torch.Tensor:
        hidden = self.model(forward_batch)
        # The final norm is per token, so selecting first is exact and only normalizes
        # (and projects) the tokens whose logits are needed.
        hidden = self.model.norm(hidden[forward_batch.logits_indices])
        method = self.logits_method or DenseLinear(self._head_weight())
        # Under TP each rank projects onto its vocabulary rows; all ranks get all logits.
        return parallel_logits(hidden, method, self.config.vocab_size, self.ctx).float()

    def _head_weight(self) -> torch.Tensor:
        return (self.lm_head.weight if self.lm_head is not None
                else self.model.embed_tokens.weight)

    @torch.no_grad()
    def finalize_linear(self, policy: LinearPolicy) -> None:
        """The LM head's method (the decoder layers build their own). Tied: a method over
        the embedding's rows (the embedding keeps its weight for lookups); untied: the
        method owns the head's weight. The head stays dense: GGUF stores it Q8_0/Q6_K,
        which no kernel here computes exactly."""
        if self.logits_method is not None:
            return
        self.logits_method = make_linear_method(self._head_weight().data, None, policy)
        if self.lm_head is not None:
            self.lm_head.weight = None

    def init_non_persistent_buffers(self) -> None:
        self.model.rotary_emb.reset_cache()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        # Every (parameter, shard) that must be written; shard None = the whole tensor.
        expected = set()
        for name in params:
            shards = [s for _, frag, s in _STACKED_PARAMS if frag in name] or [None]
            expected.update((name, s) for s in shards)
        loaded: set[tuple[str, str | None]] = set()
        for hf_name, tensor in weights:
            if "rotary_emb.inv_freq" in hf_name or "rotary_emb.cos_cached" in hf_name \
                    or "rotary_emb.sin_cached" in hf_name:
                continue  # recomputed, never loaded
            if hf_name == "lm_head.weight" and self.lm_head is None:
                continue  # tied checkpoints sometimes still store a copy
            name, shard = hf_name, None
            for hf_frag, frag, s in _STACKED_PARAMS:
                if hf_frag in hf_name:
                    name, shard = hf_name.replace(hf_frag, frag), s
                    break
            if name not in params:
                raise ValueError(f"checkpoint tensor {hf_name!r} matches no parameter of "
                                 f"{type(self).__name__}")
            module_name, _, param_name = name.rpartition(".")
            module = modules[module_name]
            if hasattr(module, "load"):
                # Parallel layers copy their rank's slice (and place fused shards).
                try:
                    module.load(param_name, tensor, shard)
                except ValueError as e:
                    raise ValueError(f"{hf_name!r}: {e}") from None
            else:  # replicated (norms): the whole tensor
                dst = params[name].data
                tensor = as_dense(tensor)
                if dst.shape != tensor.shape:
                    raise ValueError(f"shape mismatch for {hf_name!r}: checkpoint "
                                     f"{tuple(tensor.shape)}, model {tuple(dst.shape)}")
                dst.copy_(tensor)
            loaded.add((name, shard))
        missing = sorted(f"{n}[{s}]" if s else n for n, s in expected - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")
