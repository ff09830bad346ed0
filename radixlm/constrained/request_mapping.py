"""Request dialects -> one `Constraint`.

Accepted fields (any endpoint; `/generate` reads them from `sampling_params`):
  * OpenAI `response_format`: {"type": "text"} (no constraint), {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}};
  * SGLang: `regex`, `ebnf`, `json_schema` (a schema object or its JSON text);
  * vLLM: `structured_outputs` {json | regex | choice | grammar | json_object}, and the
    older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`
    (`guided_decoding_backend` may only name xgrammar / auto).
More than one constraint, an unknown `response_format` type or `structured_outputs` key,
or a feature we cannot honour (`whitespace_pattern`, `structural_tag`) is a
ConstraintError (HTTP 400) naming the field: never silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixlm.constrained.constraint import Constraint, ConstraintError
from radixlm.constrained.validate import check_choice, check_ebnf, check_regex, parse_json_schema

FIELDS = ("response_format", "regex", "ebnf", "json_schema", "structured_outputs",
          "guided_json", "guided_regex", "guided_choice", "guided_grammar",
          "guided_decoding_backend", "guided_whitespace_pattern")

# vLLM StructuredOutputsParams options that change nothing here.
_SO_NOOP = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties")
_BACKENDS = ("xgrammar", "auto", "")


def constraint_from_request(fields: Mapping[str, Any], prefix: str = "") -> Constraint | None:
    """The one Constraint of a request, validated; None when it has none. `fields`: the
    request's dialect fields (None = absent); `prefix` is prepended to field names in
    errors (e.g. "sampling_params.")."""
    found: list[Constraint] = []

    def add(kind: str, spec: str, field: str) -> None:
        found.append(Constraint(kind, spec, prefix + field))  # type: ignore[arg-type]

    def get(name: str) -> Any:
        return fields.get(name)

    rf = get("response_format")
    if rf is not None:
        c = _response_format(rf, prefix + "response_format")
        if c is not None:
            found.append(c)
    if get("regex") is not None:
        add("regex", check_regex(get("regex"), prefix + "regex"), "regex")
    if get("ebnf") is not None:
        add("ebnf", check_ebnf(get("ebnf"), prefix + "ebnf"), "ebnf")
    if get("json_schema") is not None:
        add("json_schema", parse_json_schema(get("json_schema"), prefix + "json_schema"),
            "json_schema")
    so = get("structured_outputs")
    if so is not None:
        found.extend(_structured_outputs(so, prefix + "structured_outputs"))
    if get("guided_json") is not None:
        add("json_schema", parse_json_schema(get("guided_json"), prefix + "guided_json"),
            "guided_json")
    if get("guided_regex") is not None:
        add("regex", check_regex(get("guided_regex"), prefix + "guided_regex"), "guided_regex")
    if get("guided_choice") is not None:
        add("choice", check_choice(get("guided_choice"), prefix + "guided_choice"),
            "guided_choice")
    if get("guided_grammar") is not None:
        add("ebnf", check_ebnf(get("guided_grammar"), prefix + "guided_grammar"),
            "guided_grammar")
    backend = get("guided_decoding_backend")
    if backend is not None and (not isinstance(backend, str) or backend not in _BACKENDS):
        raise ConstraintError(f"{prefix}guided_decoding_backend {backend!r} is not available "
                              "(this server constrains with xgrammar)",
                              prefix + "guided_decoding_backend")
    if get("guided_whitespace_pattern") is not None:
        raise ConstraintError(f"{prefix}guided_whitespace_pattern is not supported",
                              prefix + "guided_whitespace_pattern")
    if len(found) > 1:
        names = ", ".join(c.field for c in found)
        raise ConstraintError(f"at most one structured-output constraint may be given; got "
                              f"{names}", found[1].field)
    return found[0] if found else None


def _response_format(rf: Any, field: str) -> Constraint | None:
    if not isinstance(rf, dict):
        raise ConstraintError(f"{field} must be an object with a 'type'", field)
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object", "", field)
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise ConstraintError(f"{field}.json_schema must be an object with a 'schema'",
                                  f"{field}.json_schema")
        if js.get("schema") is None:
            raise ConstraintError(f"{field}.json_schema.schema is required",
                                  f"{field}.json_schema.schema")
        where = f"{field}.json_schema.schema"
        return Constraint("json_schema", parse_json_schema(js["schema"], where), where)
    if kind == "structural_tag":
        raise ConstraintError(f"{field} type 'structural_tag' is not supported", field)
    raise ConstraintError(f"{field} type {kind!r} is not supported (text, json_object, "
                          "json_schema)", field)


def _structured_outputs(so: Any, field: str) -> list[Constraint]:
    if not isinstance(so, dict):
        raise ConstraintError(f"{field} must be an object", field)
    out: list[Constraint] = []
    for key, value in so.items():
        where = f"{field}.{key}"
        if value is None or key in _SO_NOOP:
            continue
        if key == "json":
            out.append(Constraint("json_schema", parse_json_schema(value, where), where))
        elif key == "regex":
            out.append(Constraint("regex", check_regex(value, where), where))
        elif key == "choice":
            out.append(Constraint("choice", check_choice(value, where), where))
        elif key == "grammar":
            out.append(Constraint("ebnf", check_ebnf(value, where), where))
        elif key == "json_object":
            if value is not True and value is not False:
                raise ConstraintError(f"{where} must be a boolean", where)
            if value:
                out.append(Constraint("json_object", "", where))
        elif key in ("whitespace_pattern", "structural_tag"):
            raise ConstraintError(f"{where} is not supported", where)
        else:
            raise ConstraintError(f"{where} is not a known structured_outputs option", where)
    return out
