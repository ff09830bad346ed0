"""--tp-size 2 over gloo on the CPU gives TP=1's results.

Two tiny random Llamas: 4 Q heads / 2 KV heads (KV heads split, one per rank) and 4 Q
heads / 1 KV head with a 255-token vocabulary (the KV head replicated on both ranks, the
vocabulary shards padded). Ranks are spawned processes (tests/tp_harness.py):

* model level: logits of a ragged prefill within 1e-5 (relative) of the unsharded model,
  greedy tokens through the KV pool exactly equal, the per-rank KV head count;
* scheduler level: the real loop (`scheduler_loop.run_loop`, rank 0 broadcasting its inputs,
  the overlap scheduler's forward thread running the collectives) produces exactly the
  greedy tokens of the TP=1 loop, with staggered arrivals and chunked prefill; every
  rank's pool invariant holds afterwards. Once as one host with two local ranks on the
  overlap loop, once as two "nodes" (nnodes=2, node_rank 0/1, one rank each) meeting at
  dist_init_addr on the serial loop (the CPU's default).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from radixlm.config import ServerArgs
from radixlm.runtime.distributed import free_port, init_tensor_parallel
from radixlm.planning.weight_estimate import kv_heads_per_rank
from radixlm.models import load_model
from radixlm.models.parallel_context import SINGLE, ParallelContext
from radixlm.runtime.build import build_scheduler
from radixlm.runtime.scheduler_loop import run_loop
from radixlm.runtime.tp_ranks import run_follower_rank
from tests.conftest import make_tiny_llama
from tests.conftest_models import PoolHarness, rel_err
from tests.tp_harness import (child_setup, drive_rank0, make_requests, read_json, spawn_ranks,
                              write_json)

TOL = 1e-5
N_REQS = 6


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("tp_models")
    return {"kv_split": make_tiny_llama(str(base / "kv2"), heads=4, kv_heads=2, seed=1),
            "kv_replicated": make_tiny_llama(str(base / "kv1"), heads=4, kv_heads=1,
                                             vocab_size=255, tie=True, seed=2)}


def _args(path: str, overlap: bool = True, **kw) -> ServerArgs:
    # num_threads=1: run_follower_rank sets the rank's threads from it (tp_harness: one
    # CPU thread per rank). Overlap: its forward thread runs the collectives; serial (the
    # CPU's default): the scheduler thread does.
    return ServerArgs(model=path, device="cpu", dtype="float32", max_total_tokens=2048,
                      max_running_requests=8, max_prefill_tokens=256, chunked_prefill_size=24,
                      log_level="warning", num_threads=1,
                      disable_overlap_schedule=not overlap, **kw)


def _check_model(path: str, ctx: ParallelContext) -> None:
    """Sharded model vs the whole model, in the same process, on the same prompts."""
    model, cfg = load_model(path, torch.float32, "cpu", ctx=ctx)
    ref, _ = load_model(path, torch.float32, "cpu")
    local_kv = kv_heads_per_rank(cfg, ctx.tp_size)
    assert model.model.layers[0].self_attn.attn.num_kv_heads == local_kv
    assert model.model.layers[0].self_attn.attn.num_heads == cfg.num_heads // ctx.tp_size
    h = PoolHarness(model, dataclasses.replace(cfg, num_kv_heads=local_kv), max_requests=8)
    h_ref = PoolHarness(ref, cfg, max_requests=8)
    prompts = [[5, 9, 200, 17, 3], [44, 2, 7], list(range(10, 40))]
    got = h.extend([h.new_request() for _ in prompts], prompts, all_logits=True)
    want = h_ref.extend([h_ref.new_request() for _ in prompts], prompts, all_logits=True)
    assert got.shape == want.shape == (sum(map(len, prompts)), cfg.vocab_size)
    assert rel_err(got, want) <= TOL
    assert h.greedy(prompts, 8, []) == h_ref.greedy(prompts, 8, [])


def _rank_main(i: int, paths: dict[str, str], addrs: list[str], out_dir: str) -> None:
    """Both placements in one pair of processes (a spawn costs seconds here): first one
    host with local ranks 0 and 1, then two hosts with one rank each."""
    child_setup()
    args = _args(paths["kv_split"], tp_size=2, dist_init_addr=addrs[0])
    ctx = init_tensor_parallel(args, i, torch.device("cpu"))
    try:
        for path in paths.values():
            _check_model(path, ctx)
        _serve(args, ctx, os.path.join(out_dir, "one_node.json"))
    finally:
        torch.distributed.destroy_process_group()
    args = _args(paths["kv_replicated"], overlap=False, tp_size=2, nnodes=2, node_rank=i,
                 dist_init_addr=addrs[1])
    assert args.disable_overlap_schedule
    if i > 0:
        run_follower_rank(args, 0)  # the production entry of a non-zero rank
        return
    ctx = init_tensor_parallel(args, 0, torch.device("cpu"))
    try:
        _serve(args, ctx, os.path.join(out_dir, "two_nodes.json"))
    finally:
        torch.distributed.destroy_process_group()


def _serve(args: ServerArgs, ctx: ParallelContext, out_path: str) -> None:
    """The scheduler loop on this rank; rank 0 writes the outputs to `out_path`."""
    sched, _ = build_scheduler(args, ctx)
    assert sched.overlap == (not args.disable_overlap_schedule)
    assert sched.runner.token_to_kv_pool.kv_heads == 1  # per rank: 2 split or 1 replicated
    if ctx.tp_rank == 0:
        write_json(out_path, drive_rank0(sched, ctx, make_requests(N_REQS, sched.runner.vocab_size)))
    else:
        run_loop(sched, ctx, None, None)
    assert not sched.has_work()
    sched.check_invariant()
    sched.shutdown()


def _tp1_outputs(path: str) -> dict[str, list[int]]:
    sched, _ = build_scheduler(_args(path))
    try:
        out = drive_rank0(sched, SINGLE, make_requests(N_REQS, sched.runner.vocab_size))
        assert not sched.has_work()
        sched.check_invariant()
        return out
    finally:
        sched.shutdown()


def test_tp2_equals_tp1(models, tmp_path) -> None:
    spawn_ranks(_rank_main, lambda: (
        models, [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"], str(tmp_path)),
        nprocs=2)
    for placement, model in (("one_node", "kv_split"), ("two_nodes", "kv_replicated")):
        got = read_json(os.path.join(tmp_path, f"{placement}.json"))
        want = _tp1_outputs(models[model])
        assert len(want) == N_REQS and all(len(v) == 10 for v in want.values())
        assert got == want, placement
