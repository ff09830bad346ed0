"""SUFFIX drafter: the continuation of the request's tokens cached in the radix tree.

The request's tokens (prompt + output) are walked down the tree read-only (no split, no
access-time update); where they end, the draft follows the cached branch: at each branching
point the most recently used child (recency). So a request whose tokens so far equal the
start of another cached request (a regenerated or replayed conversation, an agent re-running
a step) drafts that request's output. It does not look up the tail of the request
mid-sequence (NGRAM does, inside the request). The walk costs one C-level list compare per
tree node on the path, not per token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.speculative.drafter import Draft

if TYPE_CHECKING:
    from radixlm.mem.radix_cache import RadixCache, TreeNode
    from radixlm.scheduler.req import Req


class SuffixDrafter:
    name = "SUFFIX"
    costly = False
    tracked: frozenset[str] = frozenset()  # no per-request state

    def __init__(self, tree_cache: "RadixCache") -> None:
        self.tree = tree_cache

    def forget(self, rid: str) -> None:
        pass  # no per-request state

    def propose(self, reqs: list["Req"], max_tokens: list[int]) -> list[Draft]:
        if self.tree.disable:
            return [Draft() for _ in reqs]
        return [self._one(r.fill_ids, k) if k > 0 else Draft() for r, k in zip(reqs, max_tokens)]

    def _child(self, node: "TreeNode", key: list[int], pos: int) -> "TreeNode | None":
        ps = self.tree.page_size
        ck = key[pos] if ps == 1 else tuple(key[pos:pos + ps])
        return node.children.get(ck)

    def _one(self, key: list[int], k: int) -> Draft:
        node, pos, n = self.tree.root, 0, len(key)
        ps = self.tree.page_size
        off = 0  # tokens of `node`'s edge matched (its whole edge unless the key ends inside)
        while pos < n:
            if n - pos < ps:  # a partial page: look for a child whose edge starts with it
                child = next((c for c in node.children.values()
                              if c.key[:n - pos] == key[pos:]), None)
            else:
                child = self._child(node, key, pos)
            if child is None:
                return Draft()
            m = min(len(child.key), n - pos)
            if child.key[:m] != key[pos:pos + m]:
                return Draft()
            node, pos, off = child, pos + m, m
        out = list(node.key[off:off + k])
        while len(out) < k and node.children:
            node = max(node.children.values(), key=lambda c: (c.last_access_time, c.id))
            out.extend(node.key[:k - len(out)])
        return Draft(out)
