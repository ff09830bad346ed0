"""The hierarchical cache's small parts: fingerprints differ in every field that changes
K/V bytes, the weights hash is cached, block keys chain (a key names its whole prefix),
a kept BlockKeyChain names blocks as a fresh hash does,
the hicache metrics render from PoolStats.hicache, the tier plan's lines."""

from __future__ import annotations

import dataclasses
import json

from radixlm.mem.kv_fingerprint import BlockKeyChain, KVFingerprint, block_keys, weights_sha256
from radixlm.messages import PoolStats
from radixlm.planning.tier_plan import TierPlan
from radixlm.server.metrics import EngineMetrics, Snapshot

FP = KVFingerprint(weights_sha256="a" * 64, kv_dtype="float32", num_layers=2, kv_heads=2,
                   head_dim=16, page_size=1, block_tokens=64, rope="{}", tp_rank=0, tp_size=1)


def test_every_field_changes_the_fingerprint():
    changed = dict(weights_sha256="b" * 64, kv_dtype="bfloat16", num_layers=3, kv_heads=1,
                   head_dim=32, page_size=4, block_tokens=128, rope='{"theta": 1}',
                   tp_rank=1, tp_size=2, format_version=2)
    assert set(changed) == {f.name for f in dataclasses.fields(KVFingerprint)}
    digests = {dataclasses.replace(FP, **{k: v}).digest() for k, v in changed.items()}
    assert len(digests) == len(changed) and FP.digest() not in digests


def test_block_keys_chain():
    fp = FP.digest()
    a = list(range(3, 3 + 200))
    b = [7] + a[1:]  # differs in the first block only
    ka, kb = block_keys(fp, a, 64), block_keys(fp, b, 64)
    assert len(ka) == 3  # whole blocks only
    assert all(x != y for x, y in zip(ka, kb))  # later blocks differ too: the chain
    assert block_keys(fp, a, 64, first=1, prev=ka[0]) == ka[1:]
    assert block_keys(fp, a[:128], 64) == ka[:2]
    assert block_keys(dataclasses.replace(FP, tp_rank=1).digest(), a, 64)[0] != ka[0]


def test_weights_hash_is_cached(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights" * 1000)
    h = weights_sha256(str(model), tmp_path / "cache")
    cached = json.loads((tmp_path / "cache" / "weights_sha256.json").read_text())
    assert list(cached.values()) == [h]
    # A cached entry is used as is (here: planted) while path, size and mtime stay.
    key = next(iter(cached))
    (tmp_path / "cache" / "weights_sha256.json").write_text(json.dumps({key: "planted"}))
    assert weights_sha256(str(model), tmp_path / "cache") == "planted"
    model.write_bytes(b"other!!" * 1000)  # new content: hashed again
    assert weights_sha256(str(model), tmp_path / "cache") not in ("planted", h)


def test_hicache_metrics_render():
    stats = {"hit_tokens_storage": 300, "blocks_demoted": 2, "blocks_written_through": 5,
             "blocks_written": 7, "blocks_loaded": 4, "loads": 2, "load_seconds": 0.5,
             "storage_bytes": 1234, "storage_capacity_bytes": 10**9,
             "storage_bad_files_deleted": 1, "hit_tokens_host": 128, "blocks_loaded_host": 2,
             "blocks_host_to_storage": 3, "host_bytes": 4096, "host_capacity_bytes": 8192}
    pool = PoolStats(rid="x", total_kv_slots=10, free_kv_slots=10, held_by_requests=0,
                     held_by_cache=0, running=0, waiting=0, free_req_rows=1,
                     cached_tokens_total=1000, hicache=stats)
    text = EngineMetrics("m").render(Snapshot(None, pool, 0, 0, 0, None)).decode()
    assert 'radixlm_hicache_storage_hit_tokens_total{model_name="m"} 300.0' in text
    assert 'radixlm_hicache_device_hit_tokens_total{model_name="m"} 572.0' in text
    assert 'radixlm_hicache_host_hit_tokens_total{model_name="m"} 128.0' in text
    assert 'radixlm_hicache_host_capacity_bytes{model_name="m"} 8192.0' in text
    assert 'radixlm_hicache_blocks_loaded_total{model_name="m"} 4.0' in text
    assert 'radixlm_hicache_storage_bytes{model_name="m"} 1234.0' in text
    off = dataclasses.replace(pool, hicache=None)
    assert "hicache" not in EngineMetrics("m").render(Snapshot(None, off, 0, 0, 0, None)).decode()


def test_tier_plan_lines():
    tp = TierPlan(kv_bytes_per_token=1000, storage_bytes=10**6)
    assert tp.storage_tokens == 1000 and tp.host_tokens == 0
    text = "\n".join(tp.lines(device_tokens=64))
    assert "1000 tokens" in text and "64 tokens" in text


def test_kept_key_chain_equals_a_fresh_hash():
    fp, b = FP.digest(), 4
    chain = BlockKeyChain(fp, b)
    toks = list(range(3, 21))  # 4 whole blocks and 2 tokens
    for tokens in (toks, toks, toks + [7] * 6, toks[:9], toks[:4] + [99] + toks[5:], []):
        assert chain.keys_of(tokens) == block_keys(fp, tokens, b), tokens

