"""`bench serve --transformers-baseline`: the same requests through transformers'
generate, in the servers' field names, and its row beside the servers'."""

from __future__ import annotations

import pytest
import torch

from radixlm.bench.datasets import BenchRequest
from radixlm.bench.hf_baseline import HFBaseline
from radixlm.bench.serve import ServeBenchConfig, serve_table, summarize_runs
from radixlm.bench.serve_hf import resolve_baseline_dtype, run_hf_requests


def test_hf_requests_metrics(tiny_llama_dir) -> None:
    hf = HFBaseline(tiny_llama_dir, torch.float32, batch_size=1)
    reqs = [BenchRequest(prompt=[5 + i, 7, 9, 11][: 2 + i % 3], prompt_len=2 + i % 3,
                         output_len=4 if i < 3 else 6) for i in range(5)]
    for conc in (1, 2, None):
        m = run_hf_requests(hf, reqs, tokenizer=None, concurrency=conc)
        assert hf.batch_size == (conc or 5)
        assert m["completed"] == 5 and m["failed"] == 0
        assert m["total_output_tokens"] == 3 * 4 + 2 * 6  # exactly output_len each
        assert m["output_throughput"] == pytest.approx(m["total_output_tokens"] / m["duration"])
        assert m["model_id"] == "transformers float32"


def test_baseline_dtype_and_summary_row(monkeypatch) -> None:
    from radixlm.runtime import cpu_features

    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert resolve_baseline_dtype("auto") == torch.bfloat16
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2"}))
    assert resolve_baseline_dtype("auto") == torch.float32
    with pytest.raises(ValueError, match="--transformers-baseline"):
        ServeBenchConfig(transformers_baseline="int4").validate()
    records = [{"server": "radixlm", "max_concurrency": 1, "completed": 4, "failed": 0,
                "output_throughput": 90.0, "median_ttft_ms": 10.0, "cache_hit_rate": 0.0},
               {"server": "transformers", "max_concurrency": 1, "completed": 4, "failed": 0,
                "output_throughput": 30.0}]
    rows = summarize_runs(records)
    assert rows[1]["output_throughput_ratio"] == pytest.approx(1 / 3)
    assert "transformers" in serve_table(records)
