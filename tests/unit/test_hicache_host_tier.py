"""The hierarchical cache's host tier in parts: HostKVStore's LRU bound hands its
evictions to the tier below; TieredKVStore routes puts by write policy (write_through:
host and storage; write_back: host, storage only when host lets go) and reads host
first; the host tier's size by flag and device (none by default on the CPU backend);
the memory plan's lines; the OOM advice says the host tier is RAM, not device memory."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from radixlm.mem.file_kv_store import FileKVStore
from radixlm.mem.host_kv_store import HostKVStore
from radixlm.mem.tiered_kv_store import TieredKVStore
from radixlm.models.hf_loader import load_hf_config
from radixlm.planning.device_memory import DeviceMemory
from radixlm.planning.oom import BatchShape, diagnose_kv_exhaustion, diagnose_oom
from radixlm.planning.planner import plan_memory
from radixlm.planning.tier_plan import TierPlan, host_tier_bytes
from radixlm.planning.units import GiB

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "configs")


def key(i: int) -> bytes:
    return bytes([i]) * 16


def block(i: int, n: int = 100) -> torch.Tensor:
    return torch.full((n,), i, dtype=torch.uint8)


def test_host_lru_hands_evictions_below():
    gone: list[tuple[bytes, torch.Tensor]] = []
    host = HostKVStore(100, 3 * 100 + 50, on_evict=lambda k, b: gone.append((k, b)))
    assert host.capacity_bytes == 300  # whole blocks
    for i in range(4):
        assert host.put(key(i), block(i))
        if i == 2:
            assert torch.equal(host.get(key(0)), block(0))  # 0 becomes most recent
    assert [k for k, _ in gone] == [key(1)] and torch.equal(gone[0][1], block(1))
    assert host.num_blocks() == 3 and host.size_bytes() == 300
    assert host.contains(key(0)) and not host.contains(key(1)) and host.get(key(1)) is None
    with pytest.raises(ValueError):
        host.put(key(9), block(9, 99))
    with pytest.raises(ValueError):
        HostKVStore(100, 99)


@pytest.mark.parametrize("write_through", [True, False])
def test_tiers_route_by_write_policy(tmp_path, write_through):
    storage = FileKVStore(tmp_path, bytes(16), 100, 10**6, 1)
    tiers = TieredKVStore(storage, HostKVStore(100, 200), write_through=write_through)
    tiers.put(key(0), block(0))
    assert tiers.host.contains(key(0)) and storage.contains(key(0)) == write_through
    assert tiers.get_tier(key(0))[1] == "host"
    tiers.put(key(1), block(1))
    tiers.put(key(2), block(2))  # the host tier lets 0 go: storage takes it (once)
    assert not tiers.host.contains(key(0)) and storage.contains(key(0))
    assert tiers.host_to_storage == (0 if write_through else 1)
    data, tier = tiers.get_tier(key(0))
    assert tier == "storage" and torch.equal(data, block(0))
    assert tiers.contains(key(1)) and tiers.num_blocks() == 2 + storage.num_blocks()
    tiers.clear_host()
    assert tiers.host.num_blocks() == 0 and storage.contains(key(0))
    tiers.clear()
    assert tiers.num_blocks() == 0 and not list(storage.dir.glob("*.kv"))
    tiers.close()


def test_host_tier_size_by_flag_and_device():
    kv = 10**6
    assert host_tier_bytes(0, None, kv, "cpu") == 0  # off by default on the CPU backend
    assert host_tier_bytes(0, None, kv, "cuda") == 2 * kv
    assert host_tier_bytes(0, 0.5, kv, "cpu") == kv // 2  # explicit: on
    assert host_tier_bytes(0, 0.0, kv, "cuda") == 0
    assert host_tier_bytes(3, 0.5, kv, "cpu") == 3 * 10**9  # GB overrides the ratio
    for bad in ((-1, None), (0, -0.5)):
        with pytest.raises(ValueError):
            host_tier_bytes(*bad, kv, "cpu")


def test_tier_plan_shows_the_host_tier():
    tp = TierPlan(kv_bytes_per_token=1000, storage_bytes=10**6, host_bytes=5 * 10**5,
                  pinned=True)
    assert tp.host_tokens == 500 and tp.as_dict()["host_bytes"] == 5 * 10**5
    text = "\n".join(tp.lines(device_tokens=64))
    assert "500 tokens" in text and "pinned host RAM, not device memory" in text
    assert "none" in TierPlan(1000, 10**6).lines(64)[1]


def _plan(kind: str, host: int):
    cfg = load_hf_config(os.path.join(FIXTURES, "llama-3-8b"))
    dev = DeviceMemory(kind, 80 * GiB, 64 * GiB, "test")
    p = plan_memory(cfg=cfg, weight_bytes=16 * GiB, device=dev, act_bytes=2, kv_bytes=2,
                    context_len=8192, chunked_prefill_size=8192, max_prefill_tokens=8192,
                    mem_fraction_static=0.99, max_running_requests=8)
    return dataclasses.replace(p, host_tier_bytes=host)


def test_oom_advice_knows_the_host_tier_is_ram():
    shape = BatchShape("prefill", [8192], [8192])
    err = torch.OutOfMemoryError("x")
    assert "host tier" not in diagnose_oom(_plan("cuda", 0), shape, err).message()
    cuda = diagnose_oom(_plan("cuda", 40 * GiB), shape, err)
    assert "host RAM, not device memory" in cuda.note and not any(
        "hicache" in f for f in cuda.fixes)
    assert cuda.note in cuda.message()
    cpu = diagnose_oom(_plan("cpu", 40 * GiB), shape, err)
    assert any("lower --hicache-ratio" in f for f in cpu.fixes) and not cpu.note
    kv = diagnose_kv_exhaustion(_plan("cuda", 40 * GiB), BatchShape("decode", [1] * 2,
                                                                     [8192] * 2))
    assert "never running requests' K/V" in kv.message()
