"""radixlm's torch dequantizers (models/gguf_dequant.py) equal the `gguf` package's bit
for bit, for every block type they implement: on random blocks (any byte pattern, f16
scales kept finite) and, when installed, on every such tensor of the real Gemma 3 270M."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize

from radixlm.models import gguf_dequant
from tests.conftest import gemma3_270m_path, requires_gemma3_270m

# type -> (bytes per block, byte offsets of its f16 scales)
LAYOUTS = {T.Q8_0: (34, [0]), T.Q5_0: (22, [0]), T.Q4_K: (144, [0, 2]),
           T.Q5_K: (176, [0, 2]), T.Q6_K: (210, [208])}


def _random_blocks(t: T, n_blocks: int, seed: int) -> np.ndarray:
    size, f16_offsets = LAYOUTS[t]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in f16_offsets:  # finite scales of either sign, magnitudes 1e-4 .. 1
        scale = (rng.uniform(-1, 1, n_blocks) * 10.0 ** rng.uniform(-4, 0, n_blocks))
        raw[:, off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


@pytest.mark.parametrize("t", list(LAYOUTS), ids=lambda t: t.name)
def test_random_blocks_equal_gguf(t):
    per = gguf_dequant._BLOCK_WEIGHTS[t]
    rows, blocks_per_row = 6, 3
    raw = _random_blocks(t, rows * blocks_per_row, seed=int(t))
    data = raw.reshape(rows, -1)  # GGUF's [rows, row bytes] layout
    want = gguf_dequantize(data, t).reshape(rows, blocks_per_row * per)
    got = gguf_dequant.dequantize(data, t, (rows, blocks_per_row * per))
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.from_numpy(np.ascontiguousarray(want)))


def test_unsupported_types_fall_back_to_gguf():
    data = np.arange(8, dtype=np.float16)
    got = gguf_dequant.dequantize(data.view(np.uint8), T.F16, (2, 4))
    assert torch.equal(got, torch.arange(8, dtype=torch.float32).view(2, 4))


@pytest.mark.slow
@requires_gemma3_270m
def test_every_quantized_tensor_of_gemma3_270m_equals_gguf():
    from radixlm.models.gguf_loader import open_gguf

    seen = set()
    for tensor in open_gguf(gemma3_270m_path()).tensors:
        if not gguf_dequant.supported(tensor.tensor_type):
            continue
        seen.add(tensor.tensor_type)
        shape = tuple(int(d) for d in reversed(tensor.shape))
        want = gguf_dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        got = gguf_dequant.dequantize(tensor.data, tensor.tensor_type, shape)
        assert torch.equal(got, torch.from_numpy(np.ascontiguousarray(want))), tensor.name
    assert seen == {T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K}  # the file has no Q5_K
