"""MemoryPlan arithmetic against hand-computed cases (GQA, tensor parallel, page size)."""

import math
import os

import pytest

from radixlm.planning.device_memory import DeviceMemory
from radixlm.planning.planner import default_mem_fraction_static, plan_memory
from radixlm.planning.units import GiB, parse_size
from radixlm.planning.weight_estimate import config_tensor_shapes, estimate_weights
from radixlm.models.hf_loader import load_hf_config

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "configs")


def llama(name: str):
    return load_hf_config(os.path.join(FIXTURES, name))


def plan(cfg, *, total=80 * GiB, weights=16 * GiB, **kw):
    args = dict(act_bytes=2, kv_bytes=2, context_len=8192, chunked_prefill_size=8192,
                max_prefill_tokens=8192, mem_fraction_static=0.9, max_running_requests=100)
    args.update(kw)
    dev = DeviceMemory("cuda", total, total - weights, "test")
    return plan_memory(cfg=cfg, weight_bytes=weights, device=dev, **args)


def test_parse_size():
    assert parse_size("24GiB") == 24 * 2**30
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("512M") == 512 * 2**20
    assert parse_size("1.5 GiB") == 3 * 2**29
    for bad in ("lots", "12 parsecs", "0GiB", ""):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_gqa_kv_pool_by_hand():
    # Llama-3-8B: 8 KV heads x 128 dims x 32 layers x K,V x 2 bytes = 131072 B per token.
    p = plan(llama("llama-3-8b"))
    assert p.kv_bytes_per_token == 2 * 8 * 128 * 32 * 2 == 131072
    # static budget = (80 - 16) GiB - 80 GiB * 0.1 = 56 GiB; req_to_token = (100 rows + the
    # dummy row) * 8192 * 4.
    assert p.req_to_token_bytes == 3_309_568
    assert p.kv_tokens == (56 * GiB - 3_309_568) // 131072 == 458_726
    assert p.kv_limited_by == "memory"
    # Activations: what is left = 80 GiB * 0.1 up to the rounding of the last token.
    assert 8 * GiB <= p.activation_headroom < 8 * GiB + 131072
    assert p.problems == []


def test_tensor_parallel_splits_kv_heads():
    cfg = llama("llama-3-8b")
    p4 = plan(cfg, tp_size=4)
    assert p4.kv_bytes_per_token == 2 * 2 * 128 * 32 * 2  # 8 KV heads / 4 ranks
    assert p4.kv_tokens == (56 * GiB - 3_309_568) // 32768
    # More ranks than KV heads: each rank keeps one (replicated) head.
    p16 = plan(cfg, tp_size=16)
    assert p16.kv_bytes_per_token == 2 * 1 * 128 * 32 * 2
    with pytest.raises(ValueError, match="tp-size"):
        plan(cfg, tp_size=3)


def test_page_size_rounds_down_to_whole_pages():
    p = plan(llama("llama-3-8b"), page_size=16)
    assert p.kv_tokens == 458_726 // 16 * 16 == 458_720


def test_max_total_tokens_is_a_cap():
    p = plan(llama("llama-3-8b"), max_total_tokens=1000)
    assert p.kv_tokens == 1000 and p.kv_tokens_from_memory == 458_726
    assert p.kv_limited_by == "--max-total-tokens"
    # The memory the cap leaves goes to the activations.
    assert p.activation_headroom == 64 * GiB - 1000 * 131072 - 3_309_568


def test_weights_from_architecture_match_published_sizes():
    cfg8, cfg70 = llama("llama-3-8b"), llama("llama-3-70b")
    w8 = estimate_weights(config_tensor_shapes(cfg8), cfg8, 2)
    assert w8.num_params == 8_030_261_248  # Meta: 8.03B
    rope = 8192 * 128 * 2
    assert w8.total_bytes == 2 * 8_030_261_248 + rope
    w70 = estimate_weights(config_tensor_shapes(cfg70), cfg70, 2)
    assert w70.num_params == 70_553_706_496  # Meta: 70.6B
    assert 140e9 < w70.total_bytes < 142e9  # "about 140 GB in BF16"
    fp8 = estimate_weights(config_tensor_shapes(cfg70), cfg70, 2, quantization="fp8")
    # Linear layers at 1 byte, embedding and lm_head (2 x 128256 x 8192) stay BF16.
    emb = 2 * 128256 * 8192
    norms = 161 * 8192  # 2 per layer + the final one
    assert fp8.total_bytes == (70_553_706_496 - emb - norms) + 2 * emb + 2 * norms + rope
    assert 70e9 < fp8.total_bytes < 74e9  # "about 70 GB in FP8"
    # TP 8: one rank holds an eighth of everything but the norms and the RoPE cache.
    tp8 = estimate_weights(config_tensor_shapes(cfg70), cfg70, 2, tp=8)
    assert tp8.total_bytes == (2 * 70_553_706_496 - 2 * norms) // 8 + 2 * norms + rope


def test_default_fraction_rule():
    # 1 - (1 GiB + 1.5 * 2 GiB) / 80 GiB = 0.95 -> clamped to 0.93; small devices keep more.
    assert default_mem_fraction_static(80 * GiB, 2 * GiB, "cuda") == 0.93
    assert default_mem_fraction_static(16 * GiB, 2 * GiB, "cuda") == 0.75
    assert default_mem_fraction_static(4 * GiB, 2 * GiB, "cuda") == 0.5
    p = plan(llama("llama-3-8b"), mem_fraction_static=None)
    assert p.mem_fraction_static == default_mem_fraction_static(80 * GiB, p.prefill_peak, "cuda")


def test_derived_max_running_requests_fits_the_activation_pool():
    p = plan(llama("llama-3-8b"), max_running_requests=None)
    assert 1 <= p.max_running_requests <= 4096
    assert p.decode_fits and p.prefill_fits
    assert p.activation.decode_peak(p.max_running_requests + 1, 8192) > p.activation_headroom


def test_weights_too_big_is_fatal_and_says_shrink():
    cfg = llama("llama-3-70b")
    w = estimate_weights(config_tensor_shapes(cfg), cfg, 2).total_bytes
    p = plan(cfg, weights=w)
    assert [x.pool for x in p.fatal] == ["weights"]
    assert "FP8" in p.fatal[0].text() and "--tp-size" in p.fatal[0].text()


def test_no_kv_pool_says_raise_the_fraction():
    cfg = llama("llama-3-8b")
    p = plan(cfg, weights=70 * GiB, mem_fraction_static=0.85)  # 0.85 * 80 < 70 + KV
    assert [x.pool for x in p.fatal] == ["kv"]
    text = p.fatal[0].text()
    assert "UP" in text and "raise --mem-fraction-static to" in text
    f = float(text.split("raise --mem-fraction-static to ")[1][:4])
    assert f > 0.85
    fixed = plan(cfg, weights=70 * GiB, mem_fraction_static=f)
    assert fixed.fatal == [] and fixed.kv_tokens >= 4096


def test_prefill_that_does_not_fit_names_both_flags_with_values():
    cfg = llama("llama-3-8b")
    p = plan(cfg, mem_fraction_static=0.99, max_running_requests=8)
    (prob,) = [x for x in p.problems if x.phase == "prefill"]
    assert not prob.fatal and not p.prefill_fits
    chunk = int(prob.text().split("--chunked-prefill-size to ")[1].split(";")[0])
    assert p.activation.prefill_peak(chunk, 8192) <= p.activation_headroom
    f = float(prob.text().split("--mem-fraction-static to ")[1][:4])
    assert plan(cfg, mem_fraction_static=f, max_running_requests=8).prefill_fits


def test_fraction_for_kv_tokens_round_trip():
    p = plan(llama("llama-3-8b"))
    f = p.fraction_for_kv_tokens(500_000)
    assert f is not None and p.fraction_for_kv_tokens(600_000) is None  # > 64 GiB free
    assert plan(llama("llama-3-8b"), mem_fraction_static=f).kv_tokens >= 500_000
    assert plan(llama("llama-3-8b"), mem_fraction_static=f - 0.01).kv_tokens < 500_000
    assert math.isclose(p.kv_tokens_per_fraction_point, 0.01 * 80 * GiB // 131072)
