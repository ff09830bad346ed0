"""The Llama family: Llama 2/3/3.x, SmolLM2, Mistral, Qwen2/2.5.

They differ only in configuration: GQA head counts, RoPE theta/scaling, q/k/v bias
(Qwen2), tied embeddings. The layers and the forward loop are the shared decoder
(models/decoder.py); Llama's HF tensor names are the ones it loads as they are.
"""

from __future__ import annotations

from radixlm.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    """Llama-architecture checkpoints (HF `LlamaForCausalLM`, `MistralForCausalLM`,
    `Qwen2ForCausalLM`; GGUF `llama`, `qwen2`)."""
