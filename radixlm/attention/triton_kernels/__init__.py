"""Triton kernels for the triton attention backend (radixlm/attention/triton_backend.py).

Importing this package imports triton; callers check `triton_available()` in
radixlm/attention/base.py first. On the CPU the kernels run only under TRITON_INTERPRET=1.
"""

from radixlm.attention.triton_kernels.decode_attention import decode_attention_fwd
from radixlm.attention.triton_kernels.extend_attention import extend_attention_fwd

__all__ = ["decode_attention_fwd", "extend_attention_fwd"]
