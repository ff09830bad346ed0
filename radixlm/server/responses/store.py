"""The in-memory store of responses (`store: true`), for GET/DELETE /v1/responses/{id}
and `previous_response_id`.

Invariant: it holds at most `capacity` responses; storing one more forgets the least
recently used (a read counts as a use). Each entry keeps the response body and the
conversation as chat messages (its history, input and output) that a follow-up continues.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StoredResponse:
    body: dict[str, Any]
    messages: list[dict[str, Any]]  # the conversation so far, as chat messages


@dataclass
class ResponseStore:
    capacity: int
    _items: OrderedDict[str, StoredResponse] = field(default_factory=OrderedDict)

    def put(self, rid: str, item: StoredResponse) -> None:
        if self.capacity <= 0:
            return
        self._items[rid] = item
        self._items.move_to_end(rid)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, rid: str) -> StoredResponse | None:
        item = self._items.get(rid)
        if item is not None:
            self._items.move_to_end(rid)
        return item

    def delete(self, rid: str) -> bool:
        return self._items.pop(rid, None) is not None

    def __len__(self) -> int:
        return len(self._items)
