"""`radixlm bench serve` takes SGLang bench_serving's flag names with the same meaning."""

from __future__ import annotations

import pytest

from radixlm.bench.cli import serve_config_from
from radixlm.cli import build_parser


def _config(argv: list[str]):
    return serve_config_from(build_parser().parse_args(["bench", "serve", *argv]))


def test_bench_serving_flags_mean_what_they_mean_there() -> None:
    cfg = _config(["--backend", "sglang", "--base-url", "http://10.0.0.1:30000",
                   "--dataset-name", "random", "--num-prompts", "17",
                   "--random-input-len", "300", "--random-output-len", "40",
                   "--random-range-ratio", "0.5", "--request-rate", "8",
                   "--max-concurrency", "4", "--output-file", "out.jsonl"])
    d = cfg.dataset
    assert (d.name, d.num_prompts, d.random_input_len, d.random_output_len,
            d.random_range_ratio) == ("random", 17, 300, 40, 0.5)
    assert cfg.backend == "openai" and cfg.base_url == "http://10.0.0.1:30000"
    assert cfg.request_rate == 8.0 and cfg.max_concurrency == (4,)
    assert cfg.output_file == "out.jsonl"


@pytest.mark.parametrize("backend, ours", [("vllm", "openai"), ("sglang-oai", "openai"),
                                           ("radixlm", "radixlm"), ("openai", "openai")])
def test_backends_are_the_openai_endpoints(backend: str, ours: str) -> None:
    assert _config(["--backend", backend, "--base-url", "http://h:1"]).backend == ours


def test_dataset_aliases_and_host_port() -> None:
    cfg = _config(["--dataset-name", "random-ids", "--host", "10.1.2.3", "--port", "8000"])
    assert cfg.dataset.name == "random" and cfg.base_url == "http://10.1.2.3:8000"
    assert _config(["--dataset", "generated-shared-prefix"]).dataset.name == \
        "generated-shared-prefix"
    assert _config([]).base_url is None  # no server given: the command starts its own


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(SystemExit):
        _config(["--backend", "sglang-oai-chat"])
