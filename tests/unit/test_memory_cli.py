"""`radixlm memory` on config-only directories, a tiny checkpoint and the default GGUF."""

import json
import os

import pytest

from radixlm.cli import main
from radixlm.planning.weight_estimate import checkpoint_shapes, config_tensor_shapes, estimate_weights
from radixlm.models.loader import load_model_config
from tests.conftest import requires_default_model

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "configs")


def run_json(capsys, *args):
    try:
        main(["memory", *args, "--json"])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, json.loads(capsys.readouterr().out)


def test_70b_bf16_does_not_fit_one_80gb_gpu_but_tp2_does(capsys):
    model = os.path.join(FIXTURES, "llama-3-70b")
    code, plan = run_json(capsys, "--model", model, "--device-memory", "80GiB")
    assert code == 1 and plan["problems"][0]["pool"] == "weights"
    assert plan["verdict"][0].startswith("WILL NOT START")
    code, plan = run_json(capsys, "--model", model, "--device-memory", "80GiB", "--tp-size", "2",
                          "--quantization", "fp8")
    assert code == 0 and plan["kv_tokens"] > 0 and plan["tp_size"] == 2
    assert plan["weights"]["source"] == "config"


def test_fp8_kv_halves_bytes_per_token(capsys):
    model = os.path.join(FIXTURES, "llama-3-8b")
    _, bf16 = run_json(capsys, "--model", model, "--device-memory", "141GiB")
    _, fp8 = run_json(capsys, "--model", model, "--device-memory", "141GiB",
                      "--kv-cache-dtype", "fp8_e4m3")
    assert fp8["kv_bytes_per_token"] * 2 == bf16["kv_bytes_per_token"] == 131072


def test_text_output_names_pools_and_flags(capsys):
    main(["memory", "--model", os.path.join(FIXTURES, "llama-3-8b"), "--device-memory", "80GiB",
          "--mem-fraction-static", "0.99", "--max-running-requests", "8"])
    out = capsys.readouterr().out
    for word in ("weights", "KV cache", "activations", "--chunked-prefill-size to",
                 "--mem-fraction-static 0.99"):
        assert word in out


def test_checkpoint_shapes_equal_the_loaded_model(tiny_llama_dir):
    import torch

    from radixlm.planning.weight_estimate import module_bytes
    from radixlm.models.loader import load_model

    cfg = load_model_config(tiny_llama_dir)
    shapes, source, stored = checkpoint_shapes(tiny_llama_dir, cfg)
    assert source == "safetensors" and stored > 0
    est = estimate_weights(shapes, cfg, 4)
    assert est.total_bytes == estimate_weights(config_tensor_shapes(cfg), cfg, 4).total_bytes
    model, _ = load_model(tiny_llama_dir, torch.float32, "cpu")
    assert module_bytes(model) == est.total_bytes


@requires_default_model
def test_default_gguf_uses_its_tensor_table(capsys):
    code, plan = run_json(capsys, "--device-memory", "4GiB", "--device", "cpu")
    assert code == 0
    w = plan["weights"]
    assert w["source"] == "gguf" and 130e6 < w["num_params"] < 140e6  # SmolLM2-135M
    assert w["on_disk_bytes"] < w["total_bytes"]  # stored quantized, run in float32
    assert plan["device_kind"] == "cpu" and plan["max_running_requests"] <= 64


@requires_default_model
def test_default_gguf_int4_estimate_equals_the_loaded_model(capsys):
    """--quantization auto on a bfloat16 CPU run: the Q4_1 projections' int4 form, the
    dense fallbacks (none on AMX CPUs), and the tied head's copy, as the loaded model holds
    them."""
    import torch

    from radixlm.planning.weight_estimate import module_bytes
    from radixlm.models import resolve_model_path
    from radixlm.models.linear import LinearPolicy, weight_bytes_by_format
    from radixlm.models.loader import load_model

    code, plan = run_json(capsys, "--device", "cpu", "--device-memory", "4GiB",
                          "--dtype", "bfloat16", "--quantization", "auto")
    assert code == 0
    model, _ = load_model(resolve_model_path(None), torch.bfloat16, "cpu",
                          linear_policy=LinearPolicy("auto"))
    assert plan["weights"]["total_bytes"] == module_bytes(model)
    loaded = weight_bytes_by_format(model)
    assert plan["weight_formats"]["int4 groupwise"] == loaded["int4 groupwise"]
    fallback = "dense bfloat16 (fallback for large batches)"
    loaded_fallback = sum(v for k, v in loaded.items() if k.endswith("(fallback for large batches)"))
    assert plan["weight_formats"].get(fallback, 0) == loaded_fallback
    _, none = run_json(capsys, "--device", "cpu", "--device-memory", "4GiB",
                       "--dtype", "bfloat16", "--quantization", "none")
    assert "int4 groupwise" not in none["weight_formats"]


@requires_default_model
@pytest.mark.parametrize("int8_activations", [False, True])
def test_default_gguf_float32_estimate_equals_the_loaded_model(capsys, int8_activations):
    """A float32 run with the groups_f32 kernel (AVX2): the int4 and int8 groups, the int4
    layers' dense float32 fallback unless --int4-int8-activations (every call on the
    kernel), as the loaded model holds them."""
    import torch

    from radixlm.models import resolve_model_path
    from radixlm.models.linear import LinearPolicy
    from radixlm.models.linear.groups_f32 import groups_f32_usable
    from radixlm.models.loader import load_model
    from radixlm.planning.weight_estimate import module_bytes

    if not groups_f32_usable():
        pytest.skip("the groups_f32 kernel needs AVX2, FMA and F16C")
    flags = ["--int4-int8-activations"] if int8_activations else []
    code, plan = run_json(capsys, "--device", "cpu", "--device-memory", "4GiB",
                          "--dtype", "float32", "--quantization", "auto", *flags)
    assert code == 0
    model, _ = load_model(resolve_model_path(None), torch.float32, "cpu", linear_policy=
                          LinearPolicy("auto", int4_int8_activations=int8_activations))
    assert plan["weights"]["total_bytes"] == module_bytes(model)
    fallback = "dense float32 (fallback for large batches)"
    assert (fallback in plan["weight_formats"]) is not int8_activations


@pytest.mark.parametrize("name, params_b, tol_b", [
    ("qwen3-8b", 8.19, 0.01), ("qwen3-30b-a3b", 30.53, 0.01), ("mixtral-8x7b", 46.70, 0.01),
    ("gemma-3-270m", 0.268, 0.001)])
def test_new_families_plan_from_config_only(capsys, name, params_b, tol_b):
    """Published parameter counts, expert weights included (MoE: all experts are held)."""
    code, plan = run_json(capsys, "--model", os.path.join(FIXTURES, name),
                          "--device-memory", "141GiB")
    assert code == 0 and plan["weights"]["source"] == "config"
    assert abs(plan["weights"]["num_params"] / 1e9 - params_b) < tol_b
    assert plan["kv_tokens"] > 0


def test_mixtral_needs_two_80gb_gpus(capsys):
    model = os.path.join(FIXTURES, "mixtral-8x7b")
    code, plan = run_json(capsys, "--model", model, "--device-memory", "80GiB")
    assert code == 1 and plan["problems"][0]["pool"] == "weights"
    code, plan = run_json(capsys, "--model", model, "--device-memory", "80GiB", "--tp-size", "2")
    assert code == 0 and plan["kv_tokens"] > 0


def _tiny_family_checkpoints(base) -> dict[str, str]:
    import torch
    import transformers

    common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    configs = {
        "qwen3": transformers.Qwen3Config(**common, head_dim=16),
        "gemma3": transformers.Gemma3TextConfig(**common, head_dim=8, sliding_window=4,
                                                layer_types=["sliding_attention",
                                                             "full_attention"]),
        "qwen3_moe": transformers.Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                                 moe_intermediate_size=16, mlp_only_layers=[1]),
        "mixtral": transformers.MixtralConfig(**common, num_local_experts=4,
                                              num_experts_per_tok=2),
    }
    paths = {}
    for name, cfg in configs.items():
        path = os.path.join(str(base), name)
        transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
        paths[name] = path
    return paths


def test_new_family_estimates_equal_the_loaded_models(tmp_path):
    """From the safetensors headers and from config.json alone: the bytes the loaded
    model holds (two RoPE caches for Gemma 3, every expert and router for MoE)."""
    import torch

    from radixlm.planning.weight_estimate import module_bytes
    from radixlm.models.linear.method import onednn_prepack_available
    from radixlm.models.loader import load_model

    for name, path in _tiny_family_checkpoints(tmp_path).items():
        cfg = load_model_config(path)
        shapes, source, _ = checkpoint_shapes(path, cfg)
        # A tied head is prepacked (its own copy of the embedding) where oneDNN is there.
        packed = onednn_prepack_available(torch.float32, torch.device("cpu"))
        est = estimate_weights(shapes, cfg, 4, prepacked_head=packed)
        assert est.total_bytes == estimate_weights(config_tensor_shapes(cfg), cfg, 4,
                                                   prepacked_head=packed).total_bytes, name
        model, _ = load_model(path, torch.float32, "cpu")
        assert module_bytes(model) == est.total_bytes, name
        # TP=2 halves every projection, experts included (the router is replicated).
        tp2 = estimate_weights(shapes, cfg, 4, tp=2, prepacked_head=packed)
        router = sum(4 * s[0] * s[1] for n, s in shapes.items() if n.endswith(("mlp.gate.weight", "moe.gate.weight")))
        assert 2 * (tp2.linear_bytes - router) == est.linear_bytes - router, name
