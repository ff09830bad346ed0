"""/openapi.json documents every status and content type the server answers with
(server/openapi_responses.py): checked by rule over every operation, not per path; the
bounded fuzz test (tests/e2e/test_api_fuzz.py) checks the live answers conform."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.server_fakes import fake_stack

GENERATION = {"/v1/completions", "/v1/chat/completions", "/generate", "/v1/responses"}


def test_every_operation_documents_its_errors_and_content_types() -> None:
    with fake_stack(context_len=256) as s, TestClient(s.app) as c:
        schema = c.get("/openapi.json").json()
        metrics = c.get("/metrics")
    assert "ErrorResponse" in schema["components"]["schemas"]
    bodies = 0
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            assert "422" not in responses, (method, path)  # validation errors answer 400
            assert {"500", "503"} <= responses.keys(), (method, path)
            for status, resp in responses.items():
                if int(status) >= 400:
                    ref = resp["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/ErrorResponse"), (method, path, status)
            if "requestBody" in op:
                assert {"400", "415"} <= responses.keys(), (method, path)
            if path in GENERATION:  # streamable generation requests
                bodies += 1
                assert {"400", "408", "429", "507"} <= responses.keys(), (method, path)
                assert responses["429"]["headers"]["Retry-After"]["required"]
                assert "text/event-stream" in responses["200"]["content"], (method, path)
            if path != "/health":
                assert "401" in responses, (method, path)  # behind --api-key
    assert bodies == len(GENERATION)
    assert "408" not in schema["paths"]["/tokenize"]["post"]["responses"]
    assert "401" not in schema["paths"]["/health"]["get"]["responses"]
    # /metrics answers the Prometheus text format, and says so.
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "text/plain" in schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
