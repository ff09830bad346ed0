"""load_tokenizer: a transformers tokenizer for a local HF directory or a .gguf file.

Building a tokenizer from GGUF metadata is slow (transformers parses the whole file and
converts the vocabulary: ~6-11 s for SmolLM2 on a small CPU), so the result is saved in
HF format under a cache directory keyed by the file's identity and loaded from there
afterwards (~0.3 s), through the class it names rather than AutoTokenizer, which imports
torch (the detokenizer needs none). A GGUF without a chat template gets its family's
(tokenizer/family_templates.py) before it is saved. The cache entry is written to a
temporary directory and renamed into place, so concurrent first starts never see (or
leave) a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import transformers
from transformers import PreTrainedTokenizerBase

from radixlm.runtime.cache_dir import CACHE_ENV, cache_root as radixlm_cache_root  # noqa: F401
from radixlm.tokenizer.family_templates import default_chat_template


def cache_root() -> str:
    """Converted tokenizers: `radixlm_cache_root()/tokenizers`."""
    return str(radixlm_cache_root() / "tokenizers")


def load_tokenizer(model_path: str, tokenizer_path: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of `tokenizer_path` if given, else of `model_path`.

    Either may be an HF directory (tokenizer.json / tokenizer_config.json, chat template
    included) or a .gguf file (tokenizer.ggml.* and tokenizer.chat_template metadata).
    Local paths only: nothing is ever downloaded.
    """
    path = os.path.abspath(os.path.expanduser(tokenizer_path or model_path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"tokenizer path {path!r} does not exist")
    if path.endswith(".gguf"):
        return _load_gguf_tokenizer(path)
    return _auto_tokenizer(path)


def gguf_cache_dir(gguf_path: str) -> str:
    """The cache entry of one GGUF file: a new file (size or mtime) or a new transformers
    (whose saved format or conversion may differ) gets a new entry."""
    st = os.stat(gguf_path)
    key = f"{gguf_path}\0{st.st_size}\0{st.st_mtime_ns}\0{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return os.path.join(cache_root(), digest)


def _load_saved(cached: str) -> PreTrainedTokenizerBase:
    """A cache entry through the fast class its tokenizer_config.json names (its "Fast"
    variant first, as AutoTokenizer picks), when transformers exports one
    (TokenizersBackend, a family's tokenizer): AutoTokenizer would resolve the same class
    but imports torch on the way (~2 s of CPU in a process that needs none)."""
    with open(os.path.join(cached, "tokenizer_config.json")) as f:
        name = json.load(f).get("tokenizer_class")
    if isinstance(name, str):
        for candidate in dict.fromkeys((name.removesuffix("Fast") + "Fast", name)):
            cls = getattr(transformers, candidate, None)
            if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedTokenizerFast):
                return cls.from_pretrained(cached, local_files_only=True)
    return _auto_tokenizer(cached)


def _auto_tokenizer(path: str, **kw) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer  # (imports torch)

    return AutoTokenizer.from_pretrained(path, local_files_only=True, **kw)


def _load_gguf_tokenizer(gguf_path: str) -> PreTrainedTokenizerBase:
    cached = gguf_cache_dir(gguf_path)
    if os.path.isdir(cached):
        return _load_saved(cached)
    tokenizer = _auto_tokenizer(os.path.dirname(gguf_path),
                                gguf_file=os.path.basename(gguf_path))
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = default_chat_template(_gguf_arch(gguf_path))
    _save_atomically(tokenizer, cached)
    # Load the saved copy rather than return the converted one, so the first start and
    # every later one use the exact same tokenizer.
    return _load_saved(cached)


def _gguf_arch(gguf_path: str) -> str | None:
    from radixlm.models.gguf_loader import open_gguf

    field = open_gguf(gguf_path).fields.get("general.architecture")
    return None if field is None else field.contents()


def _save_atomically(tokenizer: PreTrainedTokenizerBase, target: str) -> None:
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)  # atomic on POSIX; fails if another process won the race
        except OSError:
            if not os.path.isdir(target):
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
