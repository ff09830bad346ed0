"""The real Gemma 3 270M (Q4_K_M GGUF: Q8_0, Q5_0, Q4_K, Q6_K and F32 tensors) against
transformers' own GGUF loader, both in float32 on the CPU: prompt logits of every
position within 1e-3 (one prompt longer than the 512-token window of the local layers),
32 greedy tokens equal, and the same through the Engine (scheduler, radix cache, chunked
prefill) with the pool invariant checked. Loaded once per module (~35 s together).

The prompts are tokenized by radixlm's load_tokenizer: transformers' own GGUF tokenizer
conversion, saved once under the cache directory (the Engine below and the e2e server
load the same saved copy). Only the ids reach the models, so the reference stays
independent: transformers' GGUF loader dequantizes the weights (gguf.quants) and runs its
own Gemma 3; only the metadata parse is shared (one fast reader, see `hf`)."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from radixlm.models import load_model
from radixlm.models.gguf_loader import _FastGGUFReader
from tests.conftest import gemma3_270m_path, requires_gemma3_270m
from tests.conftest_models import PoolHarness, rel_err
from tests.engine_checks import assert_all_slots_back

pytestmark = [pytest.mark.slow, requires_gemma3_270m]

TOL = 1e-3
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "Once upon a time, in a land far away, there lived a"]


@pytest.fixture(scope="module")
def gguf() -> str:
    path = gemma3_270m_path()
    assert path is not None
    return path


@pytest.fixture(scope="module")
def hf(gguf):
    import gguf as gguf_pkg
    from transformers import AutoModelForCausalLM

    from radixlm.tokenizer.loader import load_tokenizer

    d, f = os.path.split(gguf)
    # Speed-ups only (same arrays, as in test_default_model.py): transformers parses the
    # metadata (a 262k-token vocabulary) with the stock reader twice for the model and once
    # more for a tokenizer conversion (~20-25 s each on 2 cores); here at most once, with
    # radixlm's fast reader (~1 s, the same fields). The dequantization
    # (gguf.quants) and the model stay transformers'.
    reader = functools.cache(lambda path: _FastGGUFReader(path, "r"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf_pkg, "GGUFReader", reader)
        mp.setattr(gguf_pkg, "get_tensor_name_map",
                   functools.cache(gguf_pkg.get_tensor_name_map))
        tok = load_tokenizer(gguf)  # a conversion on a cold cache parses with it too
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    return tok, model.eval()


@pytest.fixture(scope="module")
def ours(gguf):
    return load_model(gguf, torch.float32, "cpu")


def _long_prompt(tok) -> list[int]:
    """~600 tokens: past the window (512), so local and global layers differ."""
    text = " ".join(f"Item {i}: the {['red', 'green', 'blue'][i % 3]} box." for i in range(90))
    ids = tok(text).input_ids
    assert len(ids) > 560, len(ids)
    return ids


def test_config_from_gguf(ours):
    _, cfg = ours
    assert cfg.architecture == "Gemma3ForCausalLM"
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (18, 4, 1, 256)
    assert cfg.sliding_window == 512 and sum(cfg.sliding_layers) == 15
    assert not cfg.sliding_layers[5] and cfg.rope_local_theta == 10000.0
    assert 106 in cfg.eos_token_ids  # <end_of_turn>


def test_prompt_logits_match_transformers(hf, ours):
    tok, ref_model = hf
    model, cfg = ours
    h = PoolHarness(model, cfg, max_requests=8, max_context=1024, num_slots=4096)
    for ids in [tok(p).input_ids for p in PROMPTS] + [_long_prompt(tok)]:
        with torch.no_grad():
            ref = ref_model(torch.tensor([ids])).logits[0]
        got = h.extend([h.new_request()], [ids], all_logits=True)
        assert rel_err(got, ref) < TOL, len(ids)


def test_greedy_32_tokens_equal_transformers(hf, ours):
    tok, ref_model = hf
    model, cfg = ours
    prompts = [tok(p).input_ids for p in PROMPTS[:2]]
    h = PoolHarness(model, cfg, max_requests=4, max_context=256, num_slots=1024)
    got = h.greedy(prompts, 32, stop_ids=[])
    for ids, out in zip(prompts, got):
        ref = ref_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                 min_new_tokens=32)[0, len(ids):].tolist()
        assert out == ref


def test_engine_serves_it_with_chunks_and_cache_hits(hf, gguf):
    """Through the scheduler: chunked prefill (chunk 128 < window 512 < prompt), then a
    second request that hits the radix cache; greedy outputs equal transformers'."""
    from radixlm import Engine, SamplingParams


    tok, ref_model = hf
    ids = _long_prompt(tok)
    with torch.no_grad():
        ref = ref_model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                 min_new_tokens=8)[0, len(ids):].tolist()
    engine = Engine(model=gguf, dtype="float32", chunked_prefill_size=128,
                    max_total_tokens=4096, max_running_requests=4)
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    first = engine.generate(ids, params)
    second = engine.generate(ids, params)
    assert first["output_ids"] == ref
    assert second["output_ids"] == ref
    assert second["meta_info"]["cached_tokens"] > 0
    assert not engine.scheduler.has_work()
    engine.check_invariant()
    assert_all_slots_back(engine, 4096)
