"""TreeNode and MatchResult: the nodes of the RadixCache tree and the result of a lookup."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# A child is found by the first token of its edge (page_size == 1) or its first page.
ChildKey = int | tuple[int, ...]


@dataclass(slots=True, eq=False)
class TreeNode:
    """One edge of the radix tree: `key` token ids whose K/V live in slots `value`.

    `lock_ref` counts the locks (running requests) whose path goes through this node; a
    node with `lock_ref > 0` is protected from eviction. Identity equality (eq=False), so
    nodes can sit in sets and dicts.
    """

    id: int
    key: list[int]
    value: torch.Tensor  # int64 KV slots, value.numel() == len(key)
    parent: TreeNode | None = None
    children: dict[ChildKey, TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access_time: float = 0.0

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:  # no parent/children: they would recurse
        head = self.key[:6]
        more = "..." if len(self.key) > 6 else ""
        return (f"TreeNode(id={self.id}, len={len(self.key)}, key={head}{more}, "
                f"lock_ref={self.lock_ref}, t={self.last_access_time:g})")


@dataclass(slots=True)
class MatchResult:
    """The longest cached prefix of a key.

    `device_indices`: int64 KV slots of the matched tokens, in order. `last_node`: the node
    whose edge ends exactly at the end of the match (the root for an empty match); lock it
    with `inc_lock_ref` to keep the slots alive past the next `evict`.
    """

    device_indices: torch.Tensor
    last_node: TreeNode

    @property
    def prefix_len(self) -> int:
        return int(self.device_indices.numel())
