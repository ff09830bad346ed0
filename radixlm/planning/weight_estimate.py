"""Weight bytes per tensor-parallel rank, from tensor shapes alone (no tensor data read).

Shapes come from the model config, the safetensors headers or a GGUF file's tensor table.
Every tensor costs `numel * dtype bytes` -- except with `quantization="fp8"` the linear
projections (1 byte per element; planning only), and under `--quantization auto` on a bf16
CPU run a GGUF's `int4_names` projections (their int4 form, `int4_bytes_per_weight`) and
`int8_forms` tensors (int8 groups, 1 + 4 / group bytes a weight, or Q5_0's 5-bit groups,
22 / 32), each plus its dense fallback except on AMX CPUs (a tied table's embedding reads
the int8 rows; its head's fallback, where kept, is the dense copy). Otherwise embeddings and lm_head
stay in the run dtype.

Tensor parallelism (Megatron style, as SGLang/vLLM shard Llama): q/o and gate/up/down are
split across the `tp` ranks; k/v are split by KV head, and replicated when tp exceeds the
KV heads (each rank keeps max(1, kv_heads // tp) heads); the embedding and lm_head are
vocab-parallel (ceil(vocab / tp) rows each); norms and the RoPE cache are replicated.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlm.planning.dtype_sizes import QUANTIZATIONS

if TYPE_CHECKING:
    from radixlm.models.model_config import ModelConfig

# Name suffix -> how the tensor is split across TP ranks.
_COL_PARALLEL = ("q_proj.weight", "q_proj.bias", "gate_proj.weight", "gate_proj.bias",
                 "up_proj.weight", "up_proj.bias",
                 # MoE experts: transformers 5's fused stacks, Mixtral's w1 (gate), w3 (up)
                 "experts.gate_up_proj", "w1.weight", "w3.weight")
_KV_PARALLEL = ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")
_ROW_PARALLEL = ("o_proj.weight", "down_proj.weight",  # their biases are replicated
                 "experts.down_proj", "w2.weight")
# The MoE router (E rows, replicated: every rank routes all tokens).
_REPLICATED_LINEAR = ("mlp.gate.weight", "block_sparse_moe.gate.weight")
_LINEAR_WEIGHTS = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                   "gate_proj.weight", "up_proj.weight", "down_proj.weight",
                   "experts.gate_up_proj", "experts.down_proj", "w1.weight", "w2.weight",
                   "w3.weight") + _REPLICATED_LINEAR
_VOCAB_PARALLEL = ("embed_tokens.weight", "lm_head.weight")
_REPLICATED = ("norm.weight", "o_proj.bias", "down_proj.bias")


@dataclass(frozen=True)
class WeightEstimate:
    """Bytes of one TP rank's weights, by group."""

    embedding_bytes: int
    lm_head_bytes: int  # 0 with tied embeddings (the logits reuse the embedding)
    linear_bytes: int  # attention and MLP projections
    other_bytes: int  # norms, biases, the RoPE cos/sin cache
    num_params: int  # the whole model's parameters (all ranks together)
    source: str  # "config" | "safetensors" | "gguf"
    on_disk_bytes: int | None = None  # the checkpoint's tensor bytes as stored (GGUF: quantized)
    int4_bytes: int = 0  # int4 forms of projections (their dense fallback: in linear_bytes)
    int8_bytes: int = 0  # int8 groups of projections (their dense fallback: in linear_bytes)
    dtype_name: str = ""  # the run dtype, for `formats`
    # The vocabulary table is int8 groups (embedding_bytes: the groups; lm_head_bytes: the
    # head's dense fallback for larger calls), as models/linear/policy.make_head_method.
    int8_table: bool = False

    @property
    def total_bytes(self) -> int:
        return (self.embedding_bytes + self.lm_head_bytes + self.linear_bytes
                + self.other_bytes + self.int4_bytes + self.int8_bytes)

    @property
    def formats(self) -> dict[str, int]:
        """Bytes by weight format, as the start-up table reports the loaded ones."""
        linear = ("dense " + self.dtype_name + (" (fallback for large batches)"
                                                if self.int4_bytes or self.int8_bytes
                                                or self.int8_table else "")).strip()
        table = self.embedding_bytes + self.lm_head_bytes
        fallback_head = self.lm_head_bytes if self.int8_table else 0
        out = {"int4 groupwise": self.int4_bytes,
               "int8 groupwise": self.int8_bytes + (self.embedding_bytes if self.int8_table else 0),
               linear: self.linear_bytes + fallback_head,
               "embedding and lm_head": 0 if self.int8_table else table,
               "other (norms, biases, RoPE)": self.other_bytes}
        return {k: v for k, v in out.items() if v}


def kv_heads_per_rank(cfg: ModelConfig, tp: int) -> int:
    """KV heads each rank stores: split when tp divides them, one (replicated) when tp
    exceeds them."""
    return max(1, cfg.num_kv_heads // tp)


def check_tp(cfg: ModelConfig, tp: int) -> None:
    if tp < 1:
        raise ValueError(f"--tp-size must be >= 1, got {tp}")
    if cfg.num_heads % tp:
        raise ValueError(f"--tp-size {tp} does not divide the {cfg.num_heads} attention heads")
    if cfg.num_kv_heads % tp and tp % cfg.num_kv_heads:
        raise ValueError(f"--tp-size {tp} and the {cfg.num_kv_heads} KV heads: one must "
                         f"divide the other")


def config_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model holds, by HF name, from the architecture (any family: q/k
    norms, Gemma's four norms per layer, MoE routers and experts)."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h),
                                          "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        if cfg.is_moe_layer(i):
            e_inter = cfg.moe_intermediate_size
            shapes[p + "mlp.gate.weight"] = (cfg.num_experts, h)
            for e in range(cfg.num_experts):
                pe = f"{p}mlp.experts.{e}."
                shapes.update({pe + "gate_proj.weight": (e_inter, h),
                               pe + "up_proj.weight": (e_inter, h),
                               pe + "down_proj.weight": (h, e_inter)})
        else:
            shapes.update({p + "mlp.gate_proj.weight": (inter, h),
                           p + "mlp.up_proj.weight": (inter, h),
                           p + "mlp.down_proj.weight": (h, inter)})
        if cfg.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
        if cfg.gemma_norms:
            shapes.update({p + "pre_feedforward_layernorm.weight": (h,),
                           p + "post_feedforward_layernorm.weight": (h,)})
        if cfg.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if cfg.attention_out_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if cfg.mlp_bias:
            shapes.update({p + "mlp.gate_proj.bias": (inter,), p + "mlp.up_proj.bias": (inter,),
                           p + "mlp.down_proj.bias": (h,)})
    return shapes


def safetensors_shapes(model_dir: str) -> tuple[dict[str, tuple[int, ...]], int]:
    """(shape by name, stored bytes) from the shards' JSON headers: an 8-byte little-endian
    header length, then the header, whose entries carry `shape` and `data_offsets`."""
    from radixlm.models.hf_loader import safetensors_files

    shapes: dict[str, tuple[int, ...]] = {}
    stored = 0
    for path in safetensors_files(model_dir):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            shapes[name] = tuple(int(x) for x in info["shape"])
            start, end = info["data_offsets"]
            stored += end - start
    return shapes, stored


def gguf_shapes(path: str) -> tuple[dict[str, tuple[int, ...]], int]:
    """(HF-named shape by name, stored bytes) from a GGUF tensor table. GGUF lists dims
    fastest first ([in, out]), HF slowest first ([out, in]): reversed."""
    from radixlm.models.gguf_loader import gguf_architecture, hf_name, open_gguf

    reader = open_gguf(path)
    arch = gguf_architecture(reader)
    shapes: dict[str, tuple[int, ...]] = {}
    stored = 0
    for t in reader.tensors:
        stored += int(t.n_bytes)
        if t.name == "rope_freqs.weight":  # metadata in disguise, not a weight
            continue
        shapes[hf_name(t.name, arch)] = tuple(int(x) for x in reversed(t.shape.tolist()))
    return shapes, stored


def gguf_int4_tensors(path: str) -> frozenset[str]:
    """HF names of a GGUF's Q4_0/Q4_1 projection weights (what `--quantization auto` keeps
    as int4)."""
    from radixlm.models.gguf_int4 import is_int4_type
    from radixlm.models.gguf_loader import gguf_architecture, hf_name, open_gguf

    reader = open_gguf(path)
    arch = gguf_architecture(reader)
    return frozenset(hf_name(t.name, arch) for t in reader.tensors
                     if t.name != "rope_freqs.weight" and is_int4_type(t.tensor_type)
                     and hf_name(t.name, arch).endswith(_LINEAR_WEIGHTS))


# Projections one layer fuses (ColumnParallelLinear): its form is 5-bit only when all are.
_FUSED = (("q_proj.weight", "k_proj.weight", "v_proj.weight"),
          ("gate_proj.weight", "up_proj.weight"))


def _fused_siblings(name: str) -> list[str]:
    for group in _FUSED:
        for suffix in group:
            if name.endswith("." + suffix):
                stem = name[:-len(suffix)]
                return [stem + s for s in group]
    return [name]


def gguf_int8_tensors(path: str, float32: bool = False) -> dict[str, float]:
    """HF name -> bytes a weight of its int8 groups, for a GGUF's Q8_0/Q5_0/Q6_K
    projections, and embedding / lm_head of a large vocabulary (`INT8_HEAD_MIN_ROWS`): what
    `--quantization auto` keeps as int8. Q5_0 projections whose fused layer is all Q5_0
    keep 5-bit groups instead where the q5_bf16 kernel runs (22 bytes per 32 weights).
    `float32`: a float32 run (the groups_f32 kernel): no 5-bit form, and the scales of
    Q8_0 / Q5_0 (the file's halves) kept as float16, Q6_K's d * sc as float32."""
    from gguf import GGMLQuantizationType

    from radixlm.models.gguf_int8 import int8_group_size, is_int8_type
    from radixlm.models.gguf_loader import gguf_architecture, hf_name, open_gguf
    from radixlm.models.linear.policy import INT8_HEAD_MIN_ROWS
    from radixlm.models.linear.q5_bf16 import q5_bf16_kernel_usable

    reader = open_gguf(path)
    arch = gguf_architecture(reader)
    types = {hf_name(t.name, arch): t.tensor_type for t in reader.tensors
             if t.name != "rope_freqs.weight"}
    q5 = not float32 and q5_bf16_kernel_usable()

    def int8_bytes(tensor_type: GGMLQuantizationType) -> float:
        half = float32 and tensor_type in (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q5_0)
        return 1 + (2 if half else 4) / int8_group_size(tensor_type)

    out = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight" or not is_int8_type(t.tensor_type):
            continue
        name = hf_name(t.name, arch)
        rows = int(t.shape[-1])  # GGUF lists dims fastest-first
        if name.endswith(_LINEAR_WEIGHTS):
            fused = [types.get(n) for n in _fused_siblings(name) if n in types]
            five = q5 and all(ft == GGMLQuantizationType.Q5_0 for ft in fused)
            out[name] = 22 / 32 if five else int8_bytes(t.tensor_type)
        elif name.endswith(_VOCAB_PARALLEL) and rows >= INT8_HEAD_MIN_ROWS:
            out[name] = int8_bytes(t.tensor_type)
    return out


def checkpoint_shapes(model_path: str, cfg: ModelConfig
                      ) -> tuple[dict[str, tuple[int, ...]], str, int | None]:
    """(shapes, source, stored bytes): real tensor sizes when the checkpoint is there, else
    the architecture's (a HF directory holding only config.json)."""
    if model_path.endswith(".gguf"):
        shapes, stored = gguf_shapes(model_path)
        return shapes, "gguf", stored
    if any(n.endswith(".safetensors") for n in os.listdir(model_path)):
        shapes, stored = safetensors_shapes(model_path)
        return shapes, "safetensors", stored
    return config_tensor_shapes(cfg), "config", None


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def estimate_weights(shapes: dict[str, tuple[int, ...]], cfg: ModelConfig, dtype_bytes: int,
                     quantization: str = "none", tp: int = 1, source: str = "config",
                     on_disk_bytes: int | None = None, int4_names: frozenset[str] = frozenset(),
                     dtype_name: str = "", prepacked_head: bool = False,
                     int8_forms: dict[str, float] | None = None,
                     int4_int8_activations: bool = False) -> WeightEstimate:
    """Bytes of one TP rank's weights. Tensors the model does not hold are skipped: a
    checkpoint's lm_head when embeddings are tied, RoPE `inv_freq` buffers.
    `quantization="int4"`: the `int4_names` projections also keep their int4 form, the
    `int8_forms` tensors their int8 / 5-bit groups (only those on AMX CPUs:
    `LinearPolicy`'s `int4_tiles_max_m`, `q5_tiles_max_m`, `int8_tiles_max_m` defaults).
    `prepacked_head`: the LM head is prepacked for oneDNN (CPU), so a tied head holds its
    own packed copy of the embedding. `int4_int8_activations`: the engine's flag (a float32
    run's int4 layers then keep no dense copy)."""
    from radixlm.models.linear.bf16_tiles import bf16_tiles_kernel
    from radixlm.models.linear.groups_f32 import groups_f32_usable
    from radixlm.models.linear.int4 import (int4_bf16_kernel_usable, int4_bytes_per_weight,
                                            int4_tiles_usable)

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; known: {', '.join(QUANTIZATIONS)}")
    check_tp(cfg, tp)
    kv_frac = (kv_heads_per_rank(cfg, tp), cfg.num_kv_heads)  # rank's share of k/v rows
    int8_forms = int8_forms if quantization == "int4" else {}
    # int4 projections: their form's bytes, and no dense fallback where the 4-bit tiles run
    int4_bf16 = quantization == "int4" and dtype_bytes == 2 and int4_bf16_kernel_usable()
    f32 = quantization == "int4" and dtype_bytes == 4 and groups_f32_usable()
    int4_per_weight = int4_bytes_per_weight(dtype_bytes, bf16=int4_bf16, f32=f32)
    int4_dense = not (int4_bf16 and int4_tiles_usable()) and not (f32 and int4_int8_activations)
    # int8 / 5-bit groups (GGUF's groups of 16 or 32): no dense fallback on the AMX tiles;
    # a float32 run's int8 head none either (groups_f32 takes its every call)
    int8_dense = not (int8_forms and dtype_bytes == 2 and bf16_tiles_kernel() is not None)
    head_dense = int8_dense and not f32
    emb = head = linear = other = params = int4 = int8 = 0
    int8_table = False  # a vocabulary table kept as int8 groups (no dense copy)
    for name, shape in shapes.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        n = _numel(shape)
        if name.endswith(_VOCAB_PARALLEL):
            rows = -(-shape[0] // tp)  # ceil: the last rank's shard is padded
            b = rows * _numel(shape[1:]) * dtype_bytes
            if name in int8_forms and tp == 1:
                # int8 groups (the embedding's rows, the head's one-row calls), plus the
                # head's dense fallback: a tied table's under lm_head below.
                int8_table = True
                b = int(n * int8_forms[name]) + (b if head_dense and "lm_head" in name else 0)
            params += n
            if "embed_tokens" in name:
                emb += b
            else:
                head += b
            continue
        if name.endswith(_COL_PARALLEL) or name.endswith(_ROW_PARALLEL):
            per_rank = n // tp
        elif name.endswith(_KV_PARALLEL):
            per_rank = n * kv_frac[0] // kv_frac[1]
        elif (name.endswith(_REPLICATED) or name.endswith("layernorm.weight")
              or name.endswith(_REPLICATED_LINEAR)):
            per_rank = n
        else:
            continue  # not a weight of the model (e.g. rotary_emb.inv_freq)
        params += n
        if name.endswith(_LINEAR_WEIGHTS):
            dense = per_rank * (1 if quantization == "fp8" else dtype_bytes)
            if quantization == "int4" and name in int4_names:
                int4 += int(per_rank * int4_per_weight)
                dense = dense if int4_dense else 0
            elif name in int8_forms:
                int8 += int(per_rank * int8_forms[name])
                dense = dense if int8_dense else 0
            linear += dense
        else:
            other += per_rank * dtype_bytes
    if int8_table and cfg.tie_word_embeddings:
        head = (-(-shapes["model.embed_tokens.weight"][0] // tp) * cfg.hidden_size * dtype_bytes
                if head_dense else 0)
    elif prepacked_head and cfg.tie_word_embeddings:
        head = emb
    # RoPE cos/sin cache: [max_position_embeddings, head_dim] in the run dtype, per rank
    # (float32 buffers cast on copy: the buffer's dtype is the model's); a second one for
    # the local layers' RoPE base (Gemma 3).
    ropes = 2 if cfg.rope_local_theta is not None else 1
    other += ropes * cfg.max_position_embeddings * cfg.head_dim * dtype_bytes
    return WeightEstimate(emb, head, linear, other, params, source, on_disk_bytes, int4,
                          int8, dtype_name, int8_table and cfg.tie_word_embeddings)


def module_bytes(model) -> int:
    """Bytes a loaded model holds: parameters and buffers (the RoPE cache, the linear
    methods' packed weights), each storage once (a tied head's method shares the
    embedding's)."""
    from radixlm.models.linear.method import storage_key

    seen: set[tuple[int, int]] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total
