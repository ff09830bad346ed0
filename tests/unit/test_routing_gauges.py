"""The gauges Kubernetes routers read (Gateway API Inference Extension, llm-d) on /metrics:
waiting, running, KV use as a ratio, under vLLM's and SGLang's names (docs/deploy.md)."""

from fastapi.testclient import TestClient

from radixlm.messages import PoolStats
from radixlm.server.metrics import EngineMetrics, Snapshot
from tests.server_fakes import fake_stack

NAMES = {"waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
         "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
         "kv": ("vllm:kv_cache_usage_perc", "sglang:token_usage")}


def values(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def test_gauges_from_pool_stats():
    pool = PoolStats(rid="x", total_kv_slots=1000, free_kv_slots=600, held_by_requests=250,
                     held_by_cache=150, running=3, waiting=7, free_req_rows=5)
    snap = Snapshot(plan=None, pool=pool, requests_finished_total=0, prompt_tokens_total=0,
                    generation_tokens_total=0, max_running_requests=None)
    text = EngineMetrics("m").render(snap).decode()
    got = values(text)
    for name in NAMES["waiting"]:
        assert got[name] == 7
        assert f"# TYPE {name} gauge" in text
    for name in NAMES["running"]:
        assert got[name] == 3
    for name in NAMES["kv"]:
        assert got[name] == 0.25  # requests' slots only: cached slots are evictable
    assert 'vllm:num_requests_waiting{model_name="m"}' in text


def test_gauges_on_a_server_metrics_endpoint():
    with fake_stack(model_name="tiny") as stack, TestClient(stack.app) as client:
        got = values(client.get("/metrics").text)
        for names in NAMES.values():
            for name in names:
                assert name in got and 0 <= got[name] <= (1 if names is NAMES["kv"] else 1e9)
