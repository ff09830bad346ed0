"""Fuzz a running server's HTTP API from its own OpenAPI schema with schemathesis.

Every operation of /openapi.json gets `max_examples` generated requests in each mode
(positive: fits the schema; negative: violates it). Each response must be:
  * never a 5xx;
  * a 4xx: a JSON OpenAI-style error body, {"error": {"message", "type", "code"}} with
    code equal to the status;
  * a 2xx stream (text/event-stream): `data:` events of JSON ending with [DONE] (the
    Responses API's: with `response.completed` or `response.incomplete`, as OpenAI's
    carry no [DONE]), no error event with a 5xx code;
  * a 2xx for a negative (schema-violating) request: counted as "accepted_negative",
    a finding to look at, not a failure (the schema cannot state every rule, e.g. a
    union of strict types);
  * conformant to the schema (schemathesis's checks, CONFORMANCE): its status is one the
    operation documents, with a documented content type, the documented headers and a
    body that fits the documented schema.
Statuses are counted per operation too (`by_operation`), so a caller can require that
every operation was served (2xx) at least once, not just some GET.
Failures are collected, not raised inside hypothesis, so a run finishes and reports all.
Used by tests/e2e/test_api_fuzz.py (bounded) and scripts/fuzz_api.py (long).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, response_headers_conformance,
                                 response_schema_conformance, status_code_conformance)

CONFORMANCE = [status_code_conformance, content_type_conformance,
               response_headers_conformance, response_schema_conformance]


@dataclass
class FuzzReport:
    calls: int = 0
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    by_operation: dict[str, Counter] = field(default_factory=dict)  # "POST /path" -> statuses
    accepted_negative: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.calls} calls, statuses {dict(sorted(self.statuses.items()))}, "
                f"{len(self.failures)} failures, {len(self.accepted_negative)} negative "
                "requests accepted")


def check_response(status: int, content_type: str, body: bytes) -> str | None:
    """Why a response breaks the rules above, or None."""
    if status >= 500:
        return f"server error {status}: {body[:300]!r}"
    if 400 <= status < 500:
        try:
            err = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            return f"{status} without an OpenAI-style error body: {body[:300]!r}"
        if not (isinstance(err.get("message"), str) and isinstance(err.get("type"), str)
                and err.get("code") == status):
            return f"{status} with a malformed error body: {err!r}"
        return None
    if content_type.startswith("text/event-stream"):
        events = [line[5:].strip() for line in body.decode("utf-8", "replace").split("\n")
                  if line.startswith("data:")]
        if events and events[-1] == "[DONE]":
            events = events[:-1]
        elif not (events and _ends_a_response(events[-1])):
            return f"stream does not end with [DONE] or response.completed: {body[-300:]!r}"
        for e in events:
            try:
                obj = json.loads(e)
            except ValueError:
                return f"stream event is not JSON: {e[:300]!r}"
            code = obj.get("error", {}).get("code") if isinstance(obj, dict) else None
            if isinstance(code, int) and code >= 500:
                return f"stream error event {code}: {e[:300]!r}"
    return None


def _ends_a_response(event: str) -> bool:
    """The Responses API's last event: the response done, whole or cut by a limit, or
    failed for a reason of the request's own (e.g. its `timeout`), not the server's."""
    try:
        obj = json.loads(event)
    except ValueError:
        return False
    if not isinstance(obj, dict):
        return False
    if obj.get("type") == "response.failed":
        return (obj.get("response") or {}).get("error", {}).get("code") != "server_error"
    return obj.get("type") in ("response.completed", "response.incomplete")


def fuzz(base_url: str, max_examples: int, *, headers: dict[str, str] | None = None,
         modes: tuple[str, ...] = ("positive", "negative"), timeout_s: float = 120.0,
         report: FuzzReport | None = None) -> FuzzReport:
    report = report or FuzzReport()
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    # Read every stream to its end (schemathesis cuts SSE bodies after a few events by
    # default), so the rule for a stream's end can be checked.
    schema.config.max_stream_events = 1_000_000
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in modes:
            strategy = op.as_strategy(generation_mode=GenerationMode(mode))

            @settings(max_examples=max_examples, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck),
                      phases=[Phase.explicit, Phase.generate])
            @given(case=strategy)
            def run(case) -> None:
                resp = case.call(base_url=base_url, headers=headers, timeout=timeout_s)
                report.calls += 1
                report.statuses[resp.status_code] += 1
                report.by_operation.setdefault(f"{op.method.upper()} {op.path}",
                                               Counter())[resp.status_code] += 1
                what = f"{mode} {op.method.upper()} {op.path} body={_short(case.body)}"
                problem = check_response(resp.status_code,
                                         resp.headers.get("content-type", [""])[0]
                                         if isinstance(resp.headers.get("content-type"), list)
                                         else resp.headers.get("content-type", ""),
                                         resp.content)
                if problem is None:
                    problem = _nonconformance(case, resp)
                if problem:
                    report.failures.append(f"{what}: {problem}")
                elif mode == "negative" and resp.status_code < 300 and op.method == "post":
                    report.accepted_negative.append(what)

            try:
                run()
            except Unsatisfiable:  # negative mode of an operation that takes nothing
                pass
    return report


def _nonconformance(case, resp) -> str | None:
    """What schemathesis's conformance checks say about `resp`, or None."""
    try:
        case.validate_response(resp, checks=CONFORMANCE)
    except Exception as e:  # a Failure or a FailureGroup: their text names the check
        return f"not conformant to the schema ({resp.status_code}): {str(e)[:600]}"
    return None


def _short(body: object) -> str:
    try:
        s = json.dumps(body, default=str)
    except (TypeError, ValueError):
        s = repr(body)
    return s if len(s) <= 300 else s[:300] + "..."
