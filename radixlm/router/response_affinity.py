"""Which worker holds a stored response (the Responses API's `store`): GET/DELETE
/v1/responses/{id} and a POST's `previous_response_id` must reach the worker whose
in-memory store (radixlm/server/responses/store.py) has that id.

Invariants: at most `capacity` ids, the least recently used forgotten first (as the
workers' own stores do); an id is learnt only from a worker's successful answer with
`store` true (a JSON body's `id`, or a stream's `response.created` event, found within
the stream's first SNIFF_LIMIT bytes); an id it does not know, or mapped to a worker no
longer registered, is looked for on the workers by the caller (router/responses.py).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Bytes of a stream searched for its `response.created` event (it is the first event).
SNIFF_LIMIT = 1 << 16


def stored_id(body: Any) -> str | None:
    """The id of a response object that the worker stored, else None."""
    if (isinstance(body, dict) and body.get("object") == "response"
            and body.get("store") is not False and isinstance(body.get("id"), str)):
        return body["id"]
    return None


@dataclass
class ResponseAffinity:
    capacity: int
    _owner: OrderedDict[str, str] = field(default_factory=OrderedDict)  # id -> worker URL

    def learn(self, response_id: str, url: str) -> None:
        if self.capacity <= 0:
            return
        self._owner[response_id] = url
        self._owner.move_to_end(response_id)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def worker_of(self, response_id: str) -> str | None:
        url = self._owner.get(response_id)
        if url is not None:
            self._owner.move_to_end(response_id)
        return url

    def forget(self, response_id: str) -> None:
        self._owner.pop(response_id, None)

    def __len__(self) -> int:
        return len(self._owner)

    # --- learning from answers ----------------------------------------------------

    def learn_from_body(self, url: str, content: bytes) -> None:
        """A non-streaming 200 from `url`: remember its stored response's id."""
        try:
            rid = stored_id(json.loads(content))
        except ValueError:
            return
        if rid is not None:
            self.learn(rid, url)

    def stream_sniffer(self, url: str) -> Callable[[bytes], None]:
        """A function fed the chunks of `url`'s 200 SSE stream, in order: it learns the id
        of the `response.created` event, then ignores the rest (O(1) per later chunk)."""
        state = {"buf": b"", "done": False}

        def feed(chunk: bytes) -> None:
            if state["done"]:
                return
            buf = state["buf"] + chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.decode("utf-8", "replace").splitlines():
                    if not line.startswith("data: "):
                        continue
                    try:
                        data = json.loads(line[6:])
                    except ValueError:
                        continue
                    if isinstance(data, dict) and data.get("type") == "response.created":
                        rid = stored_id(data.get("response"))
                        if rid is not None:
                            self.learn(rid, url)
                        state["done"] = True
                        return
            state["buf"] = buf
            state["done"] = len(buf) > SNIFF_LIMIT

        return feed
