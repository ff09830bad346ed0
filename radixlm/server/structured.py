"""The structured-output and tool fields of the HTTP request models (a pydantic mixin).

The dialect fields are typed `Any` on purpose: `constraint_from_request` checks them and
its errors name the field (a 400), instead of pydantic's generic union messages.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from radixlm.constrained.constraint import Constraint
from radixlm.constrained.request_mapping import FIELDS, constraint_from_request


class ConstraintFields(BaseModel):
    # OpenAI
    response_format: Any = None
    # SGLang
    regex: Any = None
    ebnf: Any = None
    json_schema: Any = None
    # vLLM
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None

    def constraint(self, prefix: str = "") -> Constraint | None:
        """The request's one Constraint (validated), or None; ConstraintError -> 400."""
        return constraint_from_request({f: getattr(self, f) for f in FIELDS}, prefix)


class ToolFields(BaseModel):
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


CONSTRAINT_FIELD_NAMES = frozenset(FIELDS)
