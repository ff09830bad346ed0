"""Constraint: the one internal form of every structured-output request.

Every request dialect (OpenAI `response_format`, SGLang `regex` / `ebnf` / `json_schema`,
vLLM `structured_outputs` and `guided_*`, tool_choice required / named) becomes one
`Constraint` in the API process (`request_mapping.py`); it travels inside
`SamplingParams.constraint` to the scheduler, where a grammar backend compiles it.

Invariant: a Constraint that exists has been validated (`validate.py`): its spec parses,
and a JSON schema uses no keyword the backend would silently drop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ConstraintKind = Literal["json_schema", "json_object", "regex", "ebnf", "choice"]
KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "ebnf", "choice")


class ConstraintError(ValueError):
    """An invalid or unsupported constraint: an HTTP 400 whose `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Constraint:
    """`spec` by kind: json_schema -> the schema as canonical JSON text (sorted keys are
    NOT applied: property order is the generation order); json_object -> ""; regex -> the
    pattern; ebnf -> the grammar (GBNF/xgrammar EBNF, rule `root`); choice -> a JSON list
    of the allowed strings. `field` is the request field it came from (error messages)."""

    kind: ConstraintKind
    spec: str
    field: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """What the compiled-grammar cache is keyed on (the field does not matter)."""
        return (self.kind, self.spec)
