"""LRU cache of compiled grammars, keyed by `Constraint.key`; failures are cached too, so
a client retrying an invalid grammar costs one compilation, not one each time.

Thread-safe: the compile threads fill it, the scheduler thread looks up hits.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CacheEntry:
    compiled: Any = None  # the backend's compiled grammar, or None when it failed
    error: str | None = None


class GrammarCache:
    def __init__(self, capacity: int = 512) -> None:
        if capacity < 1:
            raise ValueError(f"grammar cache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], CacheEntry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, str]) -> CacheEntry | None:
        """The entry (now most recently used), counting a hit or a miss."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: tuple[str, str], entry: CacheEntry) -> None:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
