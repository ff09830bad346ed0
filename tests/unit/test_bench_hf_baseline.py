"""The transformers baseline runs the same weights as radixlm: greedy outputs agree."""

import pytest
import torch

from radixlm.bench.hf_baseline import HFBaseline
from radixlm.engine import Engine
from radixlm.sampling_params import SamplingParams
from tests.conftest import make_tiny_llama, requires_default_model


def _greedy(engine: Engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    return [r["output_ids"] for r in engine.generate(prompts, params)]


def test_tiny_llama_left_padded_batches_match(tmp_path):
    model = make_tiny_llama(str(tmp_path))
    engine = Engine(model, dtype="float32", max_total_tokens=1024, max_running_requests=4)
    # Batch size 2 over 4 prompts: two static batches, each left-padded to its longest.
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [20, 21, 22, 23], [30]]
    assert HFBaseline(model, torch.float32, 2).generate(prompts, 6) == _greedy(engine, prompts, 6)


@pytest.mark.slow
@requires_default_model
def test_default_gguf_model_matches_radixlm():
    from radixlm.models.loader import resolve_model_path

    model = resolve_model_path(None)
    engine = Engine(model, dtype="float32", max_total_tokens=256, max_running_requests=1)
    prompts = [engine.tokenizer.encode("The capital of France is")]
    assert HFBaseline(model, torch.float32, 1).generate(prompts, 8) == _greedy(engine, prompts, 8)
