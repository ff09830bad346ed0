"""GET /metrics (Prometheus) and GET /get_server_info through the app with a FakeEngine."""

import os

import torch
from fastapi.testclient import TestClient

from radixlm.planning.device_memory import DeviceMemory
from radixlm.planning.oom import BatchShape, diagnose_kv_exhaustion, diagnose_oom, is_out_of_memory
from radixlm.planning.planner import plan_memory
from radixlm.planning.units import GiB
from radixlm.models.hf_loader import load_hf_config
from tests.server_fakes import fake_stack

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "configs")


def plan_8b(**kw):
    cfg = load_hf_config(os.path.join(FIXTURES, "llama-3-8b"))
    args = dict(act_bytes=2, kv_bytes=2, context_len=8192, chunked_prefill_size=8192,
                max_prefill_tokens=8192, mem_fraction_static=0.9, max_running_requests=64)
    args.update(kw)
    return plan_memory(cfg=cfg, weight_bytes=16 * GiB,
                       device=DeviceMemory("cuda", 80 * GiB, 64 * GiB, "test"), **args)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_metrics_and_server_info():
    plan = plan_8b()
    with fake_stack(api_key="k", model_name="tiny") as stack:
        stack.tokenizer_manager.memory_plan = plan
        stack.tokenizer_manager.cuda_graph_batch_sizes = [1, 2, 4]
        dtype = {"requested": "auto", "resolved": "bfloat16", "reason": "CPU has amx_bf16"}
        stack.tokenizer_manager.dtype = dtype
        stack.tokenizer_manager.scheduler_threads = 4
        with TestClient(stack.app) as client:
            h = {"Authorization": "Bearer k"}
            r = client.post("/v1/completions", headers=h,
                            json={"model": "tiny", "prompt": "hello world", "max_tokens": 3})
            assert r.status_code == 200
            assert client.get("/metrics").status_code == 401
            text = client.get("/metrics", headers=h).text
            assert metric(text, "radixlm_weight_bytes") == 16 * GiB
            assert metric(text, "radixlm_kv_cache_bytes") == plan.kv_bytes
            assert metric(text, "radixlm_activation_headroom_bytes") == plan.activation_headroom
            # By hand, not by the planner: Llama-3-8B keeps K and V of 8 KV heads x 128 dims
            # in bf16 in each of 32 layers, 131,072 bytes a token; weights + KV + headroom
            # fit in the 0.9 share of the 80 GiB device.
            kv_tokens = plan.kv_tokens
            assert metric(text, "radixlm_kv_cache_bytes") == kv_tokens * 32 * 2 * 8 * 128 * 2
            assert 16 * GiB + metric(text, "radixlm_kv_cache_bytes") <= 0.9 * 80 * GiB
            assert metric(text, "radixlm_activation_headroom_bytes") > 0
            assert metric(text, "radixlm_kv_capacity_tokens") == 1024
            assert metric(text, "radixlm_num_running_reqs") == 0
            assert metric(text, "radixlm_scheduler_up") == 1
            assert metric(text, "radixlm_requests_total") == 1
            assert metric(text, "radixlm_generation_tokens_total") == 3
            assert metric(text, "radixlm_prompt_tokens_total") == 2
            info = client.get("/get_server_info", headers=h).json()
            assert info["server_args"]["api_key"] == "<redacted>"
            assert info["memory_plan"]["kv_tokens"] == plan.kv_tokens
            assert info["memory_plan"]["mem_fraction_static"] == 0.9
            assert info["pool"]["total_kv_slots"] == 1024
            assert info["cuda_graph_batch_sizes"] == [1, 2, 4]
            assert info["dtype"] == dtype
            # The API process here is the test process: its own torch thread count.
            assert info["threads"] == {"scheduler": 4, "api": torch.get_num_threads()}
            assert client.get("/server_info", headers=h).status_code == 200


def test_two_apps_have_separate_registries():
    with fake_stack() as a, fake_stack() as b:
        with TestClient(a.app) as ca, TestClient(b.app) as cb:
            ca.post("/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 2})
            assert metric(ca.get("/metrics").text, "radixlm_requests_total") == 1
            assert metric(cb.get("/metrics").text, "radixlm_requests_total") == 0
            assert "radixlm_weight_bytes" not in cb.get("/metrics").text  # no plan: left out


def test_oom_diagnosis_follows_the_method():
    import torch

    plan = plan_8b(mem_fraction_static=0.99, max_running_requests=8)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_out_of_memory(ValueError("bad"))
    pre = diagnose_oom(plan, BatchShape("prefill", [8192], [8192]),
                       torch.OutOfMemoryError("x"))
    msg = pre.message()
    assert pre.pool == "activation" and "in prefill" in msg
    assert f"--chunked-prefill-size to {pre.fitting_chunk} (now 8192)" in msg
    assert "lower --mem-fraction-static to 0.98" in msg
    dec = diagnose_oom(plan, BatchShape("decode", [1] * 64, [8192] * 64))
    assert "in decode" in dec.message() and f"--max-running-requests to {dec.fitting_batch}" in dec.message()
    assert 0 < dec.fitting_batch < 64
    kv = diagnose_kv_exhaustion(plan_8b(mem_fraction_static=0.5), BatchShape("decode", [1] * 2, [8192] * 2))
    assert kv.pool == "kv" and "raise --mem-fraction-static to" in kv.message()
