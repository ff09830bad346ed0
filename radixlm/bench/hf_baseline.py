"""The transformers baseline: `model.generate` on padded static batches, same weights and dtype.

A local HF directory is loaded with `from_pretrained`. A Llama/Qwen2 GGUF file goes
through radixlm's own dequantizer (`iter_gguf_weights`, which already yields HF tensor
names and HF's Q/K row order) into a transformers model built from the same ModelConfig,
so both engines multiply exactly the same numbers; GGUFs of the other families (Gemma 3,
Qwen3) go through transformers' own GGUF loader (the same gguf dequantizers).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from radixlm.models.gguf_loader import iter_gguf_weights, open_gguf
from radixlm.models.model_config import ModelConfig

# radixlm architecture name -> transformers `model_type`.
_MODEL_TYPES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


def hf_config_from(config: ModelConfig, dtype: torch.dtype) -> Any:
    """A transformers config equivalent to `config` (transformers 5 `rope_parameters`)."""
    from transformers import AutoConfig

    if config.architecture not in _MODEL_TYPES:
        raise ValueError(f"no transformers baseline for {config.architecture}")
    if config.rope_freq_factors is not None:
        raise ValueError("GGUF rope_freqs tensors have no transformers equivalent")
    rope = {"rope_type": "default", "rope_theta": config.rope_theta, **(config.rope_scaling or {})}
    extra: dict[str, Any] = {}
    if config.architecture == "LlamaForCausalLM":
        # HF Llama's `attention_bias` puts a bias on q, k, v and o alike.
        extra = {"attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias}
    return AutoConfig.for_model(
        _MODEL_TYPES[config.architecture],
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps, rope_parameters=rope,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_ids, dtype=dtype, **extra)


def load_hf_model(model_path: str, dtype: torch.dtype) -> Any:
    """An eval-mode transformers CausalLM on the CPU with radixlm's weights in `dtype`."""
    from transformers import AutoModelForCausalLM

    if not model_path.endswith(".gguf"):
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype,
                                                    attn_implementation="sdpa").eval()
    reader = open_gguf(model_path)
    config = ModelConfig.from_gguf_metadata(reader)
    if config.architecture not in _MODEL_TYPES:
        d, f = os.path.split(model_path)
        return AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=dtype,
                                                    attn_implementation="sdpa").eval()
    model = AutoModelForCausalLM.from_config(hf_config_from(config, dtype), dtype=dtype,
                                             attn_implementation="sdpa")
    state = dict(iter_gguf_weights(reader, config, dtype))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # A tied lm_head is the embedding itself, so the checkpoint has no tensor for it.
    allowed_missing = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - allowed_missing or unexpected:
        raise RuntimeError(f"GGUF -> transformers: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model.eval()


class HFBaseline:
    """Static batching: `batch_size` prompts at a time, left-padded to the longest."""

    def __init__(self, model_path: str, dtype: torch.dtype, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"--baseline-batch-size must be >= 1, got {batch_size}")
        self.model = load_hf_model(model_path, dtype)
        self.batch_size = batch_size
        eos = self.model.config.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        # Padding positions are masked out, so any valid id works as the pad.
        pad = getattr(self.model.config, "pad_token_id", None)
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)

    def generate(self, prompts: list[list[int]], output_len: int) -> list[list[int]]:
        """Greedy, exactly `output_len` new tokens per prompt (EOS suppressed by min_new_tokens)."""
        from transformers import GenerationConfig

        gen_config = GenerationConfig(do_sample=False, max_new_tokens=output_len,
                                      min_new_tokens=output_len, pad_token_id=self.pad_id,
                                      eos_token_id=self.eos_ids or None)
        outputs: list[list[int]] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start:start + self.batch_size]
            width = max(len(p) for p in batch)
            input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, p in enumerate(batch):
                # Left padding: the prompt fills columns [width - len(p), width), so every
                # row's last prompt token is in column width - 1 and new tokens start at width.
                input_ids[row, width - len(p):] = torch.tensor(p)
                mask[row, width - len(p):] = 1
            with torch.inference_mode():
                seqs = self.model.generate(input_ids=input_ids, attention_mask=mask,
                                           generation_config=gen_config)
            outputs.extend(seqs[:, width:].tolist())
        return outputs
