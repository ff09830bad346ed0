"""I-JSON integer bounds (constrained/ijson.py): an unbounded integer ends within 16
digits; bounds the schema gives and data values (enum, const) are left alone."""

from __future__ import annotations

import json

import pytest

from radixlm.constrained.ijson import IJSON_MAX_INT, bound_integers

pytest.importorskip("xgrammar")


def test_bound_integers_rewrites_only_unbounded_integer_schemas() -> None:
    schema = {"type": "object", "properties": {
        "a": {"type": "integer"},
        "b": {"type": ["integer", "null"], "minimum": 3},
        "c": {"type": "number"},
        "type": {"type": "integer", "exclusiveMaximum": 10},
        "d": {"enum": [{"type": "integer"}]},
        "e": {"type": "array", "items": {"type": "integer"}}}}
    out = bound_integers(schema)
    p = out["properties"]
    assert p["a"] == {"type": "integer", "minimum": -IJSON_MAX_INT, "maximum": IJSON_MAX_INT}
    assert p["b"] == {"type": ["integer", "null"], "minimum": 3, "maximum": IJSON_MAX_INT}
    assert p["c"] == {"type": "number"}
    assert p["type"] == {"type": "integer", "exclusiveMaximum": 10, "minimum": -IJSON_MAX_INT}
    assert p["d"] == {"enum": [{"type": "integer"}]}  # data, not a schema
    assert p["e"]["items"]["maximum"] == IJSON_MAX_INT
    assert list(p) == list(schema["properties"])  # generation order kept
    assert schema["properties"]["a"] == {"type": "integer"}  # the input is not mutated


def test_compiled_grammar_ends_an_unbounded_integer_at_16_digits() -> None:
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from radixlm.constrained.xgrammar_backend import parse_grammar

    g = parse_grammar("json_schema", json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
    assert accepts(g, '{"n": 9007199254740991}') and accepts(g, '{"n": -9007199254740991}')
    assert accepts(g, '{"n": 0}')
    assert not accepts(g, '{"n": 11111111111111111}')  # 17 digits: the number must end
    assert not accepts(g, '{"n": 9007199254740992}')  # past 2**53 - 1
