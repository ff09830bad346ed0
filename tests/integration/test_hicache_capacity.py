"""The capacity workload of `radixlm bench hicache --parts capacity`, scaled down on a tiny
random Llama: a device pool of 1024 tokens, 8 distinct 256-token prefixes, each revisited
by 4 requests in a fixed random order, all submitted at once. With the storage tier the
hit rate comes near that of a cache that never forgets (a load that does not fit the
admission budget now waits for room instead of computing the prefix in chunks: that
lost most hits); the greedy outputs equal those without tiers; the pool invariant holds
(the bench checks it after each run); a load is deferred only while KV held elsewhere
will come back. Known gap: a pool that holds about one request (512 here) still loses
hits (47% of an ideal 71%, 4 requests on each of 8 prefixes), with or without the lock
that now keeps a loaded prefix until its request is admitted (it saves some repeated
loads there, not hits): the cause is elsewhere (docs/memory.md)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from radixlm import SamplingParams
from radixlm.bench.hicache import HiCacheBenchConfig, run_capacity
from radixlm.engine import Engine
from radixlm.mem.hi_radix_cache import LoadDeferred
from tests.conftest import make_tiny_llama
from tests.engine_checks import assert_all_slots_back


@pytest.fixture(scope="module")
def wide_vocab_llama(tmp_path_factory) -> str:
    # The bench draws token ids from [100, 40000).
    return make_tiny_llama(str(tmp_path_factory.mktemp("tiny40k")), vocab_size=40960,
                           max_pos=1024)


def test_capacity_hit_rate_near_ideal(wide_vocab_llama, tmp_path):
    cfg = HiCacheBenchConfig(model=wide_vocab_llama, device_tokens=1024, num_prefixes=8,
                             prefix_len=256, requests_per_prefix=4, host_ratio=1.0)
    out = run_capacity(cfg, tmp_path)
    assert out["outputs_equal"]
    ideal = out["ideal_hit_rate"]  # 3 of 4 requests reuse 256 of 272 tokens: 70.6%
    assert ideal == pytest.approx(0.706, abs=1e-3)
    for tiers in ("storage", "host"):
        assert out[f"hit_rate_{tiers}"] >= 0.85 * ideal, out
        assert out[f"hit_rate_{tiers}"] > out["hit_rate_none"] + 0.15, out
    assert out["load_stats_host"]["blocks_loaded_host"] > 0


def test_load_waits_only_while_kv_comes_back(tiny_llama_dir, tmp_path):
    """A load that does not fit the budget is deferred only while KV held elsewhere will
    come back; with nothing held it is computed (waiting would never end)."""
    eng = Engine(model=tiny_llama_dir, max_total_tokens=512, enable_hierarchical_cache=True,
                 hicache_storage_dir=str(tmp_path))
    cache = eng.scheduler.tree_cache
    rng = random.Random(9)
    p = [rng.randrange(3, 256) for _ in range(200)]
    eng.generate(p, SamplingParams(max_new_tokens=2, temperature=0.0, ignore_eos=True))
    cache.io.drain()
    assert eng.scheduler.flush_cache().success  # the device tier empty, the files kept
    req = SimpleNamespace(rid="x", fill_ids=p, finished=False)
    match = cache.match_prefix(p[:199])
    assert match.prefix_len == 0
    assert cache.start_load(req, p[:199], match, kv_budget=0) is None  # nothing comes back
    held = cache.allocator.alloc(8)  # as a running request's KV
    with pytest.raises(LoadDeferred):
        cache.start_load(req, p[:199], match, kv_budget=0)
    assert cache.num_loading == 0
    delta = cache.start_load(req, p[:199], match, kv_budget=512)  # room: the load starts
    assert delta == -192 and cache.num_loading == 1
    assert [r.rid for r in cache.poll_loads(timeout=30.0)] == ["x"]
    cache.allocator.free(held)
    assert cache.match_prefix(p[:199]).prefix_len == 192
    assert cache.protected_size() == 192  # held for the request's admission
    assert cache.release_hold(req) == 192 and cache.protected_size() == 0
    assert_all_slots_back(eng)
    eng.shutdown()
