"""--tp-size 2 over gloo for the families beyond Llama: each sharded model (Qwen3 with q/k
norm, Gemma 3 with a window of 8 and a replicated KV head, Qwen3-MoE and Mixtral with
each expert's intermediate features split) gives the unsharded model's logits within
1e-5 and the same greedy tokens through the KV pool, each rank holding half the heads
(KV heads split or replicated) and half of every expert's features. One pair of spawned
ranks checks all four (a spawn costs seconds here)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from radixlm.config import ServerArgs
from radixlm.runtime.distributed import free_port, init_tensor_parallel
from radixlm.planning.weight_estimate import kv_heads_per_rank
from radixlm.models import load_model
from radixlm.models.parallel_context import ParallelContext
from tests.conftest_models import PoolHarness, rel_err
from tests.tp_harness import child_setup, spawn_ranks

TOL = 1e-5
_COMMON = dict(vocab_size=255, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "qwen3": lambda: transformers.Qwen3Config(**_COMMON, head_dim=32),
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **{**_COMMON, "num_key_value_heads": 1}, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"]),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        **_COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True),
    "mixtral": lambda: transformers.MixtralConfig(
        **_COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    paths = {}
    for i, (name, make) in enumerate(sorted(CONFIGS.items())):
        torch.manual_seed(i)
        hf = transformers.AutoModelForCausalLM.from_config(make(), dtype=torch.float32)
        with torch.no_grad():  # far from uniform logits, so greedy choices are separated
            for p in hf.parameters():
                p.mul_(10.0) if p.dim() > 1 else p.add_(0.1 * torch.randn_like(p))
        path = str(tmp_path_factory.mktemp(name))
        hf.save_pretrained(path)
        paths[name] = path
    return paths


def _check_model(path: str, ctx: ParallelContext) -> None:
    model, cfg = load_model(path, torch.float32, "cpu", ctx=ctx)
    ref, _ = load_model(path, torch.float32, "cpu")
    local_kv = kv_heads_per_rank(cfg, ctx.tp_size)
    # Actually sharded: this rank's attention heads and each expert's features.
    for layer in model.model.layers:
        attn = layer.self_attn.attn
        assert (attn.num_heads, attn.num_kv_heads) == (cfg.num_heads // ctx.tp_size, local_kv)
        if cfg.num_experts:
            assert len(layer.mlp.experts) == cfg.num_experts
            for expert in layer.mlp.experts:  # local weights: [2 * inter/2, h], [h, inter/2]
                assert expert.down_proj.in_local == cfg.moe_intermediate_size // ctx.tp_size
                assert sum(expert.gate_up_proj.local_sizes) == 2 * cfg.moe_intermediate_size // ctx.tp_size
    h = PoolHarness(model, dataclasses.replace(cfg, num_kv_heads=local_kv), max_requests=8)
    h_ref = PoolHarness(ref, cfg, max_requests=8)
    prompts = [[5, 9, 200, 17, 3], [44, 2, 7], list(range(10, 40))]
    got = h.extend([h.new_request() for _ in prompts], prompts, all_logits=True)
    want = h_ref.extend([h_ref.new_request() for _ in prompts], prompts, all_logits=True)
    assert rel_err(got, want) <= TOL, path
    assert h.greedy(prompts, 8, []) == h_ref.greedy(prompts, 8, []), path


def _rank_main(i: int, paths: dict[str, str], addr: str) -> None:
    child_setup()
    args = ServerArgs(model=paths["qwen3"], device="cpu", dtype="float32", tp_size=2,
                      dist_init_addr=addr, num_threads=1)
    ctx = init_tensor_parallel(args, i, torch.device("cpu"))
    try:
        for path in paths.values():
            _check_model(path, ctx)
    finally:
        torch.distributed.destroy_process_group()


def test_tp2_equals_tp1_for_each_family(models) -> None:
    spawn_ranks(_rank_main, lambda: (models, f"127.0.0.1:{free_port()}"), nprocs=2)
