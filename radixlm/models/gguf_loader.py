"""GGUF files (llama.cpp): metadata -> ModelConfig, tensors -> HF-named dense tensors.

Tensors are dequantized on the CPU one at a time (Q8_0, Q5_0, Q4_K, Q5_K, Q6_K by
models/gguf_dequant.py in torch, bit-equal to the `gguf` package; other types by
`gguf.quants.dequantize`) and cast to the run dtype. With `int4=True` (`--quantization
auto`), Q4_0/Q4_1/Q4_K linear weights also keep their exact 4-bit groups
(`QuantizedCheckpointTensor`, models/gguf_int4.py), which the layers' int4 method computes
with; with `int8=True`, Q8_0/Q5_0/Q6_K linear weights, the embedding and the LM head keep
their exact int8 groups (models/gguf_int8.py).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from gguf import GGUFReader, GGUFValueType

from radixlm.models.gguf_dequant import dequantize
from radixlm.models.gguf_int4 import int4_groups_from_blocks, is_int4_type
from radixlm.models.gguf_int8 import int8_groups_from_blocks, is_int8_type
from radixlm.models.linear import QuantizedCheckpointTensor
from radixlm.models.model_config import ModelConfig

# GGUF tensor name (with N for the layer) -> HF name.
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
# Per architecture: names that differ from the Llama map above.
_ARCH_LAYER_NAMES = {
    # Gemma 3's four norms: ffn_norm is the MLP input's (HF pre_feedforward_layernorm),
    # post_attention_norm the attention output's.
    "Gemma3ForCausalLM": {
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}
# Architectures whose converter permutes Q/K rows (llama.cpp's `LlamaModel.permute`, for
# its interleaved-pair RoPE); Qwen, Gemma and Phi files keep HF's row order.
_PERMUTED_QK_ARCHS = ("LlamaForCausalLM",)
# Architectures whose GGUF norms store 1 + w (HF stores w): convert_hf_to_gguf adds 1.
_NORM_PLUS_ONE_ARCHS = ("Gemma3ForCausalLM",)
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Tensors that are metadata in disguise: consumed by ModelConfig, not weights.
_SKIPPED = {"rope_freqs.weight"}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


class _FastGGUFReader(GGUFReader):
    """GGUFReader that parses the metadata into the same fields ~17-23x faster than the
    stock one on a 2-core CPU (SmolLM2's 49k tokens and 49k merges: 3.7 -> 0.21 s; Gemma
    3's 262k tokens: 19.9 -> 0.85 s).

    The stock reader slices its `np.memmap` once per value (~250k times for a tokenizer
    vocabulary), each slice paying for `memmap.__array_finalize__` and a dtype lookup, and
    walks an array's items through the generic per-value parser. Here: slices of a plain
    ndarray view of the same mapping (identical arrays, still backed by the file), an
    array of scalars cut into its per-item views in one call, and an array of strings
    walked by its length prefixes alone. Overrides the private `_get` and
    `_get_field_parts`; should gguf drop or change them, the stock parse runs instead
    (tests/unit/test_gguf_loader.py compares every field with the stock reader's).
    """

    def _raw(self) -> npt.NDArray[np.uint8]:
        raw = self.__dict__.get("_raw_view")
        if raw is None:
            raw = self._raw_view = self.data.view(np.ndarray)
        return raw

    def _get(self, offset: int, dtype: npt.DTypeLike, count: int = 1,
             override_order: str | None = None) -> npt.NDArray[Any]:
        count = int(count)
        dt = np.dtype(dtype)
        arr = self._raw()[offset:offset + dt.itemsize * count].view(dt)[:count]
        order = self.byte_order if override_order is None else override_order
        return arr.view(arr.dtype.newbyteorder(order))

    def _get_field_parts(self, orig_offs: int, raw_type: int
                         ) -> tuple[int, list[npt.NDArray[Any]], list[int], list[Any]]:
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype, n = GGUFValueType(int(raw_itype[0])), int(alen[0])
        scalar = self.gguf_scalar_to_np.get(itype)
        if n == 0 or (scalar is None and itype != GGUFValueType.STRING):
            return super()._get_field_parts(orig_offs, raw_type)  # (nested arrays)
        raw, offs = self._raw(), orig_offs + 12
        parts: list[npt.NDArray[Any]] = [raw_itype, alen]
        if scalar is not None:  # n items of one dtype: n one-item views of one array
            dt = np.dtype(scalar).newbyteorder(self.byte_order)
            parts.extend(raw[offs:offs + dt.itemsize * n].view(dt).reshape(n, 1))
            return 12 + dt.itemsize * n, parts, list(range(2, n + 2)), [GGUFValueType.ARRAY,
                                                                        itype]
        u64 = np.dtype(np.uint64).newbyteorder(self.byte_order)
        swapped = self.byte_order == "S"
        order = ("big" if sys.byteorder == "little" else "little") if swapped else sys.byteorder
        buf = memoryview(raw)
        for _ in range(n):  # each string: its uint64 length, then its bytes
            size = int.from_bytes(buf[offs:offs + 8], order)
            parts.append(raw[offs:offs + 8].view(u64))
            parts.append(raw[offs + 8:offs + 8 + size])
            offs += 8 + size
        return offs - orig_offs, parts, list(range(3, 2 * n + 3, 2)), [GGUFValueType.ARRAY,
                                                                      itype]


def open_gguf(path: str) -> GGUFReader:
    """Memory-maps the file and parses its metadata; tensor data is read lazily."""
    return _FastGGUFReader(path, "r")


def gguf_architecture(reader: GGUFReader) -> str:
    """The architecture name (registry key) of a GGUF file's `general.architecture`."""
    from radixlm.models.model_config import gguf_architecture_name

    return gguf_architecture_name(reader)


def hf_name(gguf_name: str, architecture: str = "LlamaForCausalLM") -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    m = _LAYER_RE.fullmatch(gguf_name)
    names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(architecture, {})}
    if m and m.group(2) in names:
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    raise ValueError(f"unknown GGUF tensor {gguf_name!r}")


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf.py `permute`).

    HF's rotate-half RoPE pairs dimension i with i + d/2 inside each head, so a head's
    rows are [x_0 .. x_{d/2-1} | x_{d/2} .. x_{d-1}]. llama.cpp rotates adjacent pairs
    (2i, 2i+1), so the converter interleaves the halves: GGUF row 2i + j (j in {0, 1})
    of a head holds HF row j * d/2 + i. Viewing the rows as [heads, d/2, 2] and swapping
    the last two axes to [heads, 2, d/2] restores HF's order. Works for weights [rows,
    in] and biases [rows].
    """
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def iter_gguf_weights(reader: GGUFReader, config: ModelConfig, dtype: torch.dtype,
                      show_progress: bool = False, int4: bool = False, int8: bool = False
                      ) -> Iterator[tuple[str, "torch.Tensor | QuantizedCheckpointTensor"]]:
    """(HF name, CPU tensor in `dtype`, HF shape) for every weight tensor of the file;
    `int4`: Q4_0/Q4_1/Q4_K linear weights as QuantizedCheckpointTensor (dense + exact
    groups); `int8`: Q8_0/Q5_0/Q6_K linear weights, embedding and head likewise."""
    permuted = config.architecture in _PERMUTED_QK_ARCHS
    norm_minus_one = config.architecture in _NORM_PLUS_ONE_ARCHS
    tensors = reader.tensors
    if show_progress:
        from tqdm import tqdm

        tensors = tqdm(tensors, desc="Loading GGUF tensors", unit="tensor")
    for t in tensors:
        if t.name in _SKIPPED:
            continue
        name = hf_name(t.name, config.architecture)
        # GGUF lists dims fastest-first ([in, out]); numpy/torch want [out, in].
        shape = tuple(int(d) for d in reversed(t.shape))
        heads = None
        if permuted and ".q_proj." in name:
            heads = config.num_heads
        elif permuted and ".k_proj." in name:
            heads = config.num_kv_heads
        unpermute = (lambda x, n=heads: unpermute_qk(x, n)) if heads else (lambda x: x)
        if int4 and is_int4_type(t.tensor_type) and _is_linear(name) and len(shape) == 2:
            # The exact groups, and the dense values from them (bit for bit the gguf
            # package's dequantization: models/gguf_int4.py), one parse of the blocks.
            groups = int4_groups_from_blocks(t.data, t.tensor_type, *shape).permute_rows(unpermute)
            yield name, QuantizedCheckpointTensor(groups.dequantize().to(dtype), groups)
            continue
        if (int8 and is_int8_type(t.tensor_type) and len(shape) == 2
                and (_is_linear(name) or name in _TABLES)):
            g8 = int8_groups_from_blocks(t.data, t.tensor_type, *shape).permute_rows(unpermute)
            yield name, QuantizedCheckpointTensor(g8.dequantize().to(dtype), int8=g8)
            continue
        w = dequantize(t.data, t.tensor_type, shape)  # float32 (F16/BF16 widened)
        if norm_minus_one and name.endswith("norm.weight"):
            w = w - 1.0  # back to HF's w, in float32
        yield name, unpermute(w.to(dtype))


_TABLES = ("model.embed_tokens.weight", "lm_head.weight")


def _is_linear(hf: str) -> bool:
    """A decoder layer's projection weight (not the embedding, the head or a norm)."""
    return hf.startswith("model.layers.") and hf.endswith("_proj.weight")
