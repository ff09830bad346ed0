"""The shared decoder-only transformer every model family is built from.

One forward loop for all families (models/llama.py, qwen3.py, gemma3.py, qwen3_moe.py,
mixtral.py); they differ in `ModelConfig` fields, which pick the small blocks here:
q/k norm (Qwen3, Gemma 3), Gemma's (1 + w) norms with four norms per layer and scaled
embeddings, GeGLU vs SwiGLU, per-layer sliding windows with their own RoPE base, final
logit soft-capping, and a sparse MoE block in place of the dense MLP (models/moe.py).

Projections are fused (q|k|v -> qkv_proj, gate|up -> gate_up_proj) so each layer runs two
matmuls fewer; `load_weights` fills the fused parameters from HF's separate tensors.
Every projection is a parallel layer computing through its LinearMethod (the
models/linear/ seam), so weight formats and tensor parallelism apply to all families.

Tokens of all requests are one flat dimension T (see ForwardBatch); nothing here
depends on how T splits into requests except the attention backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator

import torch
from torch import nn

from radixlm.attention import RadixAttention
from radixlm.models.linear import (DenseLinear, LinearMethod, LinearPolicy, as_dense,
                                   make_head_method)
from radixlm.models.mlp import GatedMLP
from radixlm.models.model_config import ModelConfig
from radixlm.models.parallel_context import SINGLE, ParallelContext, kv_head_range
from radixlm.models.parallel_layers import (ColumnParallelLinear, ParallelLMHead,
                                            RowParallelLinear, VocabParallelEmbedding,
                                            even_shard, parallel_logits, qkv_shards)
from radixlm.models.rms_norm import make_rms_norm
from radixlm.models.rope import RotaryEmbedding, apply_rotary

if TYPE_CHECKING:
    from radixlm.forward_batch import ForwardBatch

Rope = tuple[torch.Tensor, torch.Tensor]


class Attention(nn.Module):
    """Under tensor parallelism a rank holds num_heads / tp Q heads and the KV heads they
    use (`qkv_shards`); sizes below are the rank's own."""

    def __init__(self, config: ModelConfig, layer_id: int, ctx: ParallelContext) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        num_heads = config.num_heads // ctx.tp_size
        k0, k1 = kv_head_range(config.num_kv_heads, ctx.tp_size, ctx.tp_rank)
        self.q_size = num_heads * config.head_dim
        self.kv_size = (k1 - k0) * config.head_dim
        self.qk_sizes = [self.q_size, self.kv_size]
        self.qk_v_sizes = [self.q_size + self.kv_size, self.kv_size]
        # Rows of qkv_proj: [0, q_size) = q, then k, then v (kv_size each).
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size, qkv_shards(config.num_heads, config.num_kv_heads,
                                           config.head_dim, ctx),
            bias=config.attention_bias, ctx=ctx)
        self.o_proj = RowParallelLinear(config.num_heads * config.head_dim, config.hidden_size,
                                        bias=config.attention_out_bias, ctx=ctx,
                                        what="attention head features")
        # Per-head norms over head_dim (replicated: every head uses the same weight).
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            self.q_norm = make_rms_norm(config.head_dim, config.rms_norm_eps, config.gemma_norms)
            self.k_norm = make_rms_norm(config.head_dim, config.rms_norm_eps, config.gemma_norms)
        scale = config.query_pre_attn_scalar or config.head_dim
        self.attn = RadixAttention(num_heads, k1 - k0, config.head_dim, scaling=scale ** -0.5,
                                   layer_id=layer_id,
                                   sliding_window=config.layer_window(layer_id))

    def forward(self, rope: Rope, hidden: torch.Tensor,
                forward_batch: "ForwardBatch") -> torch.Tensor:
        # (split_with_sizes: one C call for all the views; Tensor.split adds a Python frame)
        qk, v = self.qkv_proj.forward(hidden).split_with_sizes(self.qk_v_sizes, -1)
        if self.q_norm is None:
            # q's and k's heads are adjacent columns [0, q_size + kv_size): one rotation
            # for both (elementwise, so the same numbers as two; half the small ops).
            q, k = apply_rotary(qk, *rope, self.head_dim).split_with_sizes(self.qk_sizes, -1)
        else:
            t, d = qk.shape[0], self.head_dim
            q, k = qk.split_with_sizes(self.qk_sizes, -1)
            q = apply_rotary(self.q_norm.forward(q.reshape(t, -1, d)).view(t, -1), *rope, d)
            k = apply_rotary(self.k_norm.forward(k.reshape(t, -1, d)).view(t, -1), *rope, d)
        return self.o_proj.forward(self.attn.forward(q, k, v, forward_batch))


# Per layer, submodules are called through `.forward`, not `__call__`: no hooks are ever
# registered on them, and nn.Module's call path (hooks, tracing checks) costs microseconds
# x 8 calls x 30 layers on every eager decode step; torch.compile traces either the same.


class DecoderLayer(nn.Module):
    """Pre-norm residual blocks, in HF's order of additions (matters in bf16). Gemma
    ("sandwich") also normalizes each block's output: post_attention_layernorm is then
    the attention output's norm and pre_feedforward_layernorm the MLP input's, where Llama
    uses post_attention_layernorm as the MLP input's norm (HF's names either way)."""

    def __init__(self, config: ModelConfig, layer_id: int, ctx: ParallelContext) -> None:
        super().__init__()
        h, eps, gemma = config.hidden_size, config.rms_norm_eps, config.gemma_norms
        self.self_attn = Attention(config, layer_id, ctx)
        if config.is_moe_layer(layer_id):
            from radixlm.models.moe import SparseMoeBlock

            self.mlp: nn.Module = SparseMoeBlock(config, ctx)
        else:
            self.mlp = GatedMLP(config, ctx)
        self.input_layernorm = make_rms_norm(h, eps, gemma)
        self.post_attention_layernorm = make_rms_norm(h, eps, gemma)
        self.sandwich = gemma
        if gemma:
            self.pre_feedforward_layernorm = make_rms_norm(h, eps, gemma)
            self.post_feedforward_layernorm = make_rms_norm(h, eps, gemma)
        self.local = config.layer_window(layer_id) is not None

    def forward(self, rope: Rope, hidden: torch.Tensor, residual: torch.Tensor | None,
                forward_batch: "ForwardBatch") -> tuple[torch.Tensor, torch.Tensor | None]:
        """The hidden state arrives as `hidden + residual` (residual None: `hidden`
        alone) and leaves in the same form: a pre-norm layer returns (its MLP's output,
        the residual stream before adding it), so that the add happens in the next
        layer's input norm (`RMSNorm.add_forward`); a sandwich layer returns (the sum,
        None)."""
        if self.sandwich:
            if residual is not None:
                hidden = residual + hidden
            attn = self.self_attn.forward(rope, self.input_layernorm.forward(hidden),
                                          forward_batch)
            # hidden + post_norm(attn), then the MLP input's norm of that: one kernel pass.
            hidden, x = self.post_attention_layernorm.norm_add_forward(
                hidden, attn, self.pre_feedforward_layernorm)
            mlp = self.mlp.forward(x)
            hidden, _ = self.post_feedforward_layernorm.norm_add_forward(hidden, mlp)
            return hidden, None
        if residual is None:
            residual, x = hidden, self.input_layernorm.forward(hidden)
        else:
            residual, x = self.input_layernorm.add_forward(residual, hidden)
        attn = self.self_attn.forward(rope, x, forward_batch)
        residual, x = self.post_attention_layernorm.add_forward(residual, attn)
        return self.mlp.forward(x), residual


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, ctx)
        # Gemma scales the embeddings by sqrt(hidden), rounded to the run dtype first (HF).
        self.embed_scale = config.hidden_size ** 0.5 if config.gemma_norms else None
        self.rotary_emb = RotaryEmbedding(config)
        # Sliding layers with their own RoPE base (Gemma 3's local layers).
        self.local_rotary_emb = (RotaryEmbedding(config, theta=config.rope_local_theta)
                                 if config.rope_local_theta is not None else None)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, ctx) for i in range(config.num_layers))
        self.norm = make_rms_norm(config.hidden_size, config.rms_norm_eps, config.gemma_norms)

    def forward(self, forward_batch: "ForwardBatch") -> torch.Tensor:
        """Hidden states [T, hidden] after the last layer, before the final norm."""
        hidden = self.embed_tokens(forward_batch.input_ids)
        if self.embed_scale is not None:
            hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        rope = self.rotary_emb(forward_batch.positions, hidden.dtype)
        local_rope = (self.local_rotary_emb(forward_batch.positions, hidden.dtype)
                      if self.local_rotary_emb is not None else rope)
        residual = None
        for layer in self.layers:
            hidden, residual = layer.forward(local_rope if layer.local else rope, hidden,
                                             residual, forward_batch)
        return hidden if residual is None else residual + hidden

    def reset_rope(self) -> None:
        self.rotary_emb.reset_cache()
        if self.local_rotary_emb is not None:
            self.local_rotary_emb.reset_cache()


# HF checkpoint name fragment -> (our fused parameter's fragment, shard name).
_STACKED_PARAMS = (
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", "gate"),
    (".up_proj.", ".gate_up_proj.", "up"),
)
# Buffers some checkpoints carry that are recomputed, never loaded.
_RECOMPUTED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


class DecoderForCausalLM(nn.Module):
    """The CausalLM (models/base.py) of every family. A family subclasses it to rename
    its checkpoint tensors (`checkpoint_tensors`) when they differ from Llama's HF names."""

    def __init__(self, config: ModelConfig, ctx: ParallelContext = SINGLE) -> None:
        super().__init__()
        self.config = config
        self.ctx = ctx
        self.model = DecoderModel(config, ctx)
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
        logits = parallel_logits(hidden, method, self.config.vocab_size, self.ctx).float()
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _head_weight(self) -> torch.Tensor:
        return (self.lm_head.weight if self.lm_head is not None
                else self.model.embed_tokens.weight)

    @torch.no_grad()
    def finalize_linear(self, policy: LinearPolicy) -> None:
        """The LM head's method (the decoder layers build their own). Tied: a method over
        the embedding's rows (the embedding keeps its weight for lookups, unless the
        method holds the rows' exact int8 groups: then lookups read those and the dense
        table is dropped); untied: the method owns the head's weight."""
        if self.logits_method is not None:
            return
        table = self.lm_head if self.lm_head is not None else self.model.embed_tokens
        self.logits_method = make_head_method(self._head_weight().data, table.int8, policy)
        table.int8 = None
        if self.lm_head is not None:
            self.lm_head.weight = None
        elif hasattr(self.logits_method, "lookup"):
            self.model.embed_tokens.use_quantized_rows(self.logits_method)

    def init_non_persistent_buffers(self) -> None:
        self.model.reset_rope()

    def checkpoint_tensors(self, weights: Iterable[tuple[str, torch.Tensor]]
                           ) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named checkpoint tensors -> the Llama-style HF names `load_weights` maps
        (identity here; families with other names or fused expert tensors override)."""
        return iter(weights)

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
        for hf_name, tensor in self.checkpoint_tensors(weights):
            if any(b in hf_name for b in _RECOMPUTED):
                continue
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
        for module in self.modules():  # e.g. GemmaRMSNorm's float32 1 + w
            after = getattr(module, "process_weights_after_loading", None)
            if after is not None:
                after()
