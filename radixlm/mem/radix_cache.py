"""RadixCache: RadixAttention's prefix cache, a radix tree over token ids that owns KV slots.

Each edge of the tree is a run of token ids (`TreeNode.key`) together with the KV slots
holding their K/V (`TreeNode.value`, int64, same length). The path from the root to a node
spells a token prefix; the concatenated values along that path are the KV slots of that
prefix, so a new request whose prompt starts with a cached prefix skips computing it.

More: docs/memory.md, "mem/radix_cache.py".
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Iterable, Iterator

import torch

from radixlm.mem.invariant import check_pool_invariant
from radixlm.mem.kv_slot_allocator import KVSlotAllocator
from radixlm.mem.radix_tree_node import ChildKey, MatchResult, TreeNode
from radixlm.mem.req_to_token_pool import ReqToTokenPool

if TYPE_CHECKING:
    from radixlm.scheduler.req import Req

__all__ = ["ChildKey", "MatchResult", "RadixCache", "TreeNode"]


class RadixCache:
    """The prefix cache. See the module docstring for slot ownership and the freeing rule."""

    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: KVSlotAllocator,
                 page_size: int = 1, disable: bool = False) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if page_size % allocator.page_size:
            raise ValueError(f"the cache's page size ({page_size}) must be a multiple of the "
                             f"KV allocator's ({allocator.page_size}): nodes hold whole pages")
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self.device = allocator.device
        self._next_id = 0
        self._clock = 0
        self.evicted_tokens_total = 0  # freed by `evict` (the dashboard shows it)
        self._init_tree()

    # ------------------------------------------------------------------ small helpers

    def _init_tree(self) -> None:
        self.root = self._new_node([], self._empty(), None)
        # The root (empty key) is never evicted, never locked or unlocked by inc/dec_lock_ref
        # and never counted in the sizes; lock_ref=1 marks it as permanently pinned.
        self.root.lock_ref = 1
        self._evictable = 0
        self._protected = 0

    def _new_node(self, key: list[int], value: torch.Tensor, parent: TreeNode | None,
                  lock_ref: int = 0, last_access_time: float = 0.0) -> TreeNode:
        node = TreeNode(self._next_id, key, value, parent, {}, lock_ref, last_access_time)
        self._next_id += 1
        return node

    def _empty(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)

    def _tick(self) -> float:
        """Advance the LRU clock (one tick per operation; ties broken by node id)."""
        self._clock += 1
        return float(self._clock)

    def _page_align(self, n: int) -> int:
        return n - n % self.page_size

    def _child_key(self, key: list[int], pos: int = 0) -> ChildKey:
        """The dict key of the child whose edge starts at key[pos]."""
        if self.page_size == 1:
            return key[pos]
        return tuple(key[pos:pos + self.page_size])

    def _match_len(self, edge: list[int], key: list[int], pos: int, end: int) -> int:
        """How many leading tokens of `edge` equal key[pos:end], in whole pages."""
        n = min(len(edge), end - pos)
        if edge[:n] == key[pos:pos + n]:  # common case, compared in C
            return n
        i = 0
        while i < n and edge[i] == key[pos + i]:
            i += 1
        return self._page_align(i)  # a page matches only if all its tokens do

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child`'s edge after n tokens (0 < n < len, page-aligned); return the upper half.

        The upper node takes child's place under its parent and inherits its lock_ref and
        access time (every lock through `child` also goes through the upper half), so the
        evictable/protected sizes do not change.
        """
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key) and n % self.page_size == 0
        upper = self._new_node(child.key[:n], child.value[:n], parent, child.lock_ref,
                               child.last_access_time)
        parent.children[self._child_key(upper.key)] = upper  # same first token/page as child
        child.key = child.key[n:]
        child.value = child.value[n:]
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        return upper

    def _iter_nodes(self) -> Iterator[TreeNode]:
        """Every node except the root (iterative DFS)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ------------------------------------------------------------------ sizes

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes (freeable by `evict`)."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in nodes locked by at least one request."""
        return self._protected

    def total_size(self) -> int:
        """KV slots the tree holds (= evictable + protected)."""
        return self._evictable + self._protected

    @staticmethod
    def held_by_request(req: Req, page_size: int = 1) -> int:
        """KV slots owned by a running request: positions [cached_len, kv_len) of its row,
        with kv_len rounded up to the end of its last page (`page_size` = the allocator's:
        the request owns its partly filled last page whole; cached_len is page-aligned)."""
        if req.req_pool_idx is None:
            return 0
        end = -(-req.kv_len // page_size) * page_size  # ceil(kv_len / page) pages, in slots
        return end - req.cached_len

    # ------------------------------------------------------------------ match / insert

    def match_prefix(self, key: list[int]) -> MatchResult:
        """Longest cached prefix of `key` (cut to a page multiple).

        Mutates: splits the node in which the match ends, so that `last_node` ends exactly
        at the match; refreshes the access time of every node on the path. Frees nothing.
        The returned slots stay valid only until the next `evict`/`reset` unless the caller
        locks `last_node` (`inc_lock_ref`).
        """
        if self.disable:
            return MatchResult(self._empty(), self.root)
        end = self._page_align(len(key))
        now = self._tick()
        node = self.root
        node.last_access_time = now
        values: list[torch.Tensor] = []
        pos = 0  # key[:pos] is matched so far, ending exactly at the end of `node`
        while pos < end:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._match_len(child.key, key, pos, end)  # >= one page: first page matched
            pos += n
            if n < len(child.key):  # the match ends inside child: cut it there
                node = self._split(child, n)  # the lower half keeps its old access time
                node.last_access_time = now
                values.append(node.value)
                break
            child.last_access_time = now
            values.append(child.value)
            node = child
        indices = torch.cat(values) if values else self._empty()
        return MatchResult(indices, node)

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Insert `key` with KV slots `value` (int64, same length); return the cached prefix length.

        The key is cut to a page multiple (the unaligned tail is ignored). Returns
        `prefix_len`: how many leading tokens the tree already held. The tree keeps its own
        slots for those and takes ownership of `value[prefix_len:aligned_len]` (copied into
        a new leaf). Everything else of `value` stays the caller's to free:
        `value[aligned_len:]`, and `value[cached_len:prefix_len]` where `cached_len` is the
        length of the prefix the caller got from `match_prefix` (and kept locked) — those
        first `cached_len` slots ARE the tree's slots and must not be freed.
        Mutates: may split one node, adds at most one leaf (evictable), refreshes access
        times on the path.
        """
        if len(key) != value.numel():
            raise ValueError(f"insert: key has {len(key)} tokens but value {value.numel()} slots")
        if self.disable:
            return 0
        end = self._page_align(len(key))
        now = self._tick()
        node = self.root
        node.last_access_time = now
        pos = 0
        while pos < end:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._match_len(child.key, key, pos, end)
            pos += n
            if n < len(child.key):  # key ends or diverges inside child
                node = self._split(child, n)  # the lower half keeps its old access time
                node.last_access_time = now
                break
            child.last_access_time = now
            node = child
        if pos < end:
            # key[pos:end] is new: one leaf under `node`. Its first page differs from every
            # existing child of `node` (otherwise the loop would have descended).
            leaf = self._new_node(list(key[pos:end]), value[pos:end].to(torch.int64, copy=True),
                                  node, 0, now)
            node.children[self._child_key(leaf.key)] = leaf
            self._evictable += end - pos
        return pos

    # ------------------------------------------------------------------ locks

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock `node` and its ancestors against eviction (one lock per running request).

        Mutates lock_ref on the path node -> root; nodes going 0 -> 1 move from evictable to
        protected. Returns the change of `evictable_size()` (<= 0). Root: no-op.
        Raises RuntimeError for a node no longer in the tree (evicted since it was matched).
        """
        self._check_attached(node)
        delta = 0
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Release one lock taken by `inc_lock_ref(node)`; caller holds that lock.

        Mutates lock_ref on the path node -> root; nodes going 1 -> 0 move from protected to
        evictable. Returns the change of `evictable_size()` (>= 0). Root: no-op.
        """
        self._check_attached(node)
        if node is not self.root and node.lock_ref <= 0:
            # Locks cover whole paths, so lock_ref never decreases toward the root: checking
            # the start node is enough to refuse before mutating anything.
            raise RuntimeError(f"dec_lock_ref on unlocked node {node!r}")
        delta = 0
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
                delta += len(node.key)
            node = node.parent
        return delta

    def _check_attached(self, node: TreeNode) -> None:
        # Evicted nodes are detached (parent=None), and only leaves are evicted, so a node
        # with a parent has its whole path to the root in the tree.
        if node.parent is None and node is not self.root:
            raise RuntimeError(f"{node!r} is no longer in the radix tree (evicted or reset)")

    # ------------------------------------------------------------------ eviction

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots if possible, least recently used leaves first.

        Only unlocked leaves are evicted, each as a whole edge (so it may free a few more
        than asked); a parent left as an unlocked leaf becomes a candidate in turn. Frees
        the slots to the allocator in one call. Returns how many slots were freed (less
        than asked when the evictable part runs out). Slots from earlier unlocked matches
        become invalid.
        """
        if self.disable or num_tokens <= 0:
            return 0
        heap = [(n.last_access_time, n.id, n) for n in self._iter_nodes()
                if n.is_leaf and n.lock_ref == 0]
        heapq.heapify(heap)  # (time, unique id, node): never compares nodes
        freed = 0
        victims: list[torch.Tensor] = []
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            self._on_evict(node)  # its path to the root is still whole here
            victims.append(node.value)
            freed += len(node.key)
            del parent.children[self._child_key(node.key)]
            node.parent = None
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        self._evictable -= freed
        self.evicted_tokens_total += freed
        if victims:
            self.allocator.free(torch.cat(victims))
        return freed

    def _on_evict(self, node: TreeNode) -> None:
        """A leaf is about to be evicted (its slots still hold its K/V): a hook for the
        hierarchical cache (mem/hi_radix_cache.py), which demotes it instead of dropping."""

    def discard_from(self, key: list[int], from_len: int) -> int:
        """Drop the cached K/V of `key` from position `from_len` on (rounded down to a
        page): the unlocked nodes of key's path that start at or after it, deepest first,
        while they are leaves. Used when a failed forward left those positions garbage
        (scheduler/request_oom.py). A locked node, or one with other children, stays (and
        so do its ancestors). Returns how many slots were freed."""
        if self.disable:
            return 0
        start = from_len // self.page_size * self.page_size
        self.match_prefix(key[:start])  # splits the node that spans `start`
        path: list[tuple[int, TreeNode]] = []  # (start position, node) from the root down
        node, pos = self.root, 0
        end = self._page_align(len(key))
        while pos < end:
            child = node.children.get(self._child_key(key, pos))
            if child is None or self._match_len(child.key, key, pos, end) < len(child.key):
                break
            path.append((pos, child))
            pos += len(child.key)
            node = child
        victims: list[torch.Tensor] = []
        for node_start, node in reversed(path):
            if node_start < start or not node.is_leaf or node.lock_ref > 0:
                break
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key)]
            node.parent = None
            self._evictable -= len(node.key)
            victims.append(node.value)
        if victims:
            self.allocator.free(torch.cat(victims))
        return sum(v.numel() for v in victims)

    def reset(self) -> None:
        """Free every slot the tree holds and empty it (`POST /flush_cache`).

        Only legal when no request holds a lock (the scheduler is idle); raises
        RuntimeError otherwise and changes nothing.
        """
        if self._protected:
            raise RuntimeError(f"cannot reset the radix cache: {self._protected} tokens are "
                               "locked by running requests")
        nodes = list(self._iter_nodes())
        if nodes:
            self.allocator.free(torch.cat([n.value for n in nodes]))
        for node in nodes:  # detach, so stale references are refused by the lock methods
            node.parent = None
        self._init_tree()

    # ------------------------------------------------------------------ tiers below the device
    # The device pool is this cache's only tier; HiRadixCache (hi_radix_cache.py) overrides
    # these hooks with its host and storage tiers. The scheduler calls them unconditionally.

    @property
    def num_loading(self) -> int:
        """Requests waiting for their prefix to load from a lower tier."""
        return 0

    def start_load(self, req: Req, key: list[int], match: MatchResult,
                   kv_budget: int) -> int | None:
        """Load what of `key` continues `match` in a lower tier: the KV budget the load
        takes, or None when nothing is loaded (the request is admitted as usual)."""
        return None

    def poll_loads(self, timeout: float = 0.0) -> list[Req]:
        """Requests whose loads completed (waiting at most `timeout` s for one)."""
        return []

    def abort_loading(self, rid: str) -> bool:
        """Whether `rid` was loading (it is then answered when its load completes)."""
        return False

    def release_hold(self, req: Req) -> int:
        """Unlock what a completed load left locked for `req` until its admission; the
        change of `evictable_size()` (none here)."""
        return 0

    def release_holds(self) -> int:
        """Unlock every such hold; the change of `evictable_size()` (none here)."""
        return 0

    def clear_storage(self) -> int | None:
        """Delete the storage tier's blocks: how many, or None without a storage tier."""
        return None

    def close(self) -> None:
        """Stop the tiers' IO threads (none here)."""

    def tier_stats(self) -> dict[str, float] | None:
        """Counters and sizes of the tiers below the device (PoolStats.hicache); None."""
        return None

    # ------------------------------------------------------------------ request hooks

    def cache_finished_req(self, req: Req) -> None:
        """The request is done (finished, aborted or retracted): hand its KV to the tree.

        Inserts `fill_ids[:aligned_len]` with the slots of its row; frees the duplicates
        `[cached_len, new_prefix_len)` and the unaligned tail `[aligned_len, kv_len)`; frees
        the req_to_token row; releases the lock on `req.last_node`. Afterwards the request
        holds nothing: `req_pool_idx=None, kv_len=0, last_node=None, cached_len=0`.
        With `disable=True`: frees all its slots and the row. Caller holds the lock on
        `req.last_node` (taken at admission) and guarantees positions [0, kv_len) of the
        row hold computed K/V of `fill_ids[:kv_len]`.
        """
        row = req.req_pool_idx
        if row is None:  # never admitted: owns nothing
            req.kv_len, req.last_node, req.cached_len = 0, None, 0
            return
        kv_len = req.kv_len
        slots = self._row_slots(req)
        if self.disable:
            self.allocator.free(slots[req.cached_len:])
        else:
            aligned_len = self._page_align(kv_len)
            new_prefix_len = self.insert(req.fill_ids[:aligned_len], slots[:aligned_len])
            assert new_prefix_len >= req.cached_len, "locked prefix vanished from the tree"
            # [cached_len, new_prefix_len): duplicates of what the tree already had;
            # [aligned_len, kv_len): partial page the tree cannot hold.
            self.allocator.free(torch.cat([slots[req.cached_len:new_prefix_len],
                                           slots[aligned_len:]]))
            if req.last_node is not None:
                self.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(row)
        req.req_pool_idx = None
        req.kv_len = 0
        req.last_node = None
        req.cached_len = 0

    def cache_unfinished_req(self, req: Req) -> None:
        """Between prefill chunks: put the request's KV so far in the tree; it keeps running.

        Inserts `fill_ids[:aligned_len]`, frees the duplicates `[cached_len, new_prefix_len)`,
        rewrites those positions of the request's row to the tree's slots, moves the lock
        from `req.last_node` to the node ending at `aligned_len` and sets
        `req.cached_len = aligned_len`. The request keeps its row, its `kv_len` and the
        unaligned tail `[aligned_len, kv_len)`. No-op with `disable=True`.
        Caller holds the lock on `req.last_node` (if any).
        """
        row = req.req_pool_idx
        if self.disable or row is None:
            return
        slots = self._row_slots(req)
        aligned_len = self._page_align(req.kv_len)
        key = req.fill_ids[:aligned_len]
        new_prefix_len = self.insert(key, slots[:aligned_len])
        assert new_prefix_len >= req.cached_len, "locked prefix vanished from the tree"
        self.allocator.free(slots[req.cached_len:new_prefix_len])
        match = self.match_prefix(key)  # just inserted and nothing evicted since: full match
        assert match.prefix_len == aligned_len
        # Only [cached_len, new_prefix_len) changed owner's slot: [0, cached_len) already
        # held the tree's slots and the tree adopted [new_prefix_len, aligned_len) as is.
        self.req_to_token_pool.write(
            row, req.cached_len, match.device_indices[req.cached_len:new_prefix_len])
        self.inc_lock_ref(match.last_node)  # lock new before unlocking old: shared path stays
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        req.last_node = match.last_node
        req.cached_len = aligned_len

    def _row_slots(self, req: Req) -> torch.Tensor:
        """A fresh int64 copy of positions [0, kv_len) of the request's row."""
        if req.kv_len > req.seq_len:
            raise ValueError(f"req {req.rid}: kv_len {req.kv_len} > seq_len {req.seq_len}")
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx, :req.kv_len]
        return row.to(torch.int64, copy=True)

    # ------------------------------------------------------------------ checks / debug

    def check_invariant(self, running_reqs: Iterable[Req]) -> None:
        """Raise PoolInvariantError unless free + tree + running requests == total slots."""
        held = sum(self.held_by_request(r, self.allocator.page_size) for r in running_reqs)
        check_pool_invariant(self.allocator, held, self.total_size())

    def check_tree(self) -> None:
        """Raise AssertionError if the tree's structure or size counters are inconsistent.

        O(nodes); for tests and debugging.
        """
        evictable = protected = 0
        for node in self._iter_nodes():
            parent = node.parent
            assert parent is not None and parent.children.get(self._child_key(node.key)) is node
            assert len(node.key) > 0 and len(node.key) % self.page_size == 0, node
            assert node.value.numel() == len(node.key) and node.value.dtype == torch.int64, node
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values()), node
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert (evictable, protected) == (self._evictable, self._protected), (
            f"size counters {self._evictable}/{self._protected} != tree {evictable}/{protected}")

    def pretty_print(self) -> str:
        """The tree as a string of indented lines, one node each (for debugging)."""
        lines = [repr(self)]

        def walk(node: TreeNode, depth: int) -> None:
            for child in sorted(node.children.values(), key=lambda c: c.id):
                lines.append("  " * depth + repr(child))
                walk(child, depth + 1)

        walk(self.root, 1)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"RadixCache(page_size={self.page_size}, disable={self.disable}, "
                f"evictable={self._evictable}, protected={self._protected})")
