"""Linear methods: one class per weight format, chosen per layer at load (policy.py)."""

from radixlm.models.linear.int4 import Int4GroupwiseLinear
from radixlm.models.linear.int4_groups import Int4Groups, QuantizedCheckpointTensor, as_dense
from radixlm.models.linear.int8 import Int8WeightOnlyLinear, quantize_per_channel_int8
from radixlm.models.linear.int8_groups import Int8Groups, Int8GroupwiseLinear
from radixlm.models.linear.method import (DenseLinear, LinearMethod, PrepackedLinear,
                                          SmallBatchQuantized)
from radixlm.models.linear.q5_bf16 import Q5GroupwiseLinear
from radixlm.models.linear.w8a8 import W8A8Int8Linear
from radixlm.models.linear.policy import (QUANTIZATIONS, LinearPolicy, apply_linear_policy,
                                          make_head_method, make_linear_method,
                                          weight_bytes_by_format)

__all__ = ["DenseLinear", "Int4Groups", "Int4GroupwiseLinear", "Int8Groups", "Int8GroupwiseLinear",
           "Int8WeightOnlyLinear",
           "LinearMethod", "LinearPolicy", "PrepackedLinear", "Q5GroupwiseLinear", "QUANTIZATIONS",
           "QuantizedCheckpointTensor", "SmallBatchQuantized", "W8A8Int8Linear",
           "apply_linear_policy", "as_dense", "make_head_method", "make_linear_method",
           "quantize_per_channel_int8",
           "weight_bytes_by_format"]
