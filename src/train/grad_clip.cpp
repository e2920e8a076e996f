#include "loom/train/grad_clip.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"
#include "loom/models/kernels/squared_norm.h"

namespace loom::train {

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& tensors,
                          const std::vector<parallel::Placement>& placements, double max_norm,
                          distributed::Comm* all_ranks) {
  LOOM_CHECK(tensors.size() == placements.size(), "clip_grad_norm: ", tensors.size(), " tensors, ",
             placements.size(), " placements");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads, counted;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& grad = tensors[i].grad();
    if (!grad.defined()) continue;
    grads.push_back(grad);
    if (placements[i].replica_rank() == 0) counted.push_back(grad);
  }
  const at::Device device = grads.empty() ? at::Device(at::kCPU) : grads.front().device();
  // In float64: a float32 sum of squares over a million-element gradient is off by ~1e-4,
  // enough to make runs that differ only in layout clip differently.
  at::Tensor squared = counted.empty()
                           ? at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device))
                           : models::kernels::squared_norm(counted);
  if (all_ranks != nullptr && all_ranks->size() > 1) all_ranks->all_reduce(squared);
  at::Tensor total = squared.sqrt().squeeze(0);
  if (max_norm > 0 && models::kernels::clip_on_device(grads, squared, max_norm)) return total;
  if (max_norm > 0 && !grads.empty()) {
    // min(1, max_norm / (norm + 1e-6)), and 1 for an infinite or NaN norm (left to the caller).
    at::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
    coef = at::where(at::isfinite(total), coef, at::ones_like(coef));
    // Reading it costs no synchronization on CPU, and a scale by exactly 1 changes no bit: skip
    // that pass over every gradient.
    if (device.is_cpu() && coef.item<double>() == 1.0) return total;
    at::_foreach_mul_(grads, coef);
  }
  return total;
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  std::vector<parallel::Placement> whole;
  whole.reserve(parameters.size());
  for (const auto& p : parameters) whole.push_back(parallel::Placement::whole(p.sizes()));
  return clip_grad_norm(parameters, whole, max_norm, nullptr).item<double>();
}

at::Tensor nonfinite_skip_flag(const at::Tensor& grad_norm, int64_t limit) {
  if (limit <= 0) return {};
  return at::logical_not(at::isfinite(grad_norm)).to(at::kFloat).reshape({});
}

}  // namespace loom::train
