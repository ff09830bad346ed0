"""The triton attention kernels compile for the GPU (sm_90, bf16) on a machine without one.

The interpreter tests (test_triton_attention.py) check the numbers; this checks that the
real compiler accepts the kernels (types, tl.dot shapes), in a subprocess because the
interpreter flag must be off when triton's jit decorators run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from radixlm.attention.factory import triton_available


@pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install triton)")
def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "radixlm.attention.triton_kernels.compile_check", "--arch", "90",
         "--dtype", "bf16"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for kernel in ("decode_stage1", "decode_stage2", "extend"):
        assert f"compiled {kernel}[bf16] for sm_90" in proc.stdout
