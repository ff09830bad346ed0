"""The hierarchical cache's host tier on the CPU backend (--hicache-ratio given: it is
off by default there): greedy outputs equal with the host tier on and off for prefixes
the device pool demoted to host memory and loaded back; the K/V bytes loaded equal those
stored; a small host tier under write_back hands its LRU blocks to the storage tier, and
they load back from there; /flush_cache empties device and host, the files stay; the pool
invariant holds throughout."""

from __future__ import annotations

import pytest
import torch

from radixlm.mem.kv_block_io import gather_blocks
from tests.engine_checks import assert_all_slots_back
from tests.hicache_helpers import G, hi, one_by_one, prompts, want  # noqa: F401 (want: a fixture)


def test_off_by_default_on_cpu(tiny_llama_dir, tmp_path):
    eng = hi(tiny_llama_dir, tmp_path)
    st = eng.scheduler.tree_cache.tier_stats()
    assert eng.scheduler.tree_cache.host is None and st["host_capacity_tokens"] == 0
    eng.shutdown()


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_demoted_to_host_load_back_equal(tiny_llama_dir, tmp_path, want, policy):
    ps = prompts(4, seed=11)  # 4 x 206 tokens > the 512-slot pool: the first are evicted
    eng = hi(tiny_llama_dir, tmp_path, hicache_ratio=2.0, hicache_write_policy=policy)
    cache = eng.scheduler.tree_cache
    assert cache.tier_stats()["host_capacity_tokens"] == 1024  # 2.0 x the 512-token pool
    first = one_by_one(eng, ps)
    again = one_by_one(eng, ps)
    assert [o["output_ids"] for o in first] == [o["output_ids"] for o in again] == want(ps)
    assert [o["meta_info"]["cached_tokens"] for o in again] == [192] * 4
    st = cache.tier_stats()
    assert st["blocks_loaded_host"] > 0 and st["hit_tokens_host"] > 0
    assert st["hit_tokens_storage"] == 0  # everything came back from host memory
    if policy == "write_back":  # nothing reached the disk: the host tier never let go
        cache.io.drain()
        assert cache.store.num_blocks() == 0 and st["blocks_written_through"] == 0
    # The K/V bytes now in the device pool equal those the host tier holds.
    p = ps[-1]
    m = cache.match_prefix(p[:192])
    on_device = gather_blocks(cache.kv_pool, m.device_indices, cache.block)
    held = torch.stack([cache.host.get(k) for k in cache._block_keys(p[:192])])
    assert torch.equal(on_device, held)
    # /flush_cache empties device and host; the next request loads nothing from host.
    assert eng.scheduler.flush_cache().success
    assert cache.host.num_blocks() == 0 and cache.total_size() == 0
    out = eng.generate(ps[0], G)
    assert out["output_ids"] == want([ps[0]])[0]
    assert cache.tier_stats()["blocks_loaded_host"] == st["blocks_loaded_host"]
    assert out["meta_info"]["cached_tokens"] == (192 if policy == "write_through" else 0)
    assert_all_slots_back(eng)
    eng.shutdown()


def test_small_host_tier_hands_lru_blocks_to_storage(tiny_llama_dir, tmp_path, want):
    ps = prompts(4, seed=12)
    # Host tier of 0.25 x 512 tokens = 2 blocks of 64: most demoted blocks go on to disk.
    eng = hi(tiny_llama_dir, tmp_path, hicache_ratio=0.25, hicache_write_policy="write_back")
    cache = eng.scheduler.tree_cache
    first = one_by_one(eng, ps)
    cache.io.drain()
    st = cache.tier_stats()
    assert st["host_blocks"] <= 2 and st["blocks_host_to_storage"] > 0
    assert cache.store.num_blocks() == st["blocks_host_to_storage"]
    again = one_by_one(eng, ps)
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in first] == want(ps)
    st = cache.tier_stats()
    assert st["hit_tokens_storage"] > 0 and st["blocks_loaded"] > st["blocks_loaded_host"]
    assert_all_slots_back(eng)
    eng.shutdown()
