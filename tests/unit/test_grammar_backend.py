"""The grammar backend (xgrammar) on a tiny vocabulary, the compiled-grammar cache, the
compile queue (timeout, failures cached) and the per-step bitmask."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from radixlm.constrained.backend import GrammarBackend, GrammarMatcher
from radixlm.constrained.constraint import Constraint
from radixlm.constrained.grammar_cache import CacheEntry, GrammarCache
from radixlm.constrained.grammar_queue import GrammarQueue
from radixlm.constrained.stats import GrammarStats
from radixlm.constrained.step_mask import GrammarStep

xgr = pytest.importorskip("xgrammar")
from radixlm.constrained.xgrammar_backend import XGrammarBackend  # noqa: E402

# Token ids: 0 is the stop token; the LM head (40) is larger than the vocabulary.
VOCAB = ["</s>", "a", "b", "{", "}", '"', ":", " ", "1", "2", ",", "x", "ab", "yes", "no"]
LM_HEAD = 40
EOS = 0


@pytest.fixture(scope="module")
def backend() -> XGrammarBackend:
    info = xgr.TokenizerInfo(VOCAB, vocab_type=xgr.VocabType.RAW, vocab_size=LM_HEAD,
                             stop_token_ids=[EOS])
    return XGrammarBackend(info)


def allowed(backend: GrammarBackend, m: GrammarMatcher) -> set[int]:
    bm = backend.allocate_bitmask(1)
    m.fill_bitmask(bm, 0)
    logits = torch.zeros(1, LM_HEAD)
    backend.apply_bitmask(logits, bm, [0])
    return set(torch.nonzero(logits[0] > float("-inf")).flatten().tolist())


def test_regex_matcher_masks_accepts_and_terminates(backend: XGrammarBackend) -> None:
    m = backend.matcher(backend.compile(Constraint("regex", "a+b")))
    assert allowed(backend, m) == {VOCAB.index("a"), VOCAB.index("ab")}
    assert m.accept(VOCAB.index("a"))
    assert not m.accept(VOCAB.index("x"))  # refused; state unchanged
    assert m.accept(VOCAB.index("b"))
    assert allowed(backend, m) == {EOS}  # complete: only the stop token
    assert not m.is_terminated()
    assert m.accept(EOS) and m.is_terminated()


def test_choice_and_padding_ids_never_allowed(backend: XGrammarBackend) -> None:
    m = backend.matcher(backend.compile(Constraint("choice", json.dumps(["yes", "no"]))))
    ids = allowed(backend, m)
    assert ids == {VOCAB.index("yes"), VOCAB.index("no")}
    assert all(i < len(VOCAB) for i in ids)


def test_json_schema_compact_output(backend: XGrammarBackend) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    m = backend.matcher(backend.compile(Constraint("json_schema", json.dumps(schema))))
    for tok in ["{", '"', "x", '"', ":", " ", "1", "2", "}"]:
        assert m.accept(VOCAB.index(tok)), tok
    assert allowed(backend, m) == {EOS}


@pytest.mark.parametrize("rows", [[0, 2], [0, 1, 2]])
def test_table_apply_matches_xgrammar(backend: XGrammarBackend, rows) -> None:
    """The interface's table gather and xgrammar's own kernel mask the same logits."""
    torch.manual_seed(0)
    bm = torch.randint(-2**31, 2**31 - 1, (3, (LM_HEAD + 31) // 32), dtype=torch.int32)
    a = torch.randn(3, LM_HEAD)
    b = a.clone()
    backend.apply_bitmask(a, bm, rows)
    xgr.apply_token_bitmask_inplace(b, bm, vocab_size=LM_HEAD, indices=rows)
    assert torch.equal(a, b)
    assert torch.isfinite(a[1]).all() == (1 not in rows)


def test_cache_lru_and_failures() -> None:
    cache = GrammarCache(capacity=2)
    cache.put(("regex", "a"), CacheEntry("A"))
    cache.put(("regex", "b"), CacheEntry(error="bad"))
    assert cache.get(("regex", "a")).compiled == "A"
    cache.put(("regex", "c"), CacheEntry("C"))  # evicts b (least recently used)
    assert cache.get(("regex", "b")) is None
    assert cache.get(("regex", "c")).compiled == "C"
    assert (cache.hits, cache.misses) == (2, 1)


class _SlowBackend(GrammarBackend):
    """Counts compilations; 'slow' specs block until released; 'bad' ones raise."""

    vocab_size = LM_HEAD

    def __init__(self) -> None:
        self.release = threading.Event()
        self.compiles = 0

    def compile(self, constraint: Constraint):
        self.compiles += 1
        if constraint.spec == "slow":
            self.release.wait(10)
        if constraint.spec == "bad":
            raise RuntimeError("[12:00:00] /x.cc:1: Regex parsing error at position 1")
        return constraint.spec

    def matcher(self, compiled):
        return SimpleNamespace(compiled=compiled, allows_no_token=lambda: False)


def _req(rid: str) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, grammar=None)


def _drain(q: GrammarQueue, n: int, timeout: float = 10.0) -> list:
    out, deadline = [], time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        q.wait_any(0.05)
        out += q.ready()
    return out


def test_queue_compiles_off_thread_caches_and_times_out() -> None:
    be = _SlowBackend()
    q = GrammarQueue(lambda: be, timeout_s=0.3)
    ok, bad, bad2 = _req("ok"), _req("bad"), _req("bad2")
    q.submit(ok, Constraint("regex", "a+", "regex"))
    q.submit(bad, Constraint("regex", "bad", "regex"))
    outs = {o.req.rid: o for o in _drain(q, 2)}
    assert outs["ok"].error is None and ok.grammar.compiled == "a+"
    assert outs["bad"].error == "invalid regex: Regex parsing error at position 1"
    q.submit(bad2, Constraint("regex", "bad", "regex"))  # the failure is cached
    assert _drain(q, 1)[0].error == outs["bad"].error
    assert be.compiles == 2 and q.stats.compile_failures == 1

    slow = _req("slow")
    q.submit(slow, Constraint("regex", "slow", "regex"), now=time.perf_counter() - 1.0)
    (out,) = q.ready()  # submitted "1 s ago", over the 0.3 s timeout
    assert "grammar-compile-timeout" in out.error and q.stats.compile_timeouts == 1
    be.release.set()
    q.shutdown()


def test_queue_abort() -> None:
    be = _SlowBackend()
    q = GrammarQueue(lambda: be, timeout_s=5)
    q.submit(_req("r"), Constraint("regex", "slow"))
    assert q.abort("r").rid == "r" and not q.pending and q.abort("r") is None
    be.release.set()
    q.shutdown()


def test_grammar_step_fill_then_apply(backend: XGrammarBackend) -> None:
    compiled = backend.compile(Constraint("regex", "x"))
    constrained = SimpleNamespace(grammar=backend.matcher(compiled), finished=False)
    free = SimpleNamespace(grammar=None, finished=False)
    done = SimpleNamespace(grammar=backend.matcher(compiled), finished=True)
    step = GrammarStep(backend, [free, constrained, done], [1, 2], GrammarStats())
    logits = torch.zeros(3, LM_HEAD)
    t = threading.Thread(target=step.apply, args=(logits,))
    t.start()  # the forward thread waits for the fill
    time.sleep(0.05)
    assert t.is_alive()
    step.fill()
    t.join(5)
    assert torch.isfinite(logits[0]).all()  # unconstrained row untouched
    assert torch.nonzero(torch.isfinite(logits[1])).flatten().tolist() == [VOCAB.index("x")]
    assert torch.isfinite(logits[2][:len(VOCAB)]).all()  # finished: allows everything
    assert step.stats.mask_steps == 1
