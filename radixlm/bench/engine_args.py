"""Engine arguments on the bench command line: `KEY=VALUE` ServerArgs overrides and named
ablations (sets of overrides run side by side with the default engine)."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from radixlm.config import ServerArgs


def parse_engine_arg(text: str) -> tuple[str, Any]:
    """`chunked_prefill_size=-1` (or `--chunked-prefill-size=-1`) -> ("chunked_prefill_size", -1),
    the value converted to the ServerArgs field's type."""
    key, sep, value = text.partition("=")
    key = key.strip().lstrip("-").replace("-", "_")
    hints = typing.get_type_hints(ServerArgs)
    if not sep or key not in {f.name for f in dataclasses.fields(ServerArgs)}:
        raise argparse.ArgumentTypeError(f"expected SERVER_ARG=VALUE with a ServerArgs field, "
                                         f"got {text!r}")
    tp = hints[key]
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        if value.lower() == "none":
            return key, None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if tp is bool:
        return key, value.lower() in ("1", "true", "yes", "on")
    try:
        return key, tp(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{key}: {e}") from None


@dataclass(frozen=True)
class Ablation:
    """A named set of ServerArgs overrides, e.g. no-radix: {disable_radix_cache: True}."""

    name: str
    engine_args: dict[str, Any]


def parse_ablation(text: str) -> Ablation:
    """`NAME:KEY=VALUE[,KEY=VALUE...]`, `KEY=VALUE[,...]` (then named after its text), or
    `NAME:` (no overrides: the defaults under that name)."""
    name, sep, rest = text.partition(":")
    if not sep or "=" in name:
        name, rest = text, text
    args = dict(parse_engine_arg(item) for item in rest.split(",") if item.strip())
    if not name or (not args and not (sep and rest.strip() == "")):
        raise argparse.ArgumentTypeError(f"--ablation {text!r}: no KEY=VALUE given")
    return Ablation(name, args)
