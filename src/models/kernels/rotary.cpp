#include "loom/models/kernels/rotary.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "dispatch.h"
#include "loom/models/common/rope.h"
#include "loom/models/kernels/cuda.h"
#include "rotary_kernel.h"

namespace loom::models::kernels {
namespace {

// Rotates q and k (same bs, seq, head_dim) into new tensors; sign -1 is the inverse rotation.
std::pair<at::Tensor, at::Tensor> rotate(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& rotation, float sign) {
  const int64_t bs = q.size(0), seq = q.size(1), q_heads = q.size(2), k_heads = k.size(2);
  const int64_t head_dim = q.size(3);
  at::Tensor q_out = at::empty_like(q), k_out = at::empty_like(k);
  const float* pq = q.const_data_ptr<float>();
  const float* pk = k.const_data_ptr<float>();
  const float* pr = rotation.const_data_ptr<float>();
  float* pqo = q_out.mutable_data_ptr<float>();
  float* pko = k_out.mutable_data_ptr<float>();
  static const auto fn = LOOM_PICK_KERNEL(rotate_heads);
  const int64_t per_position = (q_heads + k_heads) * head_dim;
  const int64_t grain = rows_per_task(per_position);
  at::parallel_for(0, bs * seq, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {  // t = b * seq + s
      const float* rot = pr + (t % seq) * head_dim;
      fn(pq + t * q_heads * head_dim, rot, pqo + t * q_heads * head_dim, q_heads, head_dim, sign);
      fn(pk + t * k_heads * head_dim, rot, pko + t * k_heads * head_dim, k_heads, head_dim, sign);
    }
  });
  return {q_out, k_out};
}

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& rotation, bool halves) {
    RECORD_FUNCTION("loom::kernel_rotary", std::vector<c10::IValue>{});
    ctx->save_for_backward({rotation});
    ctx->saved_data["halves"] = halves;
    // CUDA reads the rotate-half layout in place; the result is in pairs, as on the CPU path.
    auto [q_out, k_out] =
        q.is_cuda() ? cuda_kernels()->rotary(q, k, rotation, halves, /*halves_out=*/false, 1.0f)
                    : rotate(q, k, rotation, 1.0f);
    return {q_out, k_out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("loom::kernel_rotary_backward", std::vector<c10::IValue>{});
    const at::Tensor rotation = ctx->get_saved_variables()[0];
    // An output that reached no loss arrives as zeros (autograd materializes undefined
    // gradients of custom functions).
    const at::Tensor gq = grads[0].contiguous(), gk = grads[1].contiguous();
    const bool halves = ctx->saved_data["halves"].toBool();
    auto [dq, dk] =
        gq.is_cuda() ? cuda_kernels()->rotary(gq, gk, rotation, /*halves_in=*/false, halves, -1.0f)
                     : rotate(gq, gk, rotation, -1.0f);
    return {dq, dk, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool rotary_is_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& freqs_cis) {
  if (enabled_cuda_kernels() != nullptr && cuda_kernel_tensor(q) && cuda_kernel_tensor(k)) {
    return q.dim() == 4 && k.dim() == 4 && q.device() == k.device() &&
           q.scalar_type() == k.scalar_type() && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
           q.size(3) == k.size(3) && q.size(3) % 2 == 0 && freqs_cis.device() == q.device() &&
           freqs_cis.scalar_type() == at::kComplexFloat && freqs_cis.dim() == 2 &&
           freqs_cis.size(0) >= q.size(1) && freqs_cis.size(1) == q.size(3) / 2;
  }
  auto float_cpu = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
           t.dim() == 4;
  };
  return float_cpu(q) && float_cpu(k) && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
         q.size(3) == k.size(3) && q.size(3) % 2 == 0 && q.size(3) <= kRotaryMaxHeadDim &&
         freqs_cis.device().is_cpu() && freqs_cis.scalar_type() == at::kComplexFloat &&
         freqs_cis.dim() == 2 && freqs_cis.size(0) >= q.size(1) &&
         freqs_cis.size(1) == q.size(3) / 2 && q.numel() > 0 && k.numel() > 0;
}

std::pair<at::Tensor, at::Tensor> rotary_qk(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& freqs_cis, bool halves) {
  const bool fused = rotary_is_fused(q, k, freqs_cis);
  if (halves && !(fused && q.is_cuda())) {
    return rotary_qk(halves_to_pairs(q), halves_to_pairs(k), freqs_cis, false);
  }
  if (!fused) return {apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)};
  // [seq, head_dim / 2] complex -> [seq, head_dim] floats (c0, s0, c1, s1, ...).
  const at::Tensor rotation =
      at::view_as_real(freqs_cis.slice(0, 0, q.size(1))).contiguous().view({q.size(1), -1});
  auto outs = RotaryFunction::apply(q, k, rotation, halves);
  return {outs[0], outs[1]};
}

}  // namespace loom::models::kernels
