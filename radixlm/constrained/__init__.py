"""Constrained decoding (structured output): request dialects -> one Constraint, a
grammar-backend interface (xgrammar), the compile queue and the per-step token bitmask.
See docs/structured-output.md."""

from radixlm.constrained.constraint import Constraint, ConstraintError

__all__ = ["Constraint", "ConstraintError"]
