"""load_tokenizer: GGUF tokenizers are converted once and cached atomically."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import transformers
from gguf import GGUFWriter
from transformers.convert_slow_tokenizer import bytes_to_unicode

import radixlm.tokenizer.loader as tok_loader
from radixlm.tokenizer.loader import CACHE_ENV, gguf_cache_dir, load_tokenizer

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tokenizer_gguf(path: str) -> None:
    """A byte-level BPE (gpt2-style) vocabulary with a few merges and a chat template."""
    byte_chars = bytes_to_unicode()
    tokens = SPECIAL + [byte_chars[b] for b in range(256)] + ["he", "ll", "hell", "hello"]
    w = GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
    w.add_token_merges(["h e", "l l", "he ll", "hell o"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_chat_template(TEMPLATE)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def gguf_file(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = str(tmp_path / "model" / "tok.gguf")
    os.makedirs(os.path.dirname(path))
    write_tokenizer_gguf(path)
    return path


@pytest.fixture
def conversions(monkeypatch) -> list[str]:
    """Records every slow GGUF -> tokenizer conversion."""
    calls: list[str] = []
    real = transformers.AutoTokenizer.from_pretrained

    def spy(path, *args, **kwargs):
        if "gguf_file" in kwargs:
            calls.append(kwargs["gguf_file"])
        return real(path, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    return calls


def _check(tok) -> None:
    assert tok.encode("hello hell", add_special_tokens=False) == [262, 35, 261]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_converts_once_then_loads_from_cache(gguf_file, conversions):
    _check(load_tokenizer(gguf_file))
    assert conversions == ["tok.gguf"]
    cache = gguf_cache_dir(gguf_file)
    assert os.path.isdir(cache)
    assert not [n for n in os.listdir(os.path.dirname(cache)) if n.startswith(".tmp")]
    _check(load_tokenizer(gguf_file))
    assert conversions == ["tok.gguf"]  # second load came from the cache


def test_cached_entry_loads_as_autotokenizer_would_without_torch(gguf_file):
    """A later start loads the saved entry through the class AutoTokenizer resolves, in a
    helper process (the detokenizer) without importing torch."""
    load_tokenizer(gguf_file)  # converts and saves
    cache = gguf_cache_dir(gguf_file)
    auto = transformers.AutoTokenizer.from_pretrained(cache, local_files_only=True)
    assert type(load_tokenizer(gguf_file)) is type(auto)
    code = ("import sys\n"
            "from radixlm.tokenizer.loader import load_tokenizer\n"
            f"tok = load_tokenizer({gguf_file!r})\n"
            "print('torch' in sys.modules, tok.encode('hello hell', add_special_tokens=False))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "False [262, 35, 261]"


def test_cache_key_follows_the_file(gguf_file):
    before = gguf_cache_dir(gguf_file)
    st = os.stat(gguf_file)
    os.utime(gguf_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert gguf_cache_dir(gguf_file) != before


def test_lost_race_keeps_the_winner_and_cleans_up(gguf_file, monkeypatch):
    real_rename = os.rename

    def someone_else_finished_first(src: str, dst: str) -> None:
        # Another process renamed its (identical) copy into place just before us.
        shutil.copytree(src, dst)
        open(os.path.join(dst, "winner"), "w").close()
        real_rename(src, dst)  # raises: the target exists and is not empty

    monkeypatch.setattr(tok_loader.os, "rename", someone_else_finished_first)
    _check(load_tokenizer(gguf_file))
    cache = gguf_cache_dir(gguf_file)
    assert "winner" in os.listdir(cache)  # the first entry was kept, not overwritten
    assert os.listdir(os.path.dirname(cache)) == [os.path.basename(cache)]  # temp dir removed


def test_hf_directory_and_tokenizer_override(gguf_file, tmp_path):
    hf_dir = str(tmp_path / "hf_tok")
    load_tokenizer(gguf_file).save_pretrained(hf_dir)
    _check(load_tokenizer(hf_dir))
    _check(load_tokenizer("/nonexistent/model.gguf", tokenizer_path=hf_dir))
    with pytest.raises(FileNotFoundError):
        load_tokenizer(str(tmp_path / "missing"))
