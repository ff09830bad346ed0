"""I-JSON (RFC 7493) integer bounds: an `integer` a schema leaves unbounded is limited to
what an IEEE 754 double holds exactly, [-(2**53 - 1), 2**53 - 1] (at most 16 digits).

Why: with an unbounded integer the grammar allows digits forever, and a small model that
starts repeating a digit writes until max_tokens (`1111...`); with the bound the grammar
forces the number to end, and every integer produced survives a JSON parser that reads
numbers as doubles (JavaScript's, RFC 7493 section 2.2). A bound the schema gives
(`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`) is kept as it is.
Applied where a JSON schema is compiled (`xgrammar_backend.py`), so validation in the API
process and generation agree; the cache key stays the schema as the client sent it.
Values (`enum`, `const`, `default`, `examples`) are data, never rewritten.
"""

from __future__ import annotations

import json
from typing import Any

IJSON_MAX_INT = 2 ** 53 - 1  # 9007199254740991: 16 digits
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


def _is_integer_type(t: Any) -> bool:
    return t == "integer" or (isinstance(t, list) and "integer" in t)


def bound_integers(schema: Any) -> Any:
    """A copy of `schema` with I-JSON bounds on every unbounded integer (both sides
    independently)."""
    if isinstance(schema, list):
        return [bound_integers(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in _DATA_KEYWORDS else bound_integers(v)) for k, v in schema.items()}
    if _is_integer_type(schema.get("type")):
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -IJSON_MAX_INT
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = IJSON_MAX_INT
    return out


def bound_integers_text(spec: str) -> str:
    """`bound_integers` over a schema's JSON text (key order kept: it is the generation
    order)."""
    return json.dumps(bound_integers(json.loads(spec)), ensure_ascii=False)
