"""Request dialects -> one Constraint, and the 400s (ConstraintError naming the field)."""

from __future__ import annotations

import json

import pytest

from radixlm.constrained.constraint import Constraint, ConstraintError
from radixlm.constrained.request_mapping import constraint_from_request
from radixlm.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
SPEC = json.dumps(SCHEMA)


@pytest.mark.parametrize("fields, kind, spec, field", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     "json_schema", SPEC, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_object"}}, "json_object", "", "response_format"),
    ({"json_schema": SCHEMA}, "json_schema", SPEC, "json_schema"),
    ({"json_schema": SPEC}, "json_schema", SPEC, "json_schema"),
    ({"regex": "[a-z]+"}, "regex", "[a-z]+", "regex"),
    ({"ebnf": 'root ::= "yes" | "no"'}, "ebnf", 'root ::= "yes" | "no"', "ebnf"),
    ({"structured_outputs": {"json": SCHEMA}}, "json_schema", SPEC, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a+"}}, "regex", "a+", "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["x", "y"]}}, "choice", '["x", "y"]',
     "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "ebnf", 'root ::= "a"',
     "structured_outputs.grammar"),
    ({"structured_outputs": {"json_object": True}}, "json_object", "",
     "structured_outputs.json_object"),
    ({"guided_json": SCHEMA}, "json_schema", SPEC, "guided_json"),
    ({"guided_regex": "a+"}, "regex", "a+", "guided_regex"),
    ({"guided_choice": ["x", "y"]}, "choice", '["x", "y"]', "guided_choice"),
    ({"guided_grammar": 'root ::= "a"', "guided_decoding_backend": "xgrammar"}, "ebnf",
     'root ::= "a"', "guided_grammar"),
])
def test_every_dialect_maps_to_one_constraint(fields, kind, spec, field) -> None:
    c = constraint_from_request(fields)
    assert c == Constraint(kind, spec, field)


def test_no_constraint() -> None:
    assert constraint_from_request({}) is None
    assert constraint_from_request({"response_format": {"type": "text"}}) is None
    assert constraint_from_request({"structured_outputs": {"json_object": False}}) is None


@pytest.mark.parametrize("fields, param, words", [
    ({"response_format": {"type": "json_object"}, "regex": "a"}, "regex", "at most one"),
    ({"json_schema": SCHEMA, "guided_json": SCHEMA}, "guided_json", "at most one"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice",
     "at most one"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "foo"}}}},
     "response_format.json_schema.schema", "not a valid JSON schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "required"),
    ({"response_format": {"type": "xml"}}, "response_format", "not supported"),
    ({"response_format": {"type": "structural_tag"}}, "response_format", "not supported"),
    ({"response_format": "json"}, "response_format", "object"),
    ({"json_schema": "{not json"}, "json_schema", "not valid JSON"),
    ({"json_schema": [1]}, "json_schema", "JSON object"),
    ({"json_schema": {"$ref": "#/$defs/missing"}}, "json_schema", "invalid"),
    ({"json_schema": {"type": "object", "not": {"required": ["a"]}}}, "json_schema", "'not'"),
    ({"json_schema": {"type": "array", "uniqueItems": True}}, "json_schema", "uniqueItems"),
    ({"json_schema": {"properties": {"x": {"if": {}, "then": {}}}}}, "json_schema", "'if'"),
    ({"json_schema": {"allOf": [{"type": "integer"}, {"minimum": 3}]}}, "json_schema", "allOf"),
    ({"json_schema": {"type": "object", "patternProperties": {"^x": {}}}}, "json_schema",
     "patternProperties"),
    ({"json_schema": {"type": "string", "pattern": "^a+$", "maxLength": 3}}, "json_schema",
     "maxLength"),
    ({"regex": "(("}, "regex", "parenthesis"),
    ({"regex": ""}, "regex", "non-empty"),
    ({"ebnf": "root ::= "}, "ebnf", "invalid ebnf"),
    ({"ebnf": 'other ::= "a"'}, "ebnf", "invalid ebnf"),
    ({"guided_choice": []}, "guided_choice", "list"),
    ({"guided_choice": ["a", 3]}, "guided_choice", "list"),
    ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend", "xgrammar"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "not supported"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern",
     "not supported"),
    ({"structured_outputs": {"jsn": SCHEMA}}, "structured_outputs.jsn", "not a known"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object", "boolean"),
])
def test_bad_constraints_name_the_field(fields, param, words) -> None:
    with pytest.raises(ConstraintError) as e:
        constraint_from_request(fields)
    assert e.value.param == param
    assert words in str(e.value)


def test_a_property_named_like_a_keyword_is_fine() -> None:
    schema = {"type": "object", "properties": {"not": {"type": "string"}, "if": {"type": "integer"}}}
    assert constraint_from_request({"json_schema": schema}).kind == "json_schema"


def test_request_models_carry_the_constraint() -> None:
    chat = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_object"}})
    assert chat.sampling_params(10).constraint == Constraint("json_object", "", "response_format")
    comp = CompletionRequest.model_validate({"prompt": "x", "guided_regex": "[0-9]+"})
    assert comp.sampling_params(10).constraint.kind == "regex"
    gen = GenerateRequest.model_validate({"text": "x", "sampling_params": {"json_schema": SPEC}})
    sp = gen.to_sampling_params(10)
    assert sp.constraint == Constraint("json_schema", SPEC, "sampling_params.json_schema")
    with pytest.raises(ConstraintError) as e:
        GenerateRequest.model_validate({"text": "x", "sampling_params": {
            "regex": "a", "ebnf": 'root ::= "a"'}}).to_sampling_params(10)
    assert e.value.param == "sampling_params.ebnf"
