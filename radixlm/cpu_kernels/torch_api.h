// The part of torch's C++ API the kernels of this folder use (at::Tensor, at::empty,
// at::parallel_for, the pybind11 casters of tensors and optionals, op registration),
// included in place of <torch/extension.h>: that header pulls in the whole C++ frontend
// (autograd, nn, optim, jit), whose parsing was most of a kernel's build (~26 s of g++
// user time of 30-45 s). Not <ATen/TensorOperators.h> either (tensor arithmetic as
// operators: 75k of 372k preprocessed lines, ~3 s of a ~17 s build): kernels call the
// Tensor methods (`t.mul_(s)`) where they need arithmetic at all.
// `torch::` names what it names under <torch/extension.h> (torch/types.h: `using
// namespace at`), so the kernels' code is unchanged.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>  // tensor casters, `namespace py = pybind11`
#if RADIXLM_TORCH_OPS
// TORCH_LIBRARY_IMPL: the build load_kernel loads registers the kernel's entries as the
// torch ops models/ and cpu_kernels/ops.py define (cpu_kernels/kernel_ops.py).
#include <torch/library.h>
#endif

namespace torch {
using namespace at;  // NOLINT: as torch/types.h
}  // namespace torch
