// Rotary position embedding of q and k in one pass, as one fused CPU kernel (forward and
// backward).
//
// ATen applies RoPE as a complex multiply per tensor (view_as_complex, mul by the broadcast
// rotations, view_as_real), and in backward multiplies by the conjugate through the complex
// autograd formulas. The fused kernel rotates q's and k's heads at each position with the
// position's cos/sin loaded once, and its backward is the same pass by the inverse angle; it
// saves nothing but the rotations. Split over positions on LibTorch's intra-op threads. On CUDA,
// loom's kernel where enabled (cuda.h). Anything else (not CPU, not float32, not contiguous, an odd
// or very wide head) takes the complex path.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace loom::models::kernels {

// q [bs, seq, q_heads, head_dim] and k [bs, seq, kv_heads, head_dim] rotated by freqs_cis
// [>= seq, head_dim / 2] (complex64), differentiable in q and k. With `halves`, q and k are in
// the rotate-half layout (pair p = elements p and p + head_dim / 2, Hugging Face's); the results
// are always in the interleaved pair layout (attention's dot products do not see the order, as
// long as q and k share it). loom's CUDA kernel reads the halves in place; elsewhere they are
// reordered first.
std::pair<at::Tensor, at::Tensor> rotary_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& freqs_cis, bool halves = false);

// True when rotary_qk takes the fused kernel for these inputs.
bool rotary_is_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& freqs_cis);

}  // namespace loom::models::kernels
