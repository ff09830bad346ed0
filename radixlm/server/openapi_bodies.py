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
            components.update(js.pop("$defs", {}))
            components[model.__name__] = js
            op = schema["paths"][path]["post"]
            op["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": _REF.format(model=model.__name__)}}}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
