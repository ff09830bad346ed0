"""Qwen3 dense (HF `Qwen3ForCausalLM`, GGUF `qwen3`).

Llama's layers plus an RMSNorm over each q and k head before RoPE (`qk_norm`), an
explicit `head_dim` (not hidden / heads) and no q/k/v bias: all configuration of the
shared decoder (models/decoder.py); the HF tensor names are Llama's plus
`self_attn.q_norm` / `self_attn.k_norm`.
"""

from __future__ import annotations

from radixlm.models.decoder import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    pass
