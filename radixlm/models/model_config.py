"""ModelConfig: the architecture hyperparameters a model needs, from config.json or GGUF.

One frozen dataclass whatever the checkpoint format, so the model code never looks at
HF or GGUF key names. `rope_scaling` keeps the HF dict format (normalized to always carry
"rope_type"); GGUF files that ship llama3-style per-frequency factors as a tensor
(`rope_freqs.weight`) get them in `rope_freq_factors` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# HF `model_type` -> architecture name, for config.json files without "architectures".
_MODEL_TYPE_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
# GGUF `general.architecture` -> architecture name.
_GGUF_ARCH_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v projections (Qwen2; Llama with attention_bias)
    bos_token_id: int | None
    eos_token_ids: list[int]
    torch_dtype: str | None
    attention_out_bias: bool = False  # bias on o_proj (HF Llama's attention_bias only)
    mlp_bias: bool = False
    # Per rotary frequency divisors (len head_dim // 2), from a GGUF `rope_freqs` tensor.
    rope_freq_factors: tuple[float, ...] | None = field(default=None)
    # Mistral-style sliding-window attention. Not implemented: attention is full, which is
    # exact while seq_len <= sliding_window, so callers should cap the context there.
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of "
                             f"num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported rope_scaling type {rope_type!r}; "
                             f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")

    # ---- HF config.json -------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any],
                       generation_config: dict[str, Any] | None = None) -> "ModelConfig":
        """Parse a config.json dict (transformers 4.x or 5.x layout).

        `generation_config` (generation_config.json) may list extra stop tokens, e.g.
        Llama 3 Instruct's <|eot_id|>; they are merged into `eos_token_ids`.
        """
        archs = cfg.get("architectures") or []
        architecture = archs[0] if archs else _MODEL_TYPE_TO_ARCH.get(cfg.get("model_type", ""), "")
        if not architecture:
            raise ValueError("config.json has neither 'architectures' nor a known 'model_type'")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r}; the Llama family uses 'silu'")
        is_qwen2 = architecture == "Qwen2ForCausalLM" or cfg.get("model_type") == "qwen2"
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        rope_theta, rope_scaling = _hf_rope(cfg)
        llama_bias = bool(cfg.get("attention_bias", False))
        eos = _as_id_list(cfg.get("eos_token_id"))
        if generation_config:
            eos += [i for i in _as_id_list(generation_config.get("eos_token_id")) if i not in eos]
        return cls(
            architecture=architecture,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v bias and never an o_proj bias; HF Llama's
            # `attention_bias` puts a bias on all four projections.
            attention_bias=True if is_qwen2 else llama_bias,
            attention_out_bias=False if is_qwen2 else llama_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            bos_token_id=_first_id(cfg.get("bos_token_id")),
            eos_token_ids=eos,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            sliding_window=_sliding_window(cfg),
        )

    # ---- GGUF metadata --------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, reader: Any) -> "ModelConfig":
        """Parse a `gguf.GGUFReader`'s metadata (and the names/shapes of its tensors)."""
        gguf_arch = _gguf_field(reader, "general.architecture")
        if gguf_arch not in _GGUF_ARCH_TO_ARCH:
            raise ValueError(f"unsupported GGUF architecture {gguf_arch!r}; "
                             f"supported: {', '.join(sorted(_GGUF_ARCH_TO_ARCH))}")

        def key(name: str, default: Any = None) -> Any:
            return _gguf_field(reader, f"{gguf_arch}.{name}", default)

        tensors = {t.name: t for t in reader.tensors}
        hidden = int(key("embedding_length"))
        heads = int(key("attention.head_count"))
        kv_heads = key("attention.head_count_kv", heads)
        # The embedding's row count is the true vocab (it may exceed the token list when
        # the vocab was padded); GGUF shapes are [hidden, vocab] (fastest dim first).
        vocab = int(tensors["token_embd.weight"].shape[1])
        eos = _as_id_list(_gguf_field(reader, "tokenizer.ggml.eos_token_id"))
        eot = _gguf_field(reader, "tokenizer.ggml.eot_token_id")
        if eot is not None and int(eot) not in eos:
            eos.append(int(eot))
        rope_scaling = None
        scaling_type = key("rope.scaling.type")
        if scaling_type not in (None, "none"):
            rope_scaling = {"rope_type": scaling_type, "factor": float(key("rope.scaling.factor"))}
            if key("rope.scaling.original_context_length") is not None:
                rope_scaling["original_max_position_embeddings"] = int(
                    key("rope.scaling.original_context_length"))
        freq_factors = None
        if "rope_freqs.weight" in tensors:
            freq_factors = tuple(float(x) for x in tensors["rope_freqs.weight"].data.reshape(-1))
        return cls(
            architecture=_GGUF_ARCH_TO_ARCH[gguf_arch],
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=heads,
            num_kv_heads=int(kv_heads),
            head_dim=int(key("attention.key_length", hidden // heads)),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(key("context_length", 2048)),
            tie_word_embeddings="output.weight" not in tensors,
            attention_bias="blk.0.attn_q.bias" in tensors,
            attention_out_bias="blk.0.attn_output.bias" in tensors,
            mlp_bias="blk.0.ffn_up.bias" in tensors,
            bos_token_id=_first_id(_gguf_field(reader, "tokenizer.ggml.bos_token_id")),
            eos_token_ids=eos,
            torch_dtype=None,  # quantized or not, the run dtype is the caller's choice
            rope_freq_factors=freq_factors,
        )


def _hf_rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either transformers layout.

    4.x: top-level `rope_theta` + `rope_scaling` ({"type"|"rope_type": ..., ...}).
    5.x: `rope_parameters` = {"rope_type": ..., "rope_theta": ..., scaling keys...}.
    """
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "type")}
    scaling["rope_type"] = rope_type
    return theta, scaling


def _sliding_window(cfg: dict[str, Any]) -> int | None:
    # Qwen2 configs carry a sliding_window value that only applies with use_sliding_window.
    if cfg.get("use_sliding_window") is False:
        return None
    window = cfg.get("sliding_window")
    return int(window) if window else None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _first_id(value: Any) -> int | None:
    ids = _as_id_list(value)
    return ids[0] if ids else None


def _gguf_field(reader: Any, name: str, default: Any = None) -> Any:
    """A scalar or string metadata value (`ReaderField.contents()`), or `default`."""
    f = reader.fields.get(name)
    return default if f is None else f.contents()
