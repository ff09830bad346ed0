"""A corpus of JSON schemas shaped like the ones clients send: OpenAI-style function
parameters, API resources, configuration files, and pydantic-generated models (with
$defs/$ref, Optional = anyOf null, enums, nested lists). Written for this benchmark (no
downloads); every schema passes radixlm's validation (no keyword xgrammar would drop)."""

from __future__ import annotations

from typing import Any

_S = {"type": "string"}
_I = {"type": "integer"}
_N = {"type": "number"}
_B = {"type": "boolean"}


def _obj(props: dict[str, Any], required: list[str] | None = None, **kw: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required, **kw}


def _arr(items: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **kw}


def _pydantic_models() -> list[dict[str, Any]]:
    from enum import Enum
    from typing import Literal, Optional

    from pydantic import BaseModel, Field

    class Status(str, Enum):
        open = "open"
        closed = "closed"
        merged = "merged"

    class User(BaseModel):
        login: str
        id: int
        site_admin: bool = False

    class Label(BaseModel):
        name: str
        color: str = Field(pattern="^[0-9a-f]{6}$")

    class Issue(BaseModel):
        number: int
        title: str = Field(max_length=256)
        state: Status
        user: User
        labels: list[Label] = []
        assignees: list[User] = []
        body: Optional[str] = None
        comments: int = Field(ge=0)

    class Money(BaseModel):
        amount: float
        currency: Literal["USD", "EUR", "GBP", "JPY"]

    class LineItem(BaseModel):
        sku: str
        quantity: int = Field(ge=1, le=1000)
        unit_price: Money

    class Address(BaseModel):
        line1: str
        line2: Optional[str] = None
        city: str
        postal_code: str
        country: str = Field(min_length=2, max_length=2)

    class Order(BaseModel):
        id: str
        customer_email: str
        items: list[LineItem] = Field(min_length=1)
        shipping: Address
        billing: Optional[Address] = None
        notes: Optional[str] = None

    class Step(BaseModel):
        explanation: str
        output: str

    class MathReasoning(BaseModel):
        steps: list[Step]
        final_answer: str

    class Entity(BaseModel):
        text: str
        label: Literal["PERSON", "ORG", "LOC", "DATE", "MONEY"]
        start: int
        end: int

    class Extraction(BaseModel):
        entities: list[Entity]
        sentiment: Literal["positive", "neutral", "negative"]
        summary: str = Field(max_length=500)

    class Event(BaseModel):
        name: str
        date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
        participants: list[str]
        location: Optional[Address] = None

    return [m.model_json_schema() for m in (Issue, Order, MathReasoning, Extraction, Event,
                                            User, Address)]


def _hand_written() -> list[dict[str, Any]]:
    weather = _obj({"location": {**_S, "description": "City and country, e.g. Paris, France"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   ["location"])
    search = _obj({"query": _S, "top_k": {"type": "integer", "minimum": 1, "maximum": 50},
                   "filters": _obj({"site": _S, "after": {**_S, "format": "date"},
                                    "language": {"type": "string", "enum": ["en", "de", "fr"]}},
                                   [])}, ["query"])
    email = _obj({"to": _arr({**_S, "format": "email"}, minItems=1, maxItems=10),
                  "cc": _arr({**_S, "format": "email"}), "subject": {**_S, "maxLength": 120},
                  "body": _S, "priority": {"type": "string", "enum": ["low", "normal", "high"]}},
                 ["to", "subject", "body"])
    calendar = _obj({"title": _S, "start": {**_S, "format": "date-time"},
                     "end": {**_S, "format": "date-time"},
                     "attendees": _arr(_obj({"email": {**_S, "format": "email"},
                                             "optional": _B}, ["email"])),
                     "recurrence": {"anyOf": [{"type": "null"}, _obj({
                         "freq": {"type": "string", "enum": ["daily", "weekly", "monthly"]},
                         "count": {"type": "integer", "minimum": 1}}, ["freq"])]}},
                    ["title", "start", "end"])
    sql = _obj({"sql": _S, "params": _arr({"anyOf": [_S, _N, _B, {"type": "null"}]}),
                "read_only": _B}, ["sql"])
    package_json = _obj({
        "name": {"type": "string", "pattern": "^[a-z0-9-]{1,214}$"},
        "version": {"type": "string", "pattern": r"^\d+\.\d+\.\d+$"},
        "description": _S, "private": _B,
        "scripts": {"type": "object", "additionalProperties": _S},
        "dependencies": {"type": "object", "additionalProperties": _S},
        "keywords": _arr(_S), "license": _S,
        "repository": _obj({"type": {"type": "string", "enum": ["git"]}, "url": {**_S, "format": "uri"}})},
        ["name", "version"])
    pod = _obj({
        "apiVersion": {"const": "v1"}, "kind": {"const": "Pod"},
        "metadata": _obj({"name": _S, "namespace": _S,
                          "labels": {"type": "object", "additionalProperties": _S}}, ["name"]),
        "spec": _obj({"containers": _arr(_obj({
            "name": _S, "image": _S, "args": _arr(_S),
            "ports": _arr(_obj({"containerPort": {"type": "integer", "minimum": 1,
                                                  "maximum": 65535},
                                "protocol": {"type": "string", "enum": ["TCP", "UDP"]}},
                               ["containerPort"])),
            "env": _arr(_obj({"name": _S, "value": _S})),
            "resources": _obj({"limits": _obj({"cpu": _S, "memory": _S}, []),
                               "requests": _obj({"cpu": _S, "memory": _S}, [])}, [])},
            ["name", "image"]), minItems=1),
            "restartPolicy": {"type": "string", "enum": ["Always", "OnFailure", "Never"]}},
            ["containers"])})
    geojson = _obj({"type": {"const": "Feature"},
                    "geometry": _obj({"type": {"type": "string", "enum": ["Point", "LineString"]},
                                      "coordinates": _arr(_N, minItems=2)}),
                    "properties": {"type": "object"}})
    person_ld = _obj({"@context": {"const": "https://schema.org"}, "@type": {"const": "Person"},
                      "name": _S, "jobTitle": _S, "email": {**_S, "format": "email"},
                      "birthDate": {**_S, "format": "date"},
                      "address": _obj({"streetAddress": _S, "addressLocality": _S,
                                       "postalCode": _S, "addressCountry": _S}, []),
                      "sameAs": _arr({**_S, "format": "uri"})}, ["@context", "@type", "name"])
    review = _obj({"rating": {"type": "integer", "minimum": 1, "maximum": 5},
                   "pros": _arr(_S, maxItems=5), "cons": _arr(_S, maxItems=5),
                   "verdict": {**_S, "maxLength": 280}, "recommend": _B})
    classify = _obj({"label": {"type": "string", "enum": ["spam", "ham"]},
                     "confidence": {"type": "number", "minimum": 0, "maximum": 1}})
    log_line = _obj({"timestamp": {**_S, "format": "date-time"},
                     "level": {"type": "string", "enum": ["DEBUG", "INFO", "WARN", "ERROR"]},
                     "service": _S, "message": _S, "trace_id": {"type": "string",
                                                                "pattern": "^[0-9a-f]{32}$"},
                     "attrs": {"type": "object", "additionalProperties": {"anyOf": [_S, _N, _B]}}},
                    ["timestamp", "level", "message"])
    invoice = _obj({"invoice_number": _S, "issued": {**_S, "format": "date"},
                    "vendor": _obj({"name": _S, "vat_id": _S}, ["name"]),
                    "lines": _arr(_obj({"description": _S, "qty": _N, "unit_price": _N,
                                        "tax_rate": {"type": "number", "minimum": 0,
                                                     "maximum": 0.5}}), minItems=1),
                    "total": _N, "currency": {"type": "string", "pattern": "^[A-Z]{3}$"}})
    tree = {"$defs": {"node": _obj({"name": _S, "children": _arr({"$ref": "#/$defs/node"})},
                                   ["name"])}, "$ref": "#/$defs/node"}
    return [weather, search, email, calendar, sql, package_json, pod, geojson, person_ld,
            review, classify, log_line, invoice, tree,
            _obj({"answer": _S}), _obj({"yes": _B}), _arr(_I, minItems=1, maxItems=8)]


def schema_corpus() -> list[dict[str, Any]]:
    return [*_hand_written(), *_pydantic_models()]
