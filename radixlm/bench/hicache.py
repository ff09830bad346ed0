"""`radixlm bench hicache`: the hierarchical cache's three measurements in one run, in
process (the offline Engine): restart TTFT of a long shared system prompt with the storage
tier vs without; capacity (a device pool of N tokens, P distinct L-token prefixes each
revisited by R requests in a fixed random order) hit rate (cached / prompt tokens) and
throughput side by side: no tiers, the storage tier, host tier (host_ratio x N) over
storage, and no tiers with the device pool enlarged by the host tier's bytes (what the
same RAM buys as KV pool on the CPU backend); storage load bandwidth vs the disk's own
read bandwidth (`dd`, direct and through the page cache). Every size is a flag."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixlm.sampling_params import SamplingParams


@dataclass
class HiCacheBenchConfig:
    model: str | None = None
    system_len: int = 4000
    device_tokens: int = 8192
    num_prefixes: int = 16
    prefix_len: int = 2048
    requests_per_prefix: int = 32
    suffix_len: int = 16
    output_len: int = 8
    host_ratio: float = 2.0  # capacity: host tier = this x device_tokens (0: skip)
    storage_dir: str | None = None
    seed: int = 0
    parts: tuple[str, ...] = ("restart", "capacity", "bandwidth")


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def _engine(cfg: HiCacheBenchConfig, storage: Path | None, **kw: Any):
    from radixlm.engine import Engine

    if storage is not None:
        kw.update(enable_hierarchical_cache=True, hicache_storage_dir=str(storage),
                  hicache_storage_size="64GiB")
        kw.setdefault("hicache_ratio", 0.0)
    return Engine(model=cfg.model, **kw)


def run_restart(cfg: HiCacheBenchConfig, storage: Path) -> dict[str, Any]:
    """TTFT (a 1-token request) of a system prompt + question after a restart."""
    rng = random.Random(cfg.seed)
    system = _ids(rng, cfg.system_len)
    one = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
    warm = _engine(cfg, storage)
    warm.generate(system + _ids(rng, 24), one)
    warm.shutdown()  # writes reach the disk
    out: dict[str, Any] = {}
    for name, where in (("storage", storage), ("none", None)):
        eng = _engine(cfg, where)
        t0 = time.perf_counter()
        res = eng.generate(system + _ids(rng, 24), one)
        out[f"ttft_s_{name}"] = time.perf_counter() - t0
        out[f"cached_tokens_{name}"] = res["meta_info"]["cached_tokens"]
        if where is not None:
            out["load_stats"] = {k: eng.scheduler.tree_cache.tier_stats()[k]
                                 for k in ("blocks_loaded", "load_bytes", "load_seconds")}
        eng.shutdown()
        del eng
    out["speedup"] = out["ttft_s_none"] / out["ttft_s_storage"]
    return out


def capacity_prompts(cfg: HiCacheBenchConfig) -> list[list[int]]:
    """P prefixes of L tokens, each revisited by R requests (a distinct suffix each), in a
    random order fixed by the seed."""
    rng = random.Random(cfg.seed + 1)
    prefixes = [_ids(rng, cfg.prefix_len) for _ in range(cfg.num_prefixes)]
    order = [i for i in range(cfg.num_prefixes) for _ in range(cfg.requests_per_prefix)]
    rng.shuffle(order)
    return [prefixes[i] + _ids(rng, cfg.suffix_len) for i in order]


def capacity_ideal_hit_rate(cfg: HiCacheBenchConfig, block: int = 64) -> float:
    """The hit rate of a cache that never forgets: every request but a prefix's first
    reuses its whole blocks (the last prompt token is always computed)."""
    hit = (cfg.requests_per_prefix - 1) * (min(cfg.prefix_len, cfg.prefix_len + cfg.suffix_len
                                               - 1) // block * block)
    return hit / (cfg.requests_per_prefix * (cfg.prefix_len + cfg.suffix_len))


def run_capacity(cfg: HiCacheBenchConfig, storage: Path) -> dict[str, Any]:
    prompts = capacity_prompts(cfg)
    params = SamplingParams(max_new_tokens=cfg.output_len, temperature=0.0, ignore_eos=True)
    out: dict[str, Any] = {"requests": len(prompts), "ideal_hit_rate": capacity_ideal_hit_rate(cfg)}
    n = cfg.device_tokens
    runs: list[tuple[str, Path | None, dict[str, Any]]] = [
        ("none", None, dict(max_total_tokens=n)),
        ("storage", storage / "storage", dict(max_total_tokens=n))]
    if cfg.host_ratio > 0:
        runs += [("host", storage / "host", dict(max_total_tokens=n, hicache_ratio=cfg.host_ratio)),
                 ("bigger_device", None, dict(max_total_tokens=int(n * (1 + cfg.host_ratio))))]
    outputs = {}
    for name, where, kw in runs:
        eng = _engine(cfg, where, **kw)
        t0 = time.perf_counter()
        res = eng.generate(prompts, params)
        dt = time.perf_counter() - t0
        eng.check_invariant()
        outputs[name] = [r["output_ids"] for r in res]
        out[f"seconds_{name}"] = dt
        out[f"req_s_{name}"] = len(prompts) / dt
        out[f"hit_rate_{name}"] = eng.scheduler.cache_hit_rate
        if where is not None:
            st = eng.scheduler.tree_cache.tier_stats()
            out[f"load_stats_{name}"] = {
                k: st[k] for k in ("blocks_loaded", "blocks_loaded_host", "load_bytes",
                                   "load_seconds", "blocks_written", "hit_tokens_storage",
                                   "hit_tokens_host", "load_misses")}
        eng.shutdown()
        del eng
    out["load_stats"] = out["load_stats_storage"]
    out["outputs_equal"] = all(o == outputs["none"] for o in outputs.values())
    out["throughput_ratio"] = out["req_s_storage"] / out["req_s_none"]
    return out


def _dd_gbs(args: list[str]) -> float | None:
    """GB/s that dd reports (its last stderr line), or None."""
    try:
        r = subprocess.run(["dd", *args], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"([0-9.,]+) ([kMG])B/s", r.stderr)
    if m is None:
        return None
    return float(m.group(1).replace(",", ".")) * {"k": 1e-6, "M": 1e-3, "G": 1.0}[m.group(2)]


def run_bandwidth(cfg: HiCacheBenchConfig, storage: Path) -> dict[str, Any]:
    """Read every stored block back through the store (checksums included) vs dd."""
    from radixlm.mem.file_kv_store import FileKVStore

    dirs = [d for d in storage.iterdir() if d.is_dir() and any(d.glob("*.kv"))]
    out: dict[str, Any] = {}
    if dirs:
        d = max(dirs, key=lambda p: sum(f.stat().st_size for f in p.glob("*.kv")))
        files = sorted(d.glob("*.kv"))
        from radixlm.mem.file_kv_store import HEADER_BYTES
        block_bytes = files[0].stat().st_size - HEADER_BYTES
        # Read-only use of another run's directory: the lock is free once it shut down.
        store = FileKVStore(storage, bytes.fromhex(d.name), block_bytes, 1 << 62, 1)
        t0 = time.perf_counter()
        n = sum(store.get(bytes.fromhex(f.name[:32])) is not None for f in files)
        dt = time.perf_counter() - t0
        store.close()
        out["store_read_gbs"] = n * block_bytes / dt / 1e9
        out["store_blocks"] = n
    probe = storage / "dd_probe.bin"
    _dd_gbs(["if=/dev/zero", f"of={probe}", "bs=4M", "count=256", "conv=fsync"])
    out["dd_read_direct_gbs"] = _dd_gbs([f"if={probe}", "of=/dev/null", "bs=4M", "iflag=direct"])
    out["dd_read_cached_gbs"] = _dd_gbs([f"if={probe}", "of=/dev/null", "bs=4M"])
    probe.unlink(missing_ok=True)
    return out


def run_hicache_bench(cfg: HiCacheBenchConfig) -> dict[str, Any]:
    root = Path(cfg.storage_dir or tempfile.mkdtemp(prefix="radixlm-hicache-bench-"))
    record: dict[str, Any] = {"config": cfg.__dict__.copy()}
    try:
        if "restart" in cfg.parts:
            record["restart"] = run_restart(cfg, root / "restart")
        if "capacity" in cfg.parts:
            record["capacity"] = run_capacity(cfg, root / "capacity")
        if "bandwidth" in cfg.parts:
            if not (root / "capacity").exists() and not (root / "restart").exists():
                record["restart"] = run_restart(cfg, root / "restart")  # blocks to read back
            src = (root / "capacity" / "storage" if (root / "capacity").exists()
                   else root / "restart")
            record["bandwidth"] = run_bandwidth(cfg, src)
    finally:
        if cfg.storage_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return record


def hicache_table(record: dict[str, Any]) -> str:
    lines = []
    if (r := record.get("restart")) is not None:
        lines.append(f"restart TTFT, {record['config']['system_len']}-token system prompt: "
                     f"storage {r['ttft_s_storage']:.3f} s (cached {r['cached_tokens_storage']}) "
                     f"vs none {r['ttft_s_none']:.3f} s: {r['speedup']:.1f}x lower")
    if (c := record.get("capacity")) is not None:
        lines.append(f"capacity, {c['requests']} requests (a cache that never forgets: hit "
                     f"rate {c['ideal_hit_rate']:.1%}); outputs equal: {c['outputs_equal']}")
        for name in ("none", "storage", "host", "bigger_device"):
            if f"hit_rate_{name}" in c:
                lines.append(f"  {name:<14} hit rate {c[f'hit_rate_{name}']:6.1%}  "
                             f"{c[f'req_s_{name}']:7.2f} req/s  ({c[f'seconds_{name}']:.1f} s)")
        lines.append(f"  storage vs none: {c['throughput_ratio']:.2f}x throughput")
        ls = c["load_stats"]
        if ls["load_seconds"]:
            lines.append(f"  loads: {ls['blocks_loaded']} blocks, "
                         f"{ls['load_bytes'] / ls['load_seconds'] / 1e9:.2f} GB/s in the loader")
    if (b := record.get("bandwidth")) is not None:
        lines.append("bandwidth GB/s: store read (checksummed) "
                     + (f"{b['store_read_gbs']:.2f}" if "store_read_gbs" in b else "n/a")
                     + f", dd direct {b['dd_read_direct_gbs']}, dd cached {b['dd_read_cached_gbs']}")
    return "\n".join(lines)
