"""prompt_logprobs through the Engine on a tiny random Llama: equal to transformers'
log_softmax of the prompt, whole or chunked, after a cache-warming request, overlap on/off;
with logprob_start_len, only the tokens after it, the prefix before it from the cache."""

import random

import pytest
import torch

from radixlm import SamplingParams
from radixlm.engine import Engine
from tests.engine_checks import assert_all_slots_back as all_back


def _reference(model_dir: str, ids: list[int]) -> torch.Tensor:
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # [L, V]: row p predicts token p + 1


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    rng = random.Random(3)
    return [rng.randrange(3, 256) for _ in range(40)]


@pytest.fixture(scope="module")
def ref(tiny_llama_dir, prompt) -> torch.Tensor:
    return _reference(tiny_llama_dir, prompt)


def _check(res: dict, prompt: list[int], ref: torch.Tensor, k: int) -> None:
    pl = res["prompt_logprobs"]
    assert pl.token_ids == prompt[1:]
    want = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    torch.testing.assert_close(torch.tensor(pl.logprobs), want, atol=2e-3, rtol=1e-3)
    assert len(pl.top_ids) == (len(prompt) - 1 if k else 0)
    if k:
        top_vals, _ = ref[:-1].topk(k, dim=-1)
        torch.testing.assert_close(torch.tensor(pl.top_values), top_vals, atol=2e-3, rtol=1e-3)
        got = torch.tensor(pl.logprobs)
        assert (got <= torch.tensor(pl.top_values)[:, 0] + 1e-4).all()


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("chunk", [-1, 9])
def test_prompt_logprobs_match_transformers(tiny_llama_dir, prompt, ref, chunk, overlap):
    eng = Engine(model=tiny_llama_dir, max_total_tokens=2048, chunked_prefill_size=chunk,
                 disable_overlap_schedule=not overlap)
    greedy = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)
    # Warm the radix cache with the same prompt: the prompt-logprobs request must not use it.
    eng.generate(prompt, greedy)
    asked = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True, prompt_logprobs=3)
    plain, res = eng.generate([prompt, prompt], [greedy, asked])
    _check(res, prompt, ref, k=3)
    assert "prompt_logprobs" not in plain
    assert res["output_ids"] == plain["output_ids"]
    only = SamplingParams(max_new_tokens=1, temperature=0.0, prompt_logprobs=0)
    _check(eng.generate(prompt, only), prompt, ref, k=0)
    one = eng.generate(prompt[:1], only)["prompt_logprobs"]
    assert one.token_ids == [] and one.logprobs == []
    all_back(eng, 2048)
    eng.shutdown()


def test_prompt_logprobs_in_mixed_batches(tiny_llama_dir, prompt, ref):
    # A decoding request rides along the chunks (MIXED batches) of the asking one.
    eng = Engine(model=tiny_llama_dir, max_total_tokens=2048, chunked_prefill_size=9,
                 enable_mixed_chunk=True)
    runner = eng.submit([5, 6, 7], SamplingParams(max_new_tokens=30, temperature=0.0,
                                                  ignore_eos=True))
    eng.step()
    asked = eng.submit(prompt, SamplingParams(max_new_tokens=2, temperature=0.0,
                                              ignore_eos=True, prompt_logprobs=2))
    eng.run_until_done([runner, asked])
    _check(eng.pop_result(asked), prompt, ref, k=2)
    all_back(eng, 2048)


@pytest.mark.parametrize("chunk", [-1, 9])
def test_logprob_start_len_takes_the_prefix_from_the_cache(tiny_llama_dir, prompt, ref, chunk):
    """SGLang's logprob_start_len s: the logprobs of tokens s+1.. only, and the prompt's
    first s tokens may come from the radix cache (warmed by an earlier request)."""
    eng = Engine(model=tiny_llama_dir, max_total_tokens=2048, chunked_prefill_size=chunk)
    eng.generate(prompt, SamplingParams(max_new_tokens=1, temperature=0.0))
    start = 17
    res = eng.generate(prompt, SamplingParams(max_new_tokens=2, temperature=0.0,
                                              prompt_logprobs=2, logprob_start_len=start))
    pl = res["prompt_logprobs"]
    assert pl.token_ids == prompt[start + 1:]
    want = ref[torch.arange(start, len(prompt) - 1), torch.tensor(prompt[start + 1:])]
    torch.testing.assert_close(torch.tensor(pl.logprobs), want, atol=2e-3, rtol=1e-3)
    top_vals, _ = ref[start:-1].topk(2, dim=-1)
    torch.testing.assert_close(torch.tensor(pl.top_values), top_vals, atol=2e-3, rtol=1e-3)
    assert res["meta_info"]["cached_tokens"] == start
    # Start 0 (vLLM's prompt_logprobs): nothing from the cache.
    res = eng.generate(prompt, SamplingParams(max_new_tokens=1, temperature=0.0,
                                              prompt_logprobs=0))
    assert res["meta_info"]["cached_tokens"] == 0 and len(res["prompt_logprobs"].logprobs) == 39
    with pytest.raises(ValueError, match="logprob_start_len"):
        eng.generate(prompt, SamplingParams(prompt_logprobs=0, logprob_start_len=-1))
    all_back(eng, 2048)
    eng.shutdown()
