"""Which attention backend a model gets: the triton kernels do not mask a sliding window,
so asking for them with a sliding-window model (Gemma 3) is a clear error and auto picks
the torch backend instead."""

from __future__ import annotations

import pytest
import torch

from radixlm.attention.factory import resolve_attention_backend_name


def test_triton_refuses_sliding_window_models_and_auto_avoids_it():
    with pytest.raises(ValueError, match="sliding-window"):
        resolve_attention_backend_name("triton", torch.device("cuda"), sliding_window=True)
    assert resolve_attention_backend_name("auto", torch.device("cuda"), sliding_window=True) == "torch"
    assert resolve_attention_backend_name("torch", torch.device("cpu"), sliding_window=True) == "torch"
    assert resolve_attention_backend_name("auto", torch.device("cpu")) == "torch"
