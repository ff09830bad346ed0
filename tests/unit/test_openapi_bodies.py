"""/openapi.json publishes every generate endpoint's request body, and the value ranges
it states are exactly the ones the server enforces (SamplingParams.validate): the bound
itself is accepted, just beyond it is a 400."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from radixlm.server.openapi_bodies import SAMPLING_RANGES
from tests.server_fakes import fake_stack

EPS = {"integer": 1, "number": 1e-6}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with fake_stack(context_len=256) as s, TestClient(s.app) as c:
        yield c


def test_every_generate_route_has_a_body(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        body = schema["paths"][path]["post"]["requestBody"]
        ref = body["content"]["application/json"]["schema"]["$ref"]
        assert ref.split("/")[-1] in schema["components"]["schemas"]


def _completion_bounds(client: TestClient) -> dict[str, dict]:
    schema = client.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"]
    out = {}
    for name, field in schema["properties"].items():
        for branch in field.get("anyOf", [field]):
            if name in SAMPLING_RANGES and branch.get("type") in EPS:
                out[name] = branch
    return out


def test_published_ranges_are_the_enforced_ones(client: TestClient) -> None:
    bounds = _completion_bounds(client)
    assert {"temperature", "top_p", "seed", "max_tokens", "repetition_penalty"} <= set(bounds)
    for name, b in bounds.items():
        eps = EPS[b["type"]]
        cases = []
        if "minimum" in b:
            cases += [(b["minimum"], True), (b["minimum"] - eps, False)]
        if "maximum" in b:
            cases += [(b["maximum"], True), (b["maximum"] + eps, False)]
        if "exclusiveMinimum" in b:
            cases += [(b["exclusiveMinimum"], False), (b["exclusiveMinimum"] + eps, True)]
        for value, ok in cases:
            if b["type"] == "integer":
                value = int(value)
            body = {"prompt": "hello", "max_tokens": 1, name: value}
            if name == "max_tokens":
                body["max_tokens"] = value
            r = client.post("/v1/completions", json=body)
            assert (r.status_code == 200) == ok, (name, value, r.status_code, r.text[:200])


def test_every_body_example_is_served(client: TestClient) -> None:
    """The published example of each request body is a request the server serves."""
    schema = client.get("/openapi.json").json()
    seen = 0
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            media = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            if "example" in media:
                seen += 1
                r = client.request(method.upper(), path, json=media["example"])
                assert r.status_code == 200, (path, r.text)
    assert seen >= 3


def test_prompt_logprobs_is_published(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for model in ("CompletionRequest", "ChatCompletionRequest"):
        field = schemas[model]["properties"]["prompt_logprobs"]
        branch = next(b for b in field["anyOf"] if b.get("type") == "integer")
        assert (branch["minimum"], branch["maximum"]) == (0, 20)
        assert "prompt token" in field["description"]
