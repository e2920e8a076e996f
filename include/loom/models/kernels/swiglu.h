// SwiGLU's gate, silu(a) * b, as one fused CPU kernel (forward and backward).
//
// Eager ATen computes silu(a) into a temporary, multiplies it by b, and in backward runs three
// more passes (g * b, silu_backward, g * silu(a)) and keeps silu(a) alive for backward. The fused
// kernel reads a and b once in forward and a, b and the incoming gradient once in backward,
// writing both gradients in the same pass; it saves only a and b. Each pass is vectorized with
// ATen's Vectorized<float> and compiled per instruction set (DEFAULT, AVX2, AVX-512, chosen at
// run time like ATen's own kernels: at::get_cpu_capability(), ATEN_CPU_CAPABILITY), and split
// over LibTorch's intra-op threads with at::parallel_for.
//
// The arithmetic is ATen's, operation for operation (silu = a / (1 + exp(-a)); silu's gradient
// = dy * s * (1 + a * (1 - s))), so results equal the unfused ops on the same instruction set
// up to the last bit of elements at vector tails (ATen finishes those in scalar code); training
// losses measured bitwise equal (docs/performance.md). Anything else (not CPU, not float32,
// shapes or layouts that differ) takes the unfused ATen composition.
#pragma once

#include <ATen/core/Tensor.h>

namespace loom::models::kernels {

// silu(a) * b, differentiable in a and b.
at::Tensor swiglu(const at::Tensor& a, const at::Tensor& b);

// True when swiglu(a, b) takes the fused kernel for these inputs.
bool swiglu_is_fused(const at::Tensor& a, const at::Tensor& b);

}  // namespace loom::models::kernels
