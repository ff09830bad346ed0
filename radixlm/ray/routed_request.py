"""One HTTP request as the Ray Serve ingress hands it to a replica: parsed once, routed by
the text the cache-aware policy reads.

`RoutedRequest.prompt` is the routing text (router/request_text.py: the prompt, the chat
messages rendered in order, or token ids written out; the path if none), so radixlm's request router and
Ray's `PrefixCacheAffinityRouter` (which reads a `prompt` attribute) route on the same
string. The body travels as the client sent it; the replica's engine validates it and
answers bad input with its own 4xx. No Ray import here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from radixlm.router.request_text import routing_text

# Request headers passed on to the engine; hop-by-hop and length headers are not.
FORWARDED_HEADERS = ("authorization", "content-type", "accept", "x-request-id")
# Response headers passed back to the client.
RETURNED_HEADERS = ("content-type", "retry-after", "x-request-id")
REPLICA_HEADER = "x-radixlm-replica"  # added to every response: the replica that served it


@dataclass(frozen=True)
class RoutedRequest:
    method: str
    path: str  # with the query string, e.g. "/v1/models"
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    prompt: str = ""  # the routing text
    stream: bool = False  # the client asked for server-sent events


def routed_request(method: str, path: str, query: str, body: bytes,
                   headers: dict[str, str]) -> RoutedRequest:
    """Parse `body` once (JSON; anything else routes by "") into a RoutedRequest."""
    parsed = None
    if body:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
    kept = {k: v for k, v in ((k.lower(), v) for k, v in headers.items())
            if k in FORWARDED_HEADERS}
    stream = isinstance(parsed, dict) and parsed.get("stream") is True
    # No prompt (GET /v1/models, a malformed body): route by the path. Never "": Ray's
    # PrefixCacheAffinityRouter divides by the text's length (ray 2.60).
    text = routing_text(path, parsed) or path
    return RoutedRequest(method.upper(), path + (f"?{query}" if query else ""), body, kept,
                         text, stream)
