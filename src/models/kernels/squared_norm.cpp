#include "loom/models/kernels/squared_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include "dispatch.h"
#include "loom/models/kernels/cuda.h"
#include "squared_norm_kernel.h"

namespace loom::models::kernels {
namespace {

bool takes_kernel(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

// One block of a tensor: the unit of work and of the summation order.
struct Block {
  const float* data;
  int64_t count;
};

}  // namespace

at::Tensor squared_norm(const std::vector<at::Tensor>& tensors) {
  RECORD_FUNCTION("loom::kernel_squared_norm", std::vector<c10::IValue>{});
  const at::Device device = tensors.empty() ? at::Device(at::kCPU) : tensors.front().device();
  const auto options = at::TensorOptions().dtype(at::kDouble).device(device);
  std::vector<Block> blocks;
  std::vector<at::Tensor> others, on_cuda;
  const bool cuda_on = enabled_cuda_kernels() != nullptr;
  for (const at::Tensor& t : tensors) {
    if (cuda_on && cuda_kernel_tensor(t) && t.device() == device) {
      on_cuda.push_back(t);
      continue;
    }
    if (!takes_kernel(t)) {
      others.push_back(t);
      continue;
    }
    const float* data = t.const_data_ptr<float>();
    for (int64_t begin = 0; begin < t.numel(); begin += kKernelGrain) {
      blocks.push_back({data + begin, std::min(kKernelGrain, t.numel() - begin)});
    }
  }
  std::vector<double> partial(blocks.size(), 0.0);
  static const auto fn = LOOM_PICK_KERNEL(sum_of_squares);
  at::parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) partial[b] = fn(blocks[b].data, blocks[b].count);
  });
  double sum = 0;
  for (double p : partial) sum += p;
  at::Tensor total = at::full({1}, sum, options);
  if (!on_cuda.empty()) total += cuda_kernels()->squared_norm(on_cuda);
  if (!others.empty()) total += at::stack(at::_foreach_norm(others, 2, at::kDouble)).pow(2).sum();
  return total;
}

bool clip_on_device(const std::vector<at::Tensor>& grads, const at::Tensor& squared_total,
                    double max_norm) {
  const CudaKernels* kernels = enabled_cuda_kernels();
  if (kernels == nullptr || grads.empty() || !squared_total.is_cuda()) return false;
  for (const at::Tensor& g : grads) {
    if (!cuda_kernel_tensor(g) || g.device() != squared_total.device()) return false;
  }
  RECORD_FUNCTION("loom::kernel_clip", std::vector<c10::IValue>{});
  kernels->clip(grads, squared_total, max_norm);
  return true;
}

}  // namespace loom::models::kernels
