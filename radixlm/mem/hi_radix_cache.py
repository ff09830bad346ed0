"""HiRadixCache: the radix cache over a device pool, an optional host tier and a storage
tier of files (`--enable-hierarchical-cache`).

Eviction demotes: an evicted leaf's whole blocks are queued for the tiers below (host if
any, else storage) before its slots are freed; host LRU evictions go to storage. Write
policy: write_back writes on eviction only; write_through also a finishing request's
blocks; write_through_selective only those of requests that hit the cache. A failed
request's poisoned positions are never written. `close` writes what device and host hold
and storage lacks (at most `close_flush_seconds`), so a restart finds it. A match that
continues below starts a LoadJob (`start_load`; a deferred one keeps its key chain for its
retries); `poll_loads` inserts the loaded blocks and hands the request back with them
locked (a hold) until admission, abort or `release_holds` (`release_hold`).
Invariant: free + tree + requests + slots of loads in flight == total; idle, no lock or
hold is left. More: docs/memory.md, "Hierarchical cache".
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass

import torch

from radixlm.mem.file_kv_store import FileKVStore
from radixlm.mem.host_kv_store import HostKVStore
from radixlm.mem.kv_block_io import BlockIO, LoadJob, gather_blocks
from radixlm.mem.kv_fingerprint import BlockKeyChain, KVFingerprint, block_keys
from radixlm.mem.kv_slot_allocator import KVSlotAllocator
from radixlm.mem.radix_cache import RadixCache
from radixlm.mem.radix_tree_node import MatchResult, TreeNode
from radixlm.mem.req_to_token_pool import ReqToTokenPool
from radixlm.mem.tiered_kv_store import TieredKVStore
from radixlm.mem.token_to_kv_pool import TokenToKVPool

logger = logging.getLogger(__name__)

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
DEFAULT_BLOCK_TOKENS = 64
# At close (server stop), at most this long writing device and host blocks to storage.
CLOSE_FLUSH_SECONDS = 30.0


def storage_block_tokens(page_size: int) -> int:
    """Tokens per storage file: DEFAULT_BLOCK_TOKENS rounded up to whole pages."""
    return -(-DEFAULT_BLOCK_TOKENS // page_size) * page_size


@dataclass(frozen=True)
class HiCacheConfig:
    storage_dir: str
    storage_bytes: int
    write_policy: str
    fingerprint: KVFingerprint
    sync_loads: bool = False  # wait for loads at the next poll (tensor parallel ranks)
    host_bytes: int = 0  # host tier (0: none)
    pin_host: bool = False  # pinned host memory (the device is CUDA)
    close_flush_seconds: float = CLOSE_FLUSH_SECONDS

    def __post_init__(self) -> None:
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"--hicache-write-policy must be one of {WRITE_POLICIES}, "
                             f"got {self.write_policy!r}")


class HiRadixCache(RadixCache):
    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: KVSlotAllocator,
                 kv_pool: TokenToKVPool, page_size: int, cfg: HiCacheConfig) -> None:
        super().__init__(req_to_token_pool, allocator, page_size=page_size)
        self.cfg = cfg
        self.kv_pool = kv_pool
        self.block = cfg.fingerprint.block_tokens
        if self.block % page_size:
            raise ValueError(f"storage block {self.block} is not a multiple of page {page_size}")
        self.fp = cfg.fingerprint.digest()
        self.token_bytes = TokenToKVPool.bytes_per_token(
            kv_pool.num_layers, kv_pool.kv_heads, kv_pool.head_dim, kv_pool.dtype)
        self.store = FileKVStore(cfg.storage_dir, self.fp, self.block * self.token_bytes,
                                 cfg.storage_bytes, cfg.fingerprint.format_version)
        block_bytes = self.block * self.token_bytes
        self.host = (HostKVStore(block_bytes, cfg.host_bytes, pin=cfg.pin_host)
                     if cfg.host_bytes >= block_bytes else None)
        self.tiers = TieredKVStore(self.store, self.host,
                                   write_through=cfg.write_policy != "write_back")
        self.io = BlockIO(self.tiers, kv_pool, self.block)
        self._loading: dict[str, LoadJob] = {}
        self._loading_keys: set[bytes] = set()
        self._loading_slots = 0
        self._held: dict[str, TreeNode] = {}  # rid -> loaded path locked until admission
        self._chains: dict[str, BlockKeyChain] = {}  # rid -> key chain of a deferred load
        self._closed = False
        self.counters = {"blocks_demoted": 0, "blocks_written_through": 0, "blocks_loaded": 0,
                         "blocks_flushed_at_close": 0,
                         "loads": 0, "load_seconds": 0.0, "hit_tokens_storage": 0,
                         "hit_tokens_host": 0, "blocks_loaded_host": 0, "load_misses": 0}

    # --- sizes ----------------------------------------------------------------------------

    def total_size(self) -> int:
        """Slots of the tree plus those of loads in flight (owned by the hicache)."""
        return super().total_size() + self._loading_slots

    @property
    def num_loading(self) -> int:
        return len(self._loading)

    # --- writes -----------------------------------------------------------------------------

    def _block_keys(self, tokens: list[int]) -> list[bytes]:
        """Storage keys of the whole blocks of `tokens`."""
        return block_keys(self.fp, tokens, self.block)

    def _write(self, tokens: list[int], slots: torch.Tensor, first_block: int) -> int:
        """Queue the whole blocks of `tokens` (their K/V in `slots`) from `first_block` on
        that the storage tier lacks; returns how many were queued."""
        keys = block_keys(self.fp, tokens, self.block)
        todo = [i for i in range(first_block, len(keys)) if not self.io.has(keys[i])]
        if not todo:
            return 0
        b = self.block
        idx = torch.cat([slots[i * b:(i + 1) * b] for i in todo])
        return self.io.write([keys[i] for i in todo], gather_blocks(self.kv_pool, idx, b))

    def _on_evict(self, node: TreeNode) -> None:
        path: list[TreeNode] = []
        n: TreeNode | None = node
        while n is not None and n is not self.root:
            path.append(n)
            n = n.parent
        path.reverse()
        tokens = [t for p in path for t in p.key]
        end = len(tokens)
        start = end - len(node.key)
        last = end // self.block
        if last <= start // self.block:
            return  # no whole block ends inside this node
        slots = torch.cat([p.value for p in path])
        self.counters["blocks_demoted"] += self._write(tokens[:last * self.block], slots,
                                                       start // self.block)

    def cache_finished_req(self, req) -> None:
        policy = self.cfg.write_policy
        if (req.req_pool_idx is not None and policy != "write_back"
                and (policy == "write_through" or req.cached_tokens > 0)):
            valid = min(req.kv_len, len(req.fill_ids))
            if req.kv_poisoned_from is not None:  # a failed forward's K/V is never written
                valid = min(valid, req.kv_poisoned_from)
            n = valid // self.block * self.block
            if n:
                slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, :n].to(torch.int64)
                self.counters["blocks_written_through"] += self._write(req.fill_ids[:n], slots, 0)
        super().cache_finished_req(req)

    # --- loads ------------------------------------------------------------------------------

    def start_load(self, req, key: list[int], match: MatchResult, kv_budget: int) -> int | None:
        """If a lower tier continues `match` of `key`, start loading those blocks for
        `req` and return the change of the admission KV budget (<= 0); the request then
        waits in the hicache until `poll_loads` returns it. None: no load (admit as is).
        Raises LoadDeferred (defer it) when another request is loading the same blocks, or
        when the blocks do not fit the budget now but KV held by requests or loads will come
        back (`_kv_comes_back`); the blocks' key chain is kept for the retry."""
        delta = self._start_load(req, key, match, kv_budget)  # LoadDeferred: chain kept
        self._chains.pop(req.rid, None)
        return delta

    def _keys_of(self, rid: str, tokens: list[int]) -> list[bytes]:
        chain = self._chains.get(rid)
        if chain is None:
            chain = self._chains[rid] = BlockKeyChain(self.fp, self.block)
        return chain.keys_of(tokens)

    def _start_load(self, req, key: list[int], match: MatchResult, kv_budget: int) -> int | None:
        b = self.block
        first, nblocks = match.prefix_len // b, len(key) // b
        if nblocks <= first or self.tiers.num_blocks() == 0 and not self.io.has_pending():
            return None
        keys = self._keys_of(req.rid, key[:nblocks * b])[first:]
        k = 0
        while k < len(keys) and self.io.has(keys[k]):
            k += 1
        if k == 0 or first * b + k * b <= match.prefix_len:
            return None
        if keys[0] in self._loading_keys:
            raise LoadDeferred
        need = k * b
        delta = self.inc_lock_ref(match.last_node)
        if kv_budget + delta < need:
            self.dec_lock_ref(match.last_node)
            if self._kv_comes_back():
                # Wait for the room: admitted now, the request would compute the prefix in
                # chunks the budget allows and every stored block would go to waste.
                raise LoadDeferred
            return None  # it never fits: compute the prefix instead
        short = need - self.allocator.available_size()
        if short > 0:
            self.evict(short)
        slots = self.allocator.alloc(need)
        if slots is None:
            self.dec_lock_ref(match.last_node)
            return None
        start = first * b
        job = LoadJob(req=req, keys=keys[:k], slots=slots, start=start,
                      device_prefix=match.prefix_len,
                      prefix_slots=match.device_indices[:start].clone(), node=match.last_node)
        self._loading[req.rid] = job
        self._loading_keys.update(job.keys)
        self._loading_slots += need
        self.io.load(job)
        return delta - need

    def _kv_comes_back(self) -> bool:
        """Requests or loads in flight hold KV slots (they return them when done)."""
        held = self.allocator.size - self.allocator.available_size() - self.total_size()
        return bool(self._loading) or held > 0

    def poll_loads(self, timeout: float = 0.0) -> list:
        """Finish the loads the loader completed (waiting up to `timeout` for the first;
        with sync_loads, for all): insert their blocks into the tree, unlock, free what
        was not loaded; return their requests."""
        out = []
        while self._loading:
            block = self.cfg.sync_loads or (timeout > 0 and not out)
            try:
                job = self.io.done.get(timeout=timeout if timeout > 0 else None) if block \
                    else self.io.done.get_nowait()
            except queue.Empty:
                break
            self._finish_load(job)
            out.append(job.req)
        return out

    def _finish_load(self, job: LoadJob) -> None:
        n = job.loaded * self.block
        self.allocator.free(job.slots[n:])
        end = job.start + n
        if n:
            had = self.insert(job.req.fill_ids[:end], torch.cat([job.prefix_slots, job.slots[:n]]))
            if had > job.start:  # computed by another request meanwhile: the tree keeps its own
                self.allocator.free(job.slots[:had - job.start])
            hit = max(0, end - max(had, job.device_prefix))
            host = min(hit, job.from_host * self.block)
            self.counters["hit_tokens_host"] += host
            self.counters["hit_tokens_storage"] += hit - host
        if job.loaded < len(job.keys):
            self.counters["load_misses"] += 1
        self.counters["blocks_loaded"] += job.loaded
        self.counters["blocks_loaded_host"] += job.from_host
        self.counters["loads"] += 1
        self.counters["load_seconds"] += job.seconds
        if not job.req.finished:  # the hold: the loaded path stays locked until admission
            node = self.match_prefix(job.req.fill_ids[:max(end, job.device_prefix)]).last_node
            self.inc_lock_ref(node)
            old = self._held.get(job.req.rid)
            self._held[job.req.rid] = node
            if old is not None:  # a second load for the same request: one hold
                self.dec_lock_ref(old)
        self.dec_lock_ref(job.node)
        self._loading_slots -= job.slots.numel()
        self._loading_keys.difference_update(job.keys)
        del self._loading[job.req.rid]

    def release_hold(self, req) -> int:
        """Unlock the path a load left locked for `req` (admitted: its own lock now covers
        it; aborted, or it can never fit with the hold); returns the change of
        `evictable_size()` (>= 0). Also forgets a deferred load's key chain."""
        self._chains.pop(req.rid, None)
        node = self._held.pop(req.rid, None)
        return self.dec_lock_ref(node) if node is not None else 0

    def release_holds(self) -> int:
        """Unlock every held path (the KV is needed elsewhere); returns the change of
        `evictable_size()`."""
        return sum(self.dec_lock_ref(self._held.pop(rid)) for rid in list(self._held))

    @property
    def num_held(self) -> int:
        return len(self._held)

    def abort_loading(self, rid: str) -> bool:
        """Mark a loading request aborted (answered when its load completes)."""
        job = self._loading.get(rid)
        if job is None:
            return False
        job.req.finish("abort")
        return True

    # --- flush, close, stats ----------------------------------------------------------------

    def reset(self) -> None:
        """Empty the device and host tiers (`/flush_cache`); the files stay."""
        super().reset()
        self.io.drain()
        self.tiers.clear_host()

    def clear_storage(self) -> int:
        """Delete every stored block of this configuration; returns how many."""
        self.io.drain()
        n = self.store.num_blocks()
        self.tiers.clear()
        return n

    def close(self) -> None:
        """Stop the IO threads; first write what the device tree and the host tier hold
        and storage lacks (at most `close_flush_seconds`): under write_back most blocks
        are still there, under write_through_selective those of prefixes seen once. Like
        an eviction of everything, this writes every whole block (the selective filter
        applies to write-through at finish time, not to demotion)."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self.cfg.close_flush_seconds
        self.io.drain(timeout=self.cfg.close_flush_seconds)
        try:
            self.counters["blocks_flushed_at_close"] += self._flush_to_storage(deadline)
        except Exception:  # a failed flush loses hits after a restart, never the stop
            logger.exception("hicache flush at close")
        self.io.close()
        self.tiers.close()

    def _flush_to_storage(self, deadline: float) -> int:
        """Write the whole blocks of the device tree, then those of the host tier, that
        the storage tier lacks, on this thread, until `deadline`; returns how many."""
        written, b = 0, self.block
        # (node, tokens above it, their slots, the keys of their whole blocks)
        stack: list[tuple[TreeNode, list[int], torch.Tensor, list[bytes]]] = [
            (c, [], self._empty(), []) for c in self.root.children.values()]
        while stack and time.monotonic() < deadline:
            node, above, above_slots, keys = stack.pop()
            tokens, slots = above + node.key, torch.cat([above_slots, node.value])
            first, last = len(keys), len(tokens) // b
            if last > first:
                keys = keys + block_keys(self.fp, tokens[:last * b], b, first=first,
                                         prev=keys[-1] if keys else None)
                for i in range(first, last):
                    if time.monotonic() >= deadline:
                        break
                    if not self.store.contains(keys[i]):
                        data = gather_blocks(self.kv_pool, slots[i * b:(i + 1) * b], b)[0]
                        written += self.store.put(keys[i], data)
            stack.extend((c, tokens, slots, keys) for c in node.children.values())
        if self.host is not None:
            written += self.host.flush_to(self.store, deadline)
        if stack or time.monotonic() >= deadline:
            logger.warning("hicache: close flush stopped after %.0f s (%d blocks written)",
                           self.cfg.close_flush_seconds, written)
        return written

    def tier_stats(self) -> dict[str, float]:
        c = self.counters
        return {**c, "write_policy": self.cfg.write_policy, "block_tokens": self.block,
                "blocks_written": self.io.written, "blocks_write_dropped": self.io.dropped,
                "storage_bytes": self.store.size_bytes(), "storage_blocks": self.store.num_blocks(),
                "storage_tokens": self.store.num_blocks() * self.block,
                "storage_capacity_bytes": self.store.capacity_bytes,
                "storage_capacity_tokens": self.store.capacity_bytes // self.token_bytes,
                "host_capacity_bytes": (hb := self.host.capacity_bytes if self.host else 0),
                "host_capacity_tokens": hb // self.token_bytes,
                "host_bytes": self.host.size_bytes() if self.host else 0,
                "host_blocks": self.host.num_blocks() if self.host else 0,
                "blocks_host_to_storage": self.tiers.host_to_storage,
                "held": len(self._held),
                "storage_bad_files_deleted": self.store.deleted_bad,
                "load_bytes": c["blocks_loaded"] * self.store.block_bytes,
                "loading": len(self._loading), "storage_dir": str(self.store.dir)}


class LoadDeferred(Exception):
    """Admit the request later: the blocks it would load are being loaded for another
    request, or they do not fit the budget now but KV held elsewhere will come back."""
