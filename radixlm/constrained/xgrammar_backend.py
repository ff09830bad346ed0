"""The xgrammar implementation of the grammar backend (xgrammar >= 0.2.6).

One `xgrammar.GrammarCompiler` per model, built from the model's tokenizer with the LM
head's vocabulary size (`TokenizerInfo.from_huggingface(vocab_size=...)`: ids past the
tokenizer's are never allowed) and the model's stop tokens. xgrammar's own compile cache
is off: `grammar_cache.py` is the one cache (it also remembers failures).

JSON is generated compactly and deterministically: no free whitespace (a small model
could otherwise emit newlines until max_tokens), xgrammar's default separators
(", " and ": "), properties in schema order, no properties beyond the schema's
(`strict_mode`). `json_object` is any JSON object (`{"type": "object"}`, non-strict).
An integer the schema leaves unbounded gets I-JSON's bounds (`ijson.py`: at most 16 digits).
"""

from __future__ import annotations

import json
from typing import Any

import torch

from radixlm.constrained.backend import GrammarBackend, GrammarMatcher
from radixlm.constrained.constraint import Constraint
from radixlm.constrained.ijson import bound_integers_text

_JSON_OBJECT = '{"type": "object"}'


def _xgr():
    import xgrammar  # deferred: ~2 s to import, only for servers that constrain

    return xgrammar


def choice_ebnf(choices: list[str]) -> str:
    """`root ::= "a" | "b"`, each choice a literal (backslash and quote escaped)."""
    def lit(s: str) -> str:
        return '"' + json.dumps(s, ensure_ascii=False)[1:-1] + '"'

    return "root ::= " + " | ".join(lit(c) for c in choices)


def parse_grammar(kind: str, spec: str) -> Any:
    """Parse a spec without a tokenizer (validation in the API process); raises on error."""
    xgr = _xgr()
    if kind == "json_schema":
        return xgr.Grammar.from_json_schema(bound_integers_text(spec), any_whitespace=False,
                                            strict_mode=True)
    if kind == "regex":
        return xgr.Grammar.from_regex(spec)
    if kind == "ebnf":
        return xgr.Grammar.from_ebnf(spec)
    if kind == "choice":
        return xgr.Grammar.from_ebnf(choice_ebnf(json.loads(spec)))
    if kind == "json_object":
        return xgr.Grammar.from_json_schema(_JSON_OBJECT, any_whitespace=False, strict_mode=False)
    raise ValueError(f"unknown constraint kind {kind!r}")


class XGrammarMatcher(GrammarMatcher):
    __slots__ = ("m", "vocab_size")

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.m = matcher
        self.vocab_size = vocab_size

    def accept(self, token_id: int) -> bool:
        return bool(self.m.accept_token(token_id))

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.m.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return bool(self.m.is_terminated())

    def find_jump_forward_string(self) -> str:
        return self.m.find_jump_forward_string()

    def accept_string(self, text: str) -> bool:
        return bool(self.m.accept_string(text))

    def rollback(self, num_tokens: int) -> None:
        self.m.rollback(num_tokens)


class XGrammarBackend(GrammarBackend):
    def __init__(self, tokenizer_info: Any, compile_threads: int = 1) -> None:
        """`tokenizer_info`: an xgrammar.TokenizerInfo (see `from_tokenizer`)."""
        self.vocab_size = tokenizer_info.vocab_size
        self.compiler = _xgr().GrammarCompiler(tokenizer_info, max_threads=compile_threads,
                                               cache_enabled=False)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                       compile_threads: int = 1) -> "XGrammarBackend":
        """From a Hugging Face tokenizer; `vocab_size` is the LM head's."""
        info = _xgr().TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) or None)
        return cls(info, compile_threads)

    def compile(self, constraint: Constraint) -> Any:
        c, kind, spec = self.compiler, constraint.kind, constraint.spec
        if kind == "json_schema":
            return c.compile_json_schema(bound_integers_text(spec), any_whitespace=False,
                                         strict_mode=True)
        if kind == "json_object":
            return c.compile_json_schema(_JSON_OBJECT, any_whitespace=False, strict_mode=False)
        if kind == "regex":
            return c.compile_regex(spec)
        if kind == "ebnf":
            return c.compile_grammar(spec)
        if kind == "choice":
            return c.compile_grammar(choice_ebnf(json.loads(spec)))
        raise ValueError(f"unknown constraint kind {kind!r}")

    def matcher(self, compiled: Any) -> GrammarMatcher:
        return XGrammarMatcher(_xgr().GrammarMatcher(compiled), self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor,
                      rows: list[int]) -> None:
        """On CUDA xgrammar's kernel; on the CPU the interface's table gather, which
        measured ~3x faster than xgrammar's CPU loop at batch 32 (docs/benchmarks.md)."""
        if logits.device.type != "cuda":
            return super().apply_bitmask(logits, bitmask, rows)
        bitmask = bitmask.to(logits.device, non_blocking=True)
        _xgr().apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1],
                                           indices=rows)
