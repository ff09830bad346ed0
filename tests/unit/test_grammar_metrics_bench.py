"""The grammar counters in /metrics (rendered from PoolStats.grammar), and the structured
benchmark's compile part on the default model's tokenizer."""

from __future__ import annotations

import pytest

from radixlm.constrained.stats import GrammarStats
from radixlm.messages import PoolStats
from radixlm.server.grammar_metrics import GRAMMAR_METRICS
from radixlm.server.metrics import EngineMetrics, Snapshot
from tests.conftest import requires_default_model


def _render(grammar: dict | None) -> str:
    pool = PoolStats(rid="x", total_kv_slots=8, free_kv_slots=8, held_by_requests=0,
                     held_by_cache=0, running=0, waiting=0, free_req_rows=1, grammar=grammar)
    m = EngineMetrics("tiny", extra=GRAMMAR_METRICS)
    return m.render(Snapshot(None, pool, 0, 0, 0, None)).decode()


def test_grammar_metrics_absent_until_used_then_rendered() -> None:
    assert "radixlm_grammar" not in _render(None)
    stats = GrammarStats(compiles=2, compile_s=0.5, cache_hits=3, cache_misses=2,
                         queue_wait_s=0.25, queued_requests=5, mask_s=0.01, mask_steps=10,
                         constrained_rows=30, sampled_rows=40)
    text = _render(stats.as_dict())
    assert 'radixlm_grammar_compile_seconds_total{model_name="tiny"} 0.5' in text
    assert 'radixlm_grammar_cache_hits_total{model_name="tiny"} 3.0' in text
    assert 'radixlm_grammar_queue_wait_seconds_total{model_name="tiny"} 0.25' in text
    assert 'radixlm_grammar_mask_seconds_total{model_name="tiny"} 0.01' in text
    assert 'radixlm_grammar_constrained_row_share{model_name="tiny"} 0.75' in text
    assert "radixlm_jump_forward" not in text  # --disable-jump-forward: no JumpStats


def test_jump_forward_metrics_rendered() -> None:
    from radixlm.constrained.jump_forward import JumpStats

    stats = {**GrammarStats().as_dict(), **JumpStats(jumps=4, jumped_tokens=17,
                                                      retokenized=1).as_dict()}
    text = _render(stats)
    assert 'radixlm_jump_forward_jumps_total{model_name="tiny"} 4.0' in text
    assert 'radixlm_jump_forward_tokens_total{model_name="tiny"} 17.0' in text
    assert 'radixlm_jump_forward_retokenized_total{model_name="tiny"} 1.0' in text


@requires_default_model
def test_compile_bench_and_table() -> None:
    pytest.importorskip("xgrammar")
    from radixlm.bench.structured import StructuredBenchConfig, run_compile, structured_table

    c = run_compile(StructuredBenchConfig())
    assert c["schemas"] >= 20 and 0 < c["p50_s"] <= c["p99_s"] <= c["max_s"]
    lat = c["cache_latency_s"]
    assert set(lat) == {"first (compile)", "repeat (cache hit)"}
    row = {"overlap": False, "batch": 1, "none_tok_s": 10.0, "constrained_tok_s": 9.0,
           "ratio": 0.9, "mask_ms_per_step": 0.1}
    table = structured_table({"decode": [row], "compile": c})
    assert "0.900" in table and "p99" in table
