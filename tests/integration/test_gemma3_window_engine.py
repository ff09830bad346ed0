"""Gemma 3's sliding window through the whole engine, on a tiny random checkpoint with a
window of 8 and prompts of 30 tokens: chunked prefill with chunks smaller (4) and larger
(16) than the window, decode, radix-cache hits (a repeated prompt and a shared prefix),
on the overlap and the serial loop, with the torch backend and the batch-invariant one
(--enable-deterministic-inference);
greedy tokens equal transformers' every time and all KV slots come back."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from radixlm import SamplingParams
from radixlm.engine import Engine
from tests.conftest import make_tiny_tokenizer_files
from tests.engine_checks import assert_all_slots_back

VOCAB = 256
NEW = 10


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():  # peaked attention and well separated greedy choices
            p.mul_(8.0) if p.dim() > 1 else p.add_(0.2 * torch.randn_like(p))
    path = str(tmp_path_factory.mktemp("gemma3_window"))
    hf.save_pretrained(path)
    make_tiny_tokenizer_files(path, VOCAB)
    return path, hf


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    base = [rng.randrange(3, VOCAB) for _ in range(30)]
    other = [rng.randrange(3, VOCAB) for _ in range(30)]
    return [base, other, base[:20] + [rng.randrange(3, VOCAB) for _ in range(10)]]


def _hf_greedy(hf, ids: list[int]) -> list[int]:
    out = hf.generate(torch.tensor([ids]), max_new_tokens=NEW, min_new_tokens=NEW,
                      do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("deterministic", [False, True], ids=["torch", "batch_invariant"])
@pytest.mark.parametrize("chunk", [4, 16])
def test_window_through_chunks_decode_and_cache_hits(checkpoint, chunk, deterministic):
    path, hf = checkpoint
    prompts = _prompts()
    want = [_hf_greedy(hf, p) for p in prompts]
    # Both loops without doubling the cases: chunks of 4 on the overlap loop (its
    # launch-time bookkeeping meets the window between chunks), 16 on the serial one.
    overlap = chunk == 4
    eng = Engine(model=path, dtype="float32", chunked_prefill_size=chunk,
                 max_total_tokens=1024, max_running_requests=4,
                 enable_deterministic_inference=deterministic,
                 disable_overlap_schedule=not overlap)
    assert eng.scheduler.overlap == overlap
    params = SamplingParams(max_new_tokens=NEW, temperature=0.0, ignore_eos=True)
    first = eng.generate(prompts[:2], params)  # batched, chunked
    assert [r["output_ids"] for r in first] == want[:2]
    again = eng.generate([prompts[0], prompts[2]], params)  # full hit, 20-token prefix hit
    assert [r["output_ids"] for r in again] == [want[0], want[2]]
    assert again[0]["meta_info"]["cached_tokens"] >= 29
    assert again[1]["meta_info"]["cached_tokens"] >= 16
    assert_all_slots_back(eng, 1024)
