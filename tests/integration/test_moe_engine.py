"""An MoE model (tiny random Qwen3-MoE) served through the Engine: scheduler, radix cache,
overlap and serial loops give transformers' greedy tokens; compiled decode graphs
(--enable-torch-compile) and CUDA graphs are refused for MoE (the experts' token counts are
read on the host), and the engine serves eagerly instead."""

from __future__ import annotations

import pytest
import torch
import transformers

from radixlm import Engine
from radixlm.config import ServerArgs
from radixlm.sampling_params import SamplingParams
from tests.conftest import make_tiny_tokenizer_files
from tests.engine_checks import assert_all_slots_back

NEW = 6
PROMPTS = [[5, 9, 33, 71, 12, 40, 7], [5, 9, 33, 71, 12, 88, 19, 3, 60], [101, 4, 4, 250]]


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> tuple[str, list[list[int]]]:
    """The checkpoint and HF's greedy continuation of each prompt."""
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3MoeConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True), dtype=torch.float32)
    with torch.no_grad():  # far from uniform logits, so greedy choices are separated
        for p in hf.parameters():
            p.mul_(10.0) if p.dim() > 1 else p.add_(0.1 * torch.randn_like(p))
    hf.eval()
    path = str(tmp_path_factory.mktemp("qwen3_moe"))
    hf.save_pretrained(path)
    make_tiny_tokenizer_files(path, 256)
    want = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = list(p)
            for _ in range(NEW):
                ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
            want.append(ids[len(p):])
    return path, want


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
def test_moe_engine_greedy_matches_hf_and_graphs_are_refused(moe_dir, overlap) -> None:
    path, want = moe_dir
    eng = Engine(model=path, dtype="float32", max_total_tokens=1024, max_running_requests=4,
                 disable_overlap_schedule=not overlap, enable_torch_compile=True)
    runner = eng.scheduler.runner
    assert runner.model_config.num_experts == 4
    assert runner.decode_graphs is None  # compile refused: eager decode
    # CUDA graphs are refused by the same rule (on a CPU runner: no capture attempted).
    assert runner._cuda_graphs(ServerArgs(model=path, disable_cuda_graph=False)) is None
    params = SamplingParams(max_new_tokens=NEW, temperature=0, ignore_eos=True)
    # The first two share a 5-token prefix: the second one's admission can hit the cache.
    outs = eng.generate(PROMPTS, params)
    assert [o["output_ids"] for o in outs] == want
    again = eng.generate(PROMPTS[1], params)  # its prompt is cached now
    assert again["output_ids"] == want[1] and again["meta_info"]["cached_tokens"] > 0
    assert_all_slots_back(eng)
