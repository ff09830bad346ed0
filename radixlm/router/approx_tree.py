"""ApproxRadixTree: what the router has sent to one worker, as a radix tree over text.

The router cannot see a worker's real RadixCache, so it keeps an approximation: every
request text routed to a worker is inserted into that worker's tree. A long match means
the worker probably still holds that prefix's KV. It is approximate on purpose: the worker
evicts on its own schedule, and text is not tokens.

Structure: each node owns `key`, the edge label from its parent (a non-empty string;
only the root has ""). `children` is keyed by the first character of each child's key,
so siblings never share a first character. `size` counts the characters stored, i.e. the
sum of `len(key)` over all nodes. Every node carries `last_access`, a logical clock
(a counter, not wall time: tests stay deterministic) bumped on the path of every insert
and match; eviction removes least recently used leaves first.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Node:
    key: str
    parent: "_Node | None"
    last_access: int = 0
    children: dict[str, "_Node"] = field(default_factory=dict)


def _common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix of a and b."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # fast path: one C-level comparison
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ApproxRadixTree:
    def __init__(self) -> None:
        self._root = _Node("", None)
        self._clock = itertools.count(1)
        self.size = 0  # characters stored: sum of len(node.key)

    def insert(self, text: str) -> None:
        """Add `text` (and so all its prefixes); touch its whole path."""
        now = next(self._clock)
        node = self._root
        node.last_access = now
        i = 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                leaf = _Node(text[i:], node, now)
                node.children[text[i]] = leaf
                self.size += len(leaf.key)
                return
            n = _common_prefix_len(child.key, text[i:])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node = child
            i += n

    def match(self, text: str, touch: bool = True) -> int:
        """Number of leading characters of `text` stored in the tree. With `touch`, the
        matched path counts as used now (LRU)."""
        now = next(self._clock) if touch else 0
        node = self._root
        if touch:
            node.last_access = now
        i = 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            n = _common_prefix_len(child.key, text[i:])
            if touch:
                child.last_access = now
            i += n
            if n < len(child.key):
                break
            node = child
        return i

    def evict(self, max_size: int) -> int:
        """Remove least recently used leaves until size <= max_size. Returns the number
        of characters removed. A leaf's whole edge goes at once, so size may end below
        max_size."""
        if self.size <= max_size:
            return 0
        removed = 0
        heap = [(leaf.last_access, id(leaf), leaf) for leaf in self._leaves()]
        heapq.heapify(heap)
        while heap and self.size > max_size:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.size -= len(leaf.key)
            removed += len(leaf.key)
            # The parent may have just become a leaf: it is next in line by its own age.
            if parent is not self._root and not parent.children:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return removed

    def _split(self, child: _Node, n: int) -> _Node:
        """Cut child's edge after n characters (0 < n < len(child.key)); return the new
        upper node, which keeps child's place under its parent. Size is unchanged."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        upper = _Node(child.key[:n], parent, child.last_access)
        parent.children[upper.key[0]] = upper
        child.key = child.key[n:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def _leaves(self) -> list[_Node]:
        out: list[_Node] = []
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out
