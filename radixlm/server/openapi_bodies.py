"""Request bodies in the OpenAPI schema (/openapi.json).

The generate handlers parse their JSON bodies themselves (`app.handle`: one error path
for malformed JSON and invalid fields), so FastAPI sees no body parameter and would
publish operations without a request body. `install_request_bodies` adds each route's
pydantic model to the schema, its nested models under `components/schemas`, so clients
and fuzzers (schemathesis, tests/e2e/test_api_fuzz.py) see what each endpoint takes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"

# The value ranges `SamplingParams.validate` enforces (it stays the one authority; the
# schema only publishes them, and tests/unit/test_openapi_bodies.py checks both agree at
# every bound), so clients and fuzzers know them. JSON Schema keywords per field name;
# they apply wherever the field appears (top level or native `sampling_params`).
SAMPLING_RANGES: dict[str, dict[str, float]] = {
    "temperature": {"minimum": 0},
    "top_p": {"exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"minimum": -1},
    "min_p": {"minimum": 0, "maximum": 1},
    "frequency_penalty": {"minimum": -2, "maximum": 2},
    "presence_penalty": {"minimum": -2, "maximum": 2},
    "repetition_penalty": {"exclusiveMinimum": 0, "maximum": 2},
    "seed": {"minimum": 0, "maximum": 2**63 - 1},
    "max_tokens": {"minimum": 0},
    "max_completion_tokens": {"minimum": 0},
    "max_new_tokens": {"minimum": 0},
}


# One valid body per request model, published as the media type's `example`: clients see
# a working request, and fuzzers (schemathesis's explicit phase) send it, so every
# generation endpoint is served at least once whatever random bodies they make.
BODY_EXAMPLES: dict[str, dict[str, Any]] = {
    "CompletionRequest": {"prompt": "Say hello", "max_tokens": 4, "temperature": 0},
    "ChatCompletionRequest": {"messages": [{"role": "user", "content": "Say hello"}],
                              "max_tokens": 4, "temperature": 0},
    "GenerateRequest": {"text": "Say hello",
                        "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
    "ResponsesRequest": {"input": "Say hello", "max_output_tokens": 4, "temperature": 0},
    "TokenizeRequest": {"prompt": "Say hello"},
    "DetokenizeRequest": {"tokens": [1, 2, 3]},
}


def _with_ranges(props: dict[str, Any]) -> None:
    """Add SAMPLING_RANGES to the numeric branch of each field's (nullable) schema."""
    for name, bounds in SAMPLING_RANGES.items():
        field = props.get(name)
        if field is None:
            continue
        for branch in field.get("anyOf", [field]):
            if branch.get("type") in ("integer", "number"):
                branch.update(bounds)


def install_request_bodies(app: FastAPI, bodies: dict[str, type[BaseModel]]) -> None:
    """`bodies`: POST path -> the model its handler parses."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for path, model in bodies.items():
            js = model.model_json_schema(ref_template=_REF)
            defs = js.pop("$defs", {})
            for d in (js, *defs.values()):
                _with_ranges(d.get("properties", {}))
            components.update(defs)
            components[model.__name__] = js
            op = schema["paths"][path]["post"]
            media: dict[str, Any] = {"schema": {"$ref": _REF.format(model=model.__name__)}}
            if model.__name__ in BODY_EXAMPLES:
                media["example"] = BODY_EXAMPLES[model.__name__]
            op["requestBody"] = {"required": True, "content": {"application/json": media}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
