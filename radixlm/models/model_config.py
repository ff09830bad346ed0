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
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
# GGUF `general.architecture` -> architecture name.
_GGUF_ARCH_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
QK_NORM_ARCHS = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM")
GEMMA_ARCHS = ("Gemma3ForCausalLM",)
# Gemma 3 defaults that llama.cpp hard-codes instead of writing them to the GGUF.
_GEMMA3_LOCAL_THETA = 10000.0
_GEMMA3_WINDOW_PATTERN = 6  # every 6th layer is global, the others slide


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
    # Sliding-window attention: the layers marked in `sliding_layers` attend to the last
    # `sliding_window` positions. Without `sliding_layers` (Mistral) the window is not
    # applied: full attention is exact while seq_len <= sliding_window, so the context is
    # capped there (`context_cap`).
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] | None = None
    # ---- family blocks (defaults: Llama) ----
    hidden_act: str = "silu"  # the gated MLP's activation: silu (SwiGLU) or gelu tanh (GeGLU)
    qk_norm: bool = False  # RMSNorm over each q / k head before RoPE (Qwen3, Gemma 3)
    # Gemma: norms apply (1 + w) with w as HF stores it (GGUF files store 1 + w; the GGUF
    # loader subtracts the 1), four norms per layer, embeddings scaled by sqrt(hidden).
    gemma_norms: bool = False
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (else head_dim)
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    rope_local_theta: float | None = None  # RoPE base of the sliding layers (Gemma 3)
    # ---- mixture of experts (num_experts == 0: dense) ----
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalize the top-k router probabilities to sum to 1
    dense_mlp_layers: tuple[int, ...] = ()  # layers that keep a dense MLP (Qwen3-MoE)

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
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r}; supported: "
                             f"{', '.join(SUPPORTED_ACTIVATIONS)}")
        if self.sliding_layers is not None and len(self.sliding_layers) != self.num_layers:
            raise ValueError(f"{len(self.sliding_layers)} layer types for "
                             f"{self.num_layers} layers")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} must be in "
                             f"1..{self.num_experts}")

    def layer_window(self, layer_id: int) -> int | None:
        """The attention window of a layer (None: full causal attention)."""
        if self.sliding_layers is None or not self.sliding_layers[layer_id]:
            return None
        return self.sliding_window

    def is_moe_layer(self, layer_id: int) -> bool:
        return self.num_experts > 0 and layer_id not in self.dense_mlp_layers

    @property
    def context_cap(self) -> int | None:
        """Longest context the model computes exactly: a window the layers do not apply."""
        return self.sliding_window if self.sliding_layers is None else None

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
        act = cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")
        if act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {act!r}; supported: "
                             f"{', '.join(SUPPORTED_ACTIVATIONS)}")
        is_qwen2 = architecture == "Qwen2ForCausalLM" or cfg.get("model_type") == "qwen2"
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        family = _hf_family_fields(architecture, cfg)
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
            hidden_act=act,
            **family,
        )

    # ---- GGUF metadata --------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, reader: Any) -> "ModelConfig":
        """Parse a `gguf.GGUFReader`'s metadata (and the names/shapes of its tensors)."""
        gguf_arch = _gguf_field(reader, "general.architecture")
        gguf_architecture_name(reader)  # refuses an unsupported one

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
        family: dict[str, Any] = {}
        architecture = _GGUF_ARCH_TO_ARCH[gguf_arch]
        head_dim = int(key("attention.key_length", hidden // heads))
        num_layers = int(key("block_count"))
        if architecture in QK_NORM_ARCHS:
            family["qk_norm"] = True
        if architecture in GEMMA_ARCHS:
            # llama.cpp's gemma3: GeGLU, (1 + w) norms, 5 sliding layers then a global
            # one (unless the file has a sliding_window_pattern), local RoPE base 10000, attention scale 1/sqrt(head_dim) (the 270M..12B
            # models' query_pre_attn_scalar; the 27B's differs and is not told apart).
            window = key("attention.sliding_window")
            # An int N: every N-th layer is global; a list: True = sliding, per layer.
            pattern = key("attention.sliding_window_pattern", _GEMMA3_WINDOW_PATTERN)
            sliding = (tuple(bool(x) for x in pattern) if isinstance(pattern, list)
                       else tuple(bool((i + 1) % int(pattern)) for i in range(num_layers)))
            family.update(
                hidden_act="gelu_pytorch_tanh", gemma_norms=True,
                query_pre_attn_scalar=float(head_dim),
                rope_local_theta=_GEMMA3_LOCAL_THETA,
                sliding_window=int(window) if window else None,
                sliding_layers=sliding if window else None,
                final_logit_softcapping=key("final_logit_softcapping"))
            # Chat turns end with <end_of_turn>, which llama.cpp also stops at.
            end_of_turn = _gguf_token_id(reader, "<end_of_turn>", search_first=1024)
            if end_of_turn is not None and end_of_turn not in eos:
                eos.append(end_of_turn)
        freq_factors = None
        if "rope_freqs.weight" in tensors:
            freq_factors = tuple(float(x) for x in tensors["rope_freqs.weight"].data.reshape(-1))
        return cls(
            architecture=architecture,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=int(kv_heads),
            head_dim=head_dim,
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
            **family,
        )


def gguf_architecture_name(reader: Any) -> str:
    gguf_arch = _gguf_field(reader, "general.architecture")
    if gguf_arch not in _GGUF_ARCH_TO_ARCH:
        raise ValueError(f"unsupported GGUF architecture {gguf_arch!r}; "
                         f"supported: {', '.join(sorted(_GGUF_ARCH_TO_ARCH))}")
    return _GGUF_ARCH_TO_ARCH[gguf_arch]


def _hf_rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either transformers layout.

    4.x: top-level `rope_theta` + `rope_scaling` ({"type"|"rope_type": ..., ...}).
    5.x: `rope_parameters` = {"rope_type": ..., "rope_theta": ..., scaling keys...}.
    """
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if "full_attention" in params:  # per layer type (Gemma 3): the global layers' RoPE
        params = params["full_attention"]
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "type")}
    scaling["rope_type"] = rope_type
    return theta, scaling


def _hf_family_fields(architecture: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of the family blocks, from config.json."""
    out: dict[str, Any] = {}
    if architecture in QK_NORM_ARCHS:
        out["qk_norm"] = True
    if architecture in GEMMA_ARCHS:
        if cfg.get("attn_logit_softcapping") is not None:
            raise ValueError("attention logit soft-capping (attn_logit_softcapping) is not "
                             "supported by radixlm's attention backends")
        layers = int(cfg["num_hidden_layers"])
        types = cfg.get("layer_types") or [
            "sliding_attention" if (i + 1) % int(cfg.get("sliding_window_pattern", 6))
            else "full_attention" for i in range(layers)]
        local = (cfg.get("rope_parameters") or {}).get("sliding_attention") or {}
        out.update(
            gemma_norms=True,
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
            final_logit_softcapping=cfg.get("final_logit_softcapping"),
            rope_local_theta=float(local.get("rope_theta",
                                             cfg.get("rope_local_base_freq", 10000.0))),
            sliding_layers=tuple(t == "sliding_attention" for t in types))
    if architecture == "Qwen3MoeForCausalLM":
        step = int(cfg.get("decoder_sparse_step", 1))
        layers = int(cfg["num_hidden_layers"])
        out.update(
            num_experts=int(cfg.get("num_experts") or cfg["num_local_experts"]),
            num_experts_per_tok=int(cfg["num_experts_per_tok"]),
            moe_intermediate_size=int(cfg["moe_intermediate_size"]),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
            dense_mlp_layers=tuple(i for i in range(layers)
                                   if i in (cfg.get("mlp_only_layers") or [])
                                   or (i + 1) % step))
    if architecture == "MixtralForCausalLM":
        out.update(
            num_experts=int(cfg["num_local_experts"]),
            num_experts_per_tok=int(cfg["num_experts_per_tok"]),
            moe_intermediate_size=int(cfg["intermediate_size"]),
            norm_topk_prob=True)
    return out


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


def _gguf_token_id(reader: Any, token: str, search_first: int) -> int | None:
    """The id of `token` among the first `search_first` vocabulary entries (control
    tokens sit there; reading all of a 262k vocabulary would cost seconds)."""
    f = reader.fields.get("tokenizer.ggml.tokens")
    if f is None:
        return None
    want = token.encode()
    for i, part in enumerate(f.data[:search_first]):
        if bytes(f.parts[part]) == want:
            return i
    return None


def _gguf_field(reader: Any, name: str, default: Any = None) -> Any:
    """A scalar or string metadata value (`ReaderField.contents()`), or `default`."""
    f = reader.fields.get(name)
    return default if f is None else f.contents()
