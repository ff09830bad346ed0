"""The hierarchical cache at its edges, on a tiny random Llama: a clean stop writes what
the device and host tiers hold (write_back, write_through_selective) so a restart finds it,
within the close bound; a prefix loaded back stays locked from the load until its
request's admission (an eviction meanwhile cannot take it), and the lock goes when the
request is admitted, aborted, or could never fit; a deferred load's retries reuse its
blocks' key chain instead of hashing the prompt again. Every test ends with every slot
back and no lock left (`assert_all_slots_back`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

import radixlm.mem.hi_radix_cache as hrc
import radixlm.mem.kv_fingerprint as kvf
from radixlm import SamplingParams
from radixlm.mem.hi_radix_cache import LoadDeferred
from tests.engine_checks import assert_all_slots_back
from tests.hicache_helpers import G, hi, one_by_one, prompts, want  # noqa: F401 (want: a fixture)


@pytest.mark.parametrize("kw", [dict(hicache_write_policy="write_back"),
                                dict(hicache_write_policy="write_back", hicache_ratio=2.0),
                                dict(hicache_write_policy="write_through_selective")],
                         ids=["write_back", "write_back_host", "selective"])
def test_clean_stop_writes_device_and_host_blocks(tiny_llama_dir, tmp_path, want, kw):
    # 4 x 206 tokens > the 512-slot pool: the first are demoted (to host with a host tier,
    # where write_back keeps them), the last stay on the device; each is seen once, so
    # neither write_back nor write_through_selective writes them at finish.
    ps = prompts(4, seed=31)
    eng = hi(tiny_llama_dir, tmp_path, **kw)
    first = one_by_one(eng, ps)
    eng.shutdown()
    eng2 = hi(tiny_llama_dir, tmp_path)  # a restart: storage only
    again = one_by_one(eng2, ps)
    assert [o["meta_info"]["cached_tokens"] for o in again] == [192] * 4
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in first] == want(ps)
    assert eng.scheduler.tree_cache.tier_stats()["blocks_flushed_at_close"] > 0
    assert_all_slots_back(eng2)
    eng2.shutdown()


def test_close_flush_is_bounded(tiny_llama_dir, tmp_path):
    p = prompts(1, seed=32)[0]
    eng = hi(tiny_llama_dir, tmp_path, hicache_write_policy="write_back")
    assert eng.scheduler.tree_cache.cfg.close_flush_seconds == hrc.CLOSE_FLUSH_SECONDS
    eng.generate(p, G)
    cache = eng.scheduler.tree_cache
    cache.cfg = dataclasses.replace(cache.cfg, close_flush_seconds=0.0)  # no time at all
    eng.shutdown()
    eng2 = hi(tiny_llama_dir, tmp_path)
    assert eng2.generate(p, G)["meta_info"]["cached_tokens"] == 0
    assert cache.tier_stats()["blocks_flushed_at_close"] == 0
    eng2.shutdown()


def _stored_then_flushed(model: str, storage, p: list[int], **kw):
    """An engine whose storage tier holds p's 3 whole blocks and whose device tier is empty."""
    eng = hi(model, storage, **kw)
    eng.generate(p, G)
    eng.scheduler.tree_cache.io.drain()
    assert eng.scheduler.flush_cache().success
    return eng


def test_loaded_prefix_is_locked_until_admission(tiny_llama_dir, tmp_path):
    p = prompts(1, seed=33)[0]
    eng = _stored_then_flushed(tiny_llama_dir, tmp_path, p)
    cache = eng.scheduler.tree_cache
    req = SimpleNamespace(rid="x", fill_ids=p, finished=False)
    match = cache.match_prefix(p[:205])
    assert cache.start_load(req, p[:205], match, kv_budget=512) == -192
    assert [r.rid for r in cache.poll_loads(timeout=30.0)] == ["x"]
    # Another request's allocation evicts everything evictable: the loaded prefix stays.
    cache.evict(512)
    assert cache.match_prefix(p[:205]).prefix_len == 192
    assert cache.protected_size() == 192 and cache.num_held == 1
    assert cache.release_hold(req) == 192  # admitted (or aborted): evictable again
    assert cache.protected_size() == 0 and cache.num_held == 0
    assert_all_slots_back(eng)
    eng.shutdown()


def _step_until(eng, cond, limit: int = 500) -> None:
    for _ in range(limit):
        if cond():
            return
        eng.step()
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("abort", [False, True], ids=["admitted", "aborted"])
def test_hold_across_refusals_then_admitted_or_aborted(tiny_llama_dir, tmp_path, want, abort):
    """One row (max_running_requests=1): B's prefix loads while A decodes, B is refused
    (no row) round after round and keeps its loaded prefix locked; then it is admitted
    with the whole hit, or aborted, and the lock goes either way."""
    p, other = prompts(2, seed=34)
    eng = _stored_then_flushed(tiny_llama_dir, tmp_path, p, max_running_requests=1)
    cache, sched = eng.scheduler.tree_cache, eng.scheduler
    a = eng.submit(other, SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True))
    _step_until(eng, lambda: bool(sched.running))
    b = eng.submit(p, G)
    _step_until(eng, lambda: cache.num_held == 1)
    for _ in range(3):  # refused for want of a row, the hold stays
        eng.step()
        assert cache.num_held == 1 and any(r.rid == b for r in sched.waiting)
    if abort:
        eng.abort(b)
        assert cache.num_held == 0
    eng.run_until_done([a, b])
    res = eng.pop_result(b)
    if abort:
        assert res["meta_info"]["finish_reason"] == "abort"
    else:
        assert res["meta_info"]["cached_tokens"] == 192
        assert res["output_ids"] == want([p])[0]
    assert cache.num_held == 0
    assert_all_slots_back(eng)
    eng.shutdown()


def test_holds_that_can_never_fit_are_released(tiny_llama_dir, tmp_path, want):
    """Two stored 256-token prefixes load back into a 512-slot pool at once and are held:
    neither request fits beside the other's hold and nothing runs that would give KV
    back; the holds go and both finish (no deadlock, no leak)."""
    rng_ps = prompts(2, seed=35, length=256)
    eng = hi(tiny_llama_dir, tmp_path)
    one_by_one(eng, rng_ps)
    cache = eng.scheduler.tree_cache
    cache.io.drain()
    assert eng.scheduler.flush_cache().success
    ps = [q + r for q, r in zip(rng_ps, prompts(2, seed=36, length=120))]
    out = eng.generate(ps, G)
    assert [o["output_ids"] for o in out] == want(ps)
    assert sum(o["meta_info"]["cached_tokens"] for o in out) >= 256
    assert cache.num_held == 0
    assert_all_slots_back(eng)
    eng.shutdown()


def test_deferred_load_keeps_its_key_chain(tiny_llama_dir, tmp_path, monkeypatch):
    p = prompts(1, seed=37)[0]
    eng = _stored_then_flushed(tiny_llama_dir, tmp_path, p)
    cache = eng.scheduler.tree_cache
    hashed: list[int] = []
    real = kvf.block_keys

    def counting(*args, **kw):
        out = real(*args, **kw)
        hashed.append(len(out))
        return out

    monkeypatch.setattr(kvf, "block_keys", counting)
    monkeypatch.setattr(hrc, "block_keys", counting)
    x = SimpleNamespace(rid="x", fill_ids=p, finished=False)
    y = SimpleNamespace(rid="y", fill_ids=p, finished=False)
    match = cache.match_prefix(p[:205])
    assert cache.start_load(x, p[:205], match, kv_budget=512) == -192
    hashed.clear()
    for _ in range(3):  # x is loading the same blocks: y waits, three rounds
        with pytest.raises(LoadDeferred):
            cache.start_load(y, p[:205], match, kv_budget=512)
    assert sum(hashed) == 3  # the 3 blocks hashed once, at the first try
    assert [r.rid for r in cache.poll_loads(timeout=30.0)] == ["x"]
    assert cache.release_hold(x) == 192
    # Now the device tier holds the blocks: y loads nothing, and its chain is forgotten.
    m = cache.match_prefix(p[:205])
    assert m.prefix_len == 192
    assert cache.start_load(y, p[:205], m, kv_budget=512) is None
    assert "y" not in cache._chains
    assert_all_slots_back(eng)
    eng.shutdown()
