"""Validation of constraint specs, in the API process, before a request is sent.

Each check raises `ConstraintError` naming the request field:
  * a JSON schema must be a JSON object that is a valid schema (jsonschema's meta-schema
    check for its `$schema` draft, 2020-12 by default), use no keyword the backend
    would silently drop (`UNSUPPORTED_KEYWORDS`, probed against xgrammar 0.2.x: the
    grammar it builds ignores them, so the output could violate the schema), and
    convert to a grammar (e.g. every `$ref` resolves);
  * a regex, an EBNF grammar must parse in the backend's dialect;
  * a choice is a non-empty list of strings.
The backend's parse (`xgrammar.Grammar.from_*`) needs no tokenizer and takes
milliseconds; the token-mask compilation happens later, in the scheduler.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.constrained.constraint import ConstraintError

# Keywords xgrammar parses but does not enforce: rejected rather than ignored.
UNSUPPORTED_KEYWORDS = frozenset({
    "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "dependencies",
    "contains", "minContains", "maxContains", "patternProperties", "unevaluatedProperties",
    "unevaluatedItems", "$dynamicRef", "$recursiveRef",
})
# Keywords whose value is one subschema, a list of them, or a name -> subschema map.
_ONE = ("items", "additionalProperties", "additionalItems", "propertyNames", "not", "if",
        "then", "else", "contains", "unevaluatedItems", "unevaluatedProperties")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "$defs", "definitions", "dependentSchemas", "patternProperties")

MAX_SCHEMA_BYTES = 1 << 20
MAX_CHOICES = 4096


def warm_up() -> None:
    """Import the validators (xgrammar takes ~2 s) on a daemon thread, so the first
    constrained request does not stall the API process's event loop."""
    import threading

    def load() -> None:
        import jsonschema  # noqa: F401

        from radixlm.constrained import xgrammar_backend

        xgrammar_backend._xgr()

    threading.Thread(target=load, name="constraint-warm-up", daemon=True).start()


def parse_json_schema(value: Any, field: str) -> str:
    """The schema as JSON text (property order kept). `value`: a dict or its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"{field} is not valid JSON: {e}", field) from None
    if not isinstance(value, dict):
        raise ConstraintError(f"{field} must be a JSON object (a JSON schema), got "
                              f"{type(value).__name__}", field)
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > MAX_SCHEMA_BYTES:
        raise ConstraintError(f"{field} is larger than {MAX_SCHEMA_BYTES} bytes", field)
    _check_meta_schema(value, field)
    _check_keywords(value, field, "")
    _backend_parse("json_schema", text, field)
    return text


def _check_meta_schema(schema: dict[str, Any], field: str) -> None:
    import jsonschema
    from jsonschema.validators import validator_for

    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        at = f" at '{where}'" if where else ""
        raise ConstraintError(f"{field} is not a valid JSON schema{at}: {e.message}",
                              field) from None


def _check_keywords(schema: Any, field: str, path: str) -> None:
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        here = f"{path}/{key}"
        bad = key in UNSUPPORTED_KEYWORDS
        bad |= key == "uniqueItems" and value is True
        bad |= key == "allOf" and isinstance(value, list) and len(value) > 1
        # xgrammar drops the length bounds of a string that also has a pattern.
        bad |= key in ("minLength", "maxLength") and "pattern" in schema
        if bad:
            raise ConstraintError(
                f"{field}: the JSON schema keyword '{key}' (at '{here}') is not supported "
                "by the grammar backend; it would be silently ignored, so it is refused",
                field)
        if key in _MAP and isinstance(value, dict):
            for name, sub in value.items():
                _check_keywords(sub, field, f"{here}/{name}")
        elif key in _LIST and isinstance(value, list):
            for i, sub in enumerate(value):
                _check_keywords(sub, field, f"{here}/{i}")
        elif key in _ONE:
            _check_keywords(value, field, here)


def check_regex(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConstraintError(f"{field} must be a non-empty string (a regular expression)",
                              field)
    _backend_parse("regex", value, field)
    return value


def check_ebnf(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConstraintError(f"{field} must be a non-empty string (an EBNF grammar with a "
                              "'root' rule)", field)
    _backend_parse("ebnf", value, field)
    return value


def check_choice(value: Any, field: str) -> str:
    if (not isinstance(value, list) or not value or len(value) > MAX_CHOICES
            or not all(isinstance(c, str) and c for c in value)):
        raise ConstraintError(f"{field} must be a list of 1 to {MAX_CHOICES} non-empty "
                              "strings", field)
    return json.dumps(value, ensure_ascii=False)


def _backend_parse(kind: str, spec: str, field: str) -> None:
    from radixlm.constrained.xgrammar_backend import parse_grammar

    try:
        parse_grammar(kind, spec)
    except Exception as e:  # the backend's parse errors (RuntimeError with a position)
        raise ConstraintError(f"invalid {field}: {_clean(e)}", field) from None


def _clean(e: Exception) -> str:
    """xgrammar prefixes its messages with '[time] /path/file.cc:line: '."""
    msg = str(e).strip()
    if msg.startswith("[") and ": " in msg:
        msg = msg.split(": ", 1)[1]
    return msg.splitlines()[0] if msg else type(e).__name__
