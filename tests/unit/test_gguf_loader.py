"""GGUF loading: a tiny random HF Llama written as GGUF the way llama.cpp's converter
does (names, Q/K row permutation, reversed shapes, F32/F16/Q8_0 tensors) must load back
to the HF weights and give HF's logits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from radixlm.models import ModelConfig, load_model
from radixlm.models.gguf_loader import hf_name, iter_gguf_weights, open_gguf, unpermute_qk
from tests.conftest_models import PoolHarness, rel_err

VOCAB = 128
HEADS, KV_HEADS = 4, 2
Q8_TENSOR = "model.layers.1.mlp.down_proj.weight"  # stored as Q8_0
F16_TENSOR = "model.layers.0.self_attn.k_proj.weight"  # stored as F16

_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}
# convert_hf_to_gguf's Gemma 3 names for its four norms.
_GEMMA_TO_GGUF = {**_TO_GGUF, "post_attention_layernorm": "post_attention_norm",
                  "pre_feedforward_layernorm": "ffn_norm",
                  "post_feedforward_layernorm": "post_ffw_norm"}
_ARCHS = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (with n_head already the kv count for K)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def to_gguf_name(name: str, arch: str = "llama") -> str:
    if name.startswith("model.layers."):
        _, _, layer, rest = name.split(".", 3)
        module, suffix = rest.rsplit(".", 1)
        names = _GEMMA_TO_GGUF if arch == "gemma3" else _TO_GGUF
        return f"blk.{layer}.{names[module]}.{suffix}"
    return {"model.embed_tokens.weight": "token_embd.weight",
            "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[name]


def write_gguf(hf: torch.nn.Module, path: str,
               extra: dict[str, np.ndarray] | None = None,
               quantized: dict[str, GGMLQuantizationType] | None = None) -> dict[str, torch.Tensor]:
    """Write `hf` as a llama (or qwen2, qwen3, gemma3) GGUF plus `extra` raw tensors;
    returns the HF state the file encodes (the quantized and F16 tensors after their
    quantization round trip). `quantized`: HF name -> block type (default: Q8_TENSOR
    as Q8_0)."""
    quantized = {Q8_TENSOR: GGMLQuantizationType.Q8_0} if quantized is None else quantized
    c = hf.config
    arch = _ARCHS.get(c.model_type, "llama")
    w = GGUFWriter(path, arch)
    w.add_name("tiny-llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = c.rope_parameters
    w.add_rope_freq_base((rope.get("full_attention") or rope)["rope_theta"])
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if arch == "gemma3":
        w.add_sliding_window(c.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    expected = {}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        arr = t.numpy().astype(np.float32)
        gemma_norm = arch == "gemma3" and name.endswith("norm.weight")
        if gemma_norm:
            arr = arr + np.float32(1.0)  # convert_hf_to_gguf stores Gemma's 1 + w
        if gemma_norm:  # what the file encodes: w through + 1 and - 1 in float32
            expected[name] = torch.from_numpy(arr - np.float32(1.0))
        elif name in quantized:
            q = quantize(arr, quantized[name])
            expected[name] = torch.from_numpy(dequantize(q, quantized[name]).copy())
        elif name == F16_TENSOR:
            expected[name] = torch.from_numpy(arr.astype(np.float16).astype(np.float32))
        else:
            expected[name] = t.clone()
        # llama.cpp permutes Q/K rows (weights and biases) for the llama arch only.
        if arch == "llama" and ".q_proj." in name:
            arr = llama_cpp_permute(arr, c.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            arr = llama_cpp_permute(arr, c.num_key_value_heads)
        if name in quantized:
            w.add_tensor(to_gguf_name(name, arch), quantize(arr, quantized[name]),
                         raw_dtype=quantized[name])
        elif name == F16_TENSOR:
            w.add_tensor(to_gguf_name(name, arch), arr.astype(np.float16))
        else:
            w.add_tensor(to_gguf_name(name, arch), arr)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


_FAMILY_KW = {
    # Qwen3: q/k norm, head_dim 16 given explicitly; not permuted by the converter.
    "qwen3": (transformers.Qwen3Config, {"head_dim": 16}),
    # Gemma 3: (1 + w) norms stored as 1 + w, a local (window 8) and a global layer,
    # query_pre_attn_scalar = head_dim (what llama.cpp assumes), tied head.
    "gemma3": (transformers.Gemma3TextConfig, {
        "head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16,
        "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": True,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "sliding_attention": {"rope_type": "default",
                                                  "rope_theta": 10000.0}}}),
}


def tiny_hf(family: str) -> torch.nn.Module:
    """A tiny random HF model of `family` (llama_untied, llama_tied, qwen2_bias, qwen3,
    gemma3): hidden 64, 2 layers, 4 heads of 16, weights ~0.2 N(0, 1), norms ~1."""
    qwen2 = family == "qwen2_bias"
    config_cls, extra = _FAMILY_KW.get(
        family, (transformers.Qwen2Config if qwen2 else transformers.LlamaConfig, {}))
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
              max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
              tie_word_embeddings=family == "llama_tied", bos_token_id=1,
              eos_token_id=2)
    kw.update(extra)
    if "rope_parameters" in kw:
        kw.pop("rope_theta")
    cfg = config_cls(**kw)
    hf = transformers.AutoModelForCausalLM.from_config(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.2 * noise)
    return hf


@pytest.fixture(scope="module",
                params=["llama_untied", "llama_tied", "qwen2_bias", "qwen3", "gemma3"])
def checkpoint(request, tmp_path_factory):
    hf = tiny_hf(request.param)
    path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    expected = write_gguf(hf, path)
    hf.load_state_dict(expected, strict=False)  # HF now holds the quantized values too
    hf.eval()
    return hf, path, expected


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    for n_heads in (8, 2):
        back = unpermute_qk(torch.from_numpy(llama_cpp_permute(w, n_heads)), n_heads)
        assert torch.equal(back, torch.from_numpy(w))


def test_name_mapping():
    assert hf_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert hf_name("blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    with pytest.raises(ValueError):
        hf_name("blk.0.ssm_conv.weight")


def test_config_from_metadata(checkpoint):
    hf, path, _ = checkpoint
    c = ModelConfig.from_gguf_metadata(open_gguf(path))
    is_qwen2 = hf.config.model_type == "qwen2"
    arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "gemma3_text": "Gemma3ForCausalLM"}.get(hf.config.model_type, "LlamaForCausalLM")
    assert (c.architecture, c.vocab_size, c.hidden_size, c.num_layers) == (arch, VOCAB, 64, 2)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (HEADS, KV_HEADS, 16)
    assert c.intermediate_size == 128
    assert c.max_position_embeddings == 128 and c.rope_theta == 10000.0
    assert c.rms_norm_eps == pytest.approx(1e-5)
    assert c.tie_word_embeddings == hf.config.tie_word_embeddings
    assert (c.bos_token_id, c.eos_token_ids) == (1, [2])
    assert c.attention_bias == is_qwen2 and not c.attention_out_bias and c.rope_scaling is None
    assert c.qk_norm == (hf.config.model_type in ("qwen3", "gemma3_text"))
    if hf.config.model_type == "gemma3_text":
        assert c.sliding_layers == (True, False) and c.sliding_window == 8


def test_weights_equal_hf(checkpoint):
    hf, path, expected = checkpoint
    reader = open_gguf(path)
    config = ModelConfig.from_gguf_metadata(reader)
    loaded = dict(iter_gguf_weights(reader, config, torch.float32))
    assert set(loaded) == set(expected)
    for name, ref in expected.items():
        assert loaded[name].shape == ref.shape, name
        assert torch.equal(loaded[name], ref), name


def test_logits_match_hf(checkpoint):
    hf, path, _ = checkpoint
    model, config = load_model(path, torch.float32, "cpu")
    ids = torch.randint(3, VOCAB, (10,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids + [7, 9]])).logits[0]
    h = PoolHarness(model, config)
    row = h.new_request()
    assert rel_err(h.extend([row], [ids], all_logits=True), ref[:10]) < 1e-4
    assert rel_err(h.decode([row], [7])[0], ref[10]) < 1e-4
    assert rel_err(h.decode([row], [9])[0], ref[11]) < 1e-4


def test_load_in_bfloat16(checkpoint):
    _, path, _ = checkpoint
    model, _ = load_model(path, torch.bfloat16, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def llama_cpp_rope_factors(head_dim: int, theta: float, s: dict) -> np.ndarray:
    """convert_hf_to_gguf.py's `rope_freqs` for llama3 scaling: per-frequency divisors."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    old, lo, hi, factor = (s["original_max_position_embeddings"], s["low_freq_factor"],
                           s["high_freq_factor"], s["factor"])
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_freqs_tensor(tmp_path):
    """Llama 3.1 GGUFs carry llama3 RoPE scaling as a `rope_freqs` tensor, not metadata."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128,
        rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=scaling)
    hf = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2, generator=torch.Generator().manual_seed(p.numel()))
    path = str(tmp_path / "llama3.gguf")
    factors = llama_cpp_rope_factors(16, 10000.0, scaling)
    expected = write_gguf(hf, path, {"rope_freqs.weight": factors})
    hf.load_state_dict(expected, strict=False)
    model, config = load_model(path, torch.float32, "cpu")
    assert config.rope_freq_factors == pytest.approx(factors.tolist())
    ids = list(range(3, 40))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    h = PoolHarness(model, config)
    assert rel_err(h.extend([h.new_request()], [ids], all_logits=True), ref) < 1e-4


def test_fast_reader_parses_the_fields_the_stock_reader_does(tmp_path):
    """Every metadata field and tensor of a file with each kind of value (scalars,
    strings, arrays of scalars and of strings, empty and nested arrays) equals the
    stock GGUFReader's, part by part (the fast reader's own array parsers)."""
    from gguf import GGUFReader, GGUFValueType

    path = str(tmp_path / "fields.gguf")
    w = GGUFWriter(path, "llama")
    w.add_string("s.plain", "héllo ✓")
    w.add_string("s.empty", "")
    w.add_uint32("n.u32", 7)
    w.add_float32("n.f32", 0.25)
    w.add_bool("n.bool", True)
    w.add_array("a.strings", ["", "a", "ünï ✓", "x" * 300])
    w.add_array("a.i32", [-1, 0, 2**31 - 1])
    w.add_array("a.f32", [0.5, -2.0])
    w.add_array("a.bool", [True, False, True])
    w.add_array("a.empty", [])
    w.add_array("a.nested", [[1, 2], [3]])
    w.add_tensor("t.weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fast, stock = open_gguf(path), GGUFReader(path)
    assert list(fast.fields) == list(stock.fields)
    for name, want in stock.fields.items():
        got = fast.fields[name]
        assert (got.offset, got.data, got.types) == (want.offset, want.data, want.types), name
        assert len(got.parts) == len(want.parts), name
        for a, b in zip(got.parts, want.parts):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
        assert repr(got.contents()) == repr(want.contents()), name
    assert fast.fields["a.strings"].contents() == ["", "a", "ünï ✓", "x" * 300]
    assert fast.fields["a.i32"].types == [GGUFValueType.ARRAY, GGUFValueType.INT32]
    assert [(t.name, t.data_offset) for t in fast.tensors] == \
        [(t.name, t.data_offset) for t in stock.tensors]
    assert np.array_equal(fast.tensors[0].data, stock.tensors[0].data)
