"""Gemma 3, text only (HF `Gemma3ForCausalLM`, GGUF `gemma3`).

The shared decoder (models/decoder.py) with Gemma's blocks, all chosen by ModelConfig:
embeddings scaled by sqrt(hidden); (1 + w) RMSNorms (`GemmaRMSNorm`: HF stores w, GGUF
1 + w, which its loader turns back into w); four norms per layer (input,
post-attention, pre- and post-feedforward); q/k norm; attention scale
query_pre_attn_scalar ** -0.5; GeGLU with tanh GELU; final logit soft-capping when the
config has it; and local layers (`sliding_layers`) that attend to the last
`sliding_window` positions with RoPE base `rope_local_theta`, global layers to all.

The KV pool keeps every layer's K/V for the whole context (correct, not minimal): a
window-aware pool would hold only `sliding_window` positions for the local layers, 5/6
of the layers in Gemma 3, i.e. ~5/6 of the KV bytes of long sequences.
"""

from __future__ import annotations

from radixlm.models.decoder import DecoderForCausalLM


class Gemma3ForCausalLM(DecoderForCausalLM):
    pass
