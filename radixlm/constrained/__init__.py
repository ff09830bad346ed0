"""Constrained decoding (structured output): request dialects -> one Constraint, a
grammar-backend interface (xgrammar), the compile queue and the per-step token bitmask.
See docs/architecture.md, "Structured output and tool calling"."""

from radixlm.constrained.constraint import Constraint, ConstraintError

__all__ = ["Constraint", "ConstraintError"]
