"""--tp-size 2 with the hierarchical cache's storage tier, over gloo on the CPU: each rank
writes its own files (the rank is in the KV fingerprint, so in the directory name); a
restart of both ranks on the same directory serves the same long prompts with storage
hits from the first request and exactly the greedy tokens of the first run; every rank's
pool invariant holds."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from radixlm.config import ServerArgs
from radixlm.messages import TokenizedGenerateReq
from radixlm.runtime.build import build_scheduler
from radixlm.runtime.distributed import free_port, init_tensor_parallel
from radixlm.runtime.scheduler_loop import run_loop
from radixlm.sampling_params import SamplingParams
from tests.conftest import make_tiny_llama
from tests.tp_harness import child_setup, drive_rank0, read_json, spawn_ranks, write_json

N_REQS = 3
PROMPT_LEN = 150  # 2 whole storage blocks of 64


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return make_tiny_llama(str(tmp_path_factory.mktemp("tp_hicache")), heads=4, kv_heads=2,
                           seed=1)


def _requests(vocab: int) -> list[TokenizedGenerateReq]:
    rng = random.Random(3)
    return [TokenizedGenerateReq(
        rid=f"r{i}", input_ids=[rng.randrange(3, vocab) for _ in range(PROMPT_LEN)],
        sampling_params=SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True))
        for i in range(N_REQS)]


def _rank_main(i: int, path: str, addr: str, storage: str, out_dir: str) -> None:
    child_setup()
    args = ServerArgs(model=path, device="cpu", dtype="float32", max_total_tokens=2048,
                      max_running_requests=4, chunked_prefill_size=128, log_level="warning",
                      num_threads=1, disable_overlap_schedule=True, tp_size=2,
                      dist_init_addr=addr, enable_hierarchical_cache=True,
                      hicache_storage_dir=storage)
    ctx = init_tensor_parallel(args, i, torch.device("cpu"))
    try:
        for run in ("first", "restart"):
            sched, _ = build_scheduler(args, ctx)
            if ctx.tp_rank == 0:
                out = drive_rank0(sched, ctx, _requests(sched.runner.vocab_size))
                st = sched.tree_cache.tier_stats()
                write_json(os.path.join(out_dir, f"{run}.json"),
                           {"outputs": out, "cached": sched.cached_tokens_total,
                            "storage_hits": st["hit_tokens_storage"]})
            else:
                run_loop(sched, ctx, None, None)
            assert not sched.has_work()
            sched.check_invariant()
            sched.shutdown()  # the writer drains: the files are on disk
            torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


def test_tp2_storage_tier_restart(model, tmp_path) -> None:
    storage, out = tmp_path / "storage", tmp_path / "out"
    out.mkdir()
    spawn_ranks(_rank_main, lambda: (model, f"127.0.0.1:{free_port()}", str(storage), str(out)),
                nprocs=2)
    first, again = read_json(out / "first.json"), read_json(out / "restart.json")
    assert first["cached"] == 0 and first["storage_hits"] == 0
    assert again["outputs"] == first["outputs"]
    assert len(again["outputs"]) == N_REQS and all(len(v) == 6 for v in again["outputs"].values())
    want = N_REQS * ((PROMPT_LEN - 1) // 64 * 64)
    assert again["cached"] == again["storage_hits"] == want
    # Each rank its own files: two fingerprint directories, the same blocks in each.
    dirs = [d for d in Path(storage).iterdir() if d.is_dir()]
    counts = sorted(len(list(d.glob("*.kv"))) for d in dirs)
    assert len(dirs) == 2 and counts[0] == counts[1] >= N_REQS * 2
