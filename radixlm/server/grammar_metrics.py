"""/metrics of constrained decoding (from PoolStats.grammar, i.e. GrammarStats, and the
JumpStats of jump-forward decoding unless --disable-jump-forward); absent until the first
constrained request."""

from __future__ import annotations

from radixlm.server.metrics import MetricDef, Snapshot, pool_field


def _share(s: Snapshot) -> float | None:
    g = None if s.pool is None else s.pool.grammar
    if g is None:
        return None
    return g["constrained_rows"] / g["sampled_rows"] if g["sampled_rows"] else 0.0


GRAMMAR_METRICS: list[MetricDef] = [
    MetricDef("radixlm_grammar_compile_seconds", "Time spent compiling grammars (cache "
              "misses).", "counter", pool_field("grammar", "compile_s")),
    MetricDef("radixlm_grammar_compile_max_seconds", "Longest single grammar compilation.",
              "gauge", pool_field("grammar", "compile_s_max")),
    MetricDef("radixlm_grammar_compiles", "Grammar compilations run.", "counter",
              pool_field("grammar", "compiles")),
    MetricDef("radixlm_grammar_compile_failures", "Grammar compilations that failed.",
              "counter", pool_field("grammar", "compile_failures")),
    MetricDef("radixlm_grammar_compile_timeouts", "Requests refused because compilation "
              "passed --grammar-compile-timeout.", "counter",
              pool_field("grammar", "compile_timeouts")),
    MetricDef("radixlm_grammar_cache_hits", "Compiled-grammar cache hits.", "counter",
              pool_field("grammar", "cache_hits")),
    MetricDef("radixlm_grammar_cache_misses", "Compiled-grammar cache misses.", "counter",
              pool_field("grammar", "cache_misses")),
    MetricDef("radixlm_grammar_queue_wait_seconds", "Time constrained requests waited for "
              "their grammar, summed.", "counter", pool_field("grammar", "queue_wait_s")),
    MetricDef("radixlm_grammar_queued_requests", "Constrained requests that left the grammar "
              "queue.", "counter", pool_field("grammar", "queued_requests")),
    MetricDef("radixlm_grammar_mask_seconds", "CPU time filling token bitmasks, summed over "
              "steps.", "counter", pool_field("grammar", "mask_s")),
    MetricDef("radixlm_grammar_mask_steps", "Steps with at least one constrained row.",
              "counter", pool_field("grammar", "mask_steps")),
    MetricDef("radixlm_grammar_constrained_rows", "Sampled rows that were constrained.",
              "counter", pool_field("grammar", "constrained_rows")),
    MetricDef("radixlm_grammar_constrained_row_share", "Constrained / all sampled rows since "
              "the first constrained request.", "gauge", _share),
    MetricDef("radixlm_jump_forward_jumps", "Forced strings appended at once by jump-forward "
              "decoding.", "counter", pool_field("grammar", "jumps")),
    MetricDef("radixlm_jump_forward_tokens", "Output tokens jump-forward added without "
              "sampling them (net of re-tokenization).", "counter",
              pool_field("grammar", "jumped_tokens")),
    MetricDef("radixlm_jump_forward_retokenized", "Jumps that re-encoded tokens already in "
              "the output.", "counter", pool_field("grammar", "retokenized")),
]
