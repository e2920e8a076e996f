// The tensor side of loom's CUDA kernels, built into bin/libloom_cuda.so: shapes, outputs and the
// stream for the launches of launch.h. Exports `loom_cuda_kernels`, which the models' seam finds
// in the loaded library (src/models/kernels/cuda_seam.cpp).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <stdexcept>

#include "kernel_math.h"
#include "launch.h"
#include "loom/models/kernels/cuda.h"
#include "tensor_launch.h"

namespace loom::models::kernels {
namespace {

namespace launch = cuda_launch;

launch::Dtype dtype_of(const at::Tensor& t) {
  return launch::dtype_of(t, "loom CUDA kernels");
}

// Row kernels launch one block per row: a grid's x dimension holds at most 2^31 - 1.
int64_t checked_rows(int64_t rows) {
  if (rows > 0x7fffffff) {
    throw std::invalid_argument("loom CUDA kernels: " + std::to_string(rows) +
                                " rows exceed one launch's 2^31 - 1 blocks");
  }
  return rows;
}

using launch::stream_of;

const void* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr() : nullptr;
}

// Tensors of one dtype in launches of at most kMaxTensorsPerLaunch, in their order.
std::vector<launch::TensorList> batches_of(const std::vector<at::Tensor>& tensors) {
  std::vector<launch::TensorList> batches;
  for (const at::Tensor& t : tensors) {
    if (batches.empty() || batches.back().count == launch::kMaxTensorsPerLaunch) {
      batches.emplace_back();
    }
    launch::TensorList& list = batches.back();
    list.data[list.count] = t.data_ptr();
    list.numel[list.count] = t.numel();
    ++list.count;
  }
  return batches;
}

// Groups `tensors` by dtype, keeping their order within each.
std::map<launch::Dtype, std::vector<at::Tensor>> by_dtype(const std::vector<at::Tensor>& tensors) {
  std::map<launch::Dtype, std::vector<at::Tensor>> groups;
  for (const at::Tensor& t : tensors) {
    if (t.numel() > 0) groups[dtype_of(t)].push_back(t);
  }
  return groups;
}

class CudaKernelsLibrary final : public CudaKernels {
 public:
  NormOutputs rms_norm_forward(const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps) const override {
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t dim = x.size(-1), rows = checked_rows(x.numel() / dim);
    NormOutputs out;
    out.sum = delta.defined() ? at::empty_like(x) : at::Tensor();
    out.y = at::empty_like(x);
    out.rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    launch::rms_norm_forward(
        dtype_of(x), dtype_of(weight), x.const_data_ptr(), data_or_null(delta),
        weight.const_data_ptr(), out.sum.defined() ? out.sum.data_ptr() : nullptr, out.y.data_ptr(),
        out.rstd.mutable_data_ptr<float>(), rows, dim, static_cast<float>(eps), stream_of(x));
    return out;
  }

  std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad, const at::Tensor& s,
                                                      const at::Tensor& weight,
                                                      const at::Tensor& rstd,
                                                      const at::Tensor& grad_residual, bool want_s,
                                                      bool want_weight) const override {
    const c10::cuda::CUDAGuard guard(s.device());
    const int64_t dim = s.size(-1), rows = checked_rows(s.numel() / dim);
    at::Tensor grad_s = want_s ? at::empty_like(s) : at::Tensor();
    at::Tensor partials, grad_w;
    if (want_weight) {
      const int64_t chunks = (rows + cuda_math::kGradWeightRows - 1) / cuda_math::kGradWeightRows;
      partials = at::empty({chunks, dim}, s.options().dtype(at::kFloat));
      grad_w = at::empty({dim}, s.options().dtype(at::kFloat));
    }
    const at::Tensor residual =
        want_s && grad_residual.defined() ? grad_residual.contiguous() : at::Tensor();
    launch::rms_norm_backward(
        dtype_of(s), dtype_of(weight), grad.const_data_ptr(), s.const_data_ptr(),
        weight.const_data_ptr(), rstd.const_data_ptr<float>(), data_or_null(residual),
        want_s ? grad_s.data_ptr() : nullptr,
        want_weight ? partials.mutable_data_ptr<float>() : nullptr,
        want_weight ? grad_w.mutable_data_ptr<float>() : nullptr, rows, dim, stream_of(s));
    if (want_weight && weight.scalar_type() != at::kFloat) grad_w = grad_w.to(weight.scalar_type());
    return {grad_s, grad_w};
  }

  at::Tensor swiglu_forward(const at::Tensor& a, const at::Tensor& b) const override {
    const c10::cuda::CUDAGuard guard(a.device());
    at::Tensor out = at::empty_like(a);
    launch::swiglu_forward(dtype_of(a), a.const_data_ptr(), b.const_data_ptr(), out.data_ptr(),
                           a.numel(), stream_of(a));
    return out;
  }

  std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& a,
                                                    const at::Tensor& b) const override {
    const c10::cuda::CUDAGuard guard(a.device());
    at::Tensor grad_a = at::empty_like(a), grad_b = at::empty_like(b);
    launch::swiglu_backward(dtype_of(a), grad.const_data_ptr(), a.const_data_ptr(),
                            b.const_data_ptr(), grad_a.data_ptr(), grad_b.data_ptr(), a.numel(),
                            stream_of(a));
    return {grad_a, grad_b};
  }

  std::pair<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& rotation, bool halves_in,
                                           bool halves_out, float sign) const override {
    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor q_out = at::empty_like(q), k_out = at::empty_like(k);
    launch::rotary(dtype_of(q), q.const_data_ptr(), k.const_data_ptr(),
                   rotation.const_data_ptr<float>(), q_out.data_ptr(), k_out.data_ptr(), q.size(0),
                   q.size(1), q.size(2), k.size(2), q.size(3), halves_in, halves_out, sign,
                   stream_of(q));
    return {q_out, k_out};
  }

  std::pair<at::Tensor, at::Tensor> cross_entropy_forward(const at::Tensor& logits,
                                                          const at::Tensor& labels,
                                                          int64_t ignore_index) const override {
    const c10::cuda::CUDAGuard guard(logits.device());
    const int64_t rows = checked_rows(logits.size(0)), vocab = logits.size(1);
    const auto floats = logits.options().dtype(at::kFloat);
    at::Tensor row_loss = at::empty({rows}, floats), lse = at::empty({rows}, floats);
    launch::cross_entropy_forward(dtype_of(logits), logits.const_data_ptr(),
                                  labels.const_data_ptr<int64_t>(), rows, vocab, ignore_index,
                                  row_loss.mutable_data_ptr<float>(), lse.mutable_data_ptr<float>(),
                                  stream_of(logits));
    // The rows' losses summed in float64 (ATen's reduction: a fixed order on the device).
    return {row_loss.sum(at::kDouble).to(at::kFloat), lse};
  }

  at::Tensor cross_entropy_backward(const at::Tensor& logits, const at::Tensor& labels,
                                    const at::Tensor& lse, const at::Tensor& grad_scale,
                                    int64_t ignore_index, bool in_place) const override {
    const c10::cuda::CUDAGuard guard(logits.device());
    at::Tensor grad = in_place ? logits : at::empty_like(logits);
    const at::Tensor scale = grad_scale.to(at::kFloat).contiguous();
    launch::cross_entropy_backward(dtype_of(logits), logits.const_data_ptr(),
                                   labels.const_data_ptr<int64_t>(), lse.const_data_ptr<float>(),
                                   scale.const_data_ptr<float>(), logits.size(0), logits.size(1),
                                   ignore_index, grad.data_ptr(), stream_of(logits));
    return grad;
  }

  at::Tensor squared_norm(const std::vector<at::Tensor>& tensors) const override {
    const at::Device device = tensors.front().device();
    const c10::cuda::CUDAGuard guard(device);
    const auto doubles = at::TensorOptions().dtype(at::kDouble).device(device);
    const auto groups = by_dtype(tensors);
    int64_t counted = 0;
    for (const auto& [dtype, group] : groups) counted += static_cast<int64_t>(group.size());
    at::Tensor total = at::zeros({1}, doubles);
    if (counted == 0) return total;
    at::Tensor partials = at::empty({counted * launch::kSquaredNormBlocksPerTensor}, doubles);
    double* out = partials.mutable_data_ptr<double>();
    const cudaStream_t stream = stream_of(tensors.front());
    for (const auto& [dtype, group] : groups) {
      for (const launch::TensorList& batch : batches_of(group)) {
        launch::squared_norm_partials(dtype, batch, out, stream);
        out += static_cast<int64_t>(batch.count) * launch::kSquaredNormBlocksPerTensor;
      }
    }
    launch::sum_partials(partials.const_data_ptr<double>(), partials.numel(),
                         total.mutable_data_ptr<double>(), stream);
    return total;
  }

  void clip(const std::vector<at::Tensor>& tensors, const at::Tensor& squared_total,
            double max_norm) const override {
    if (tensors.empty()) return;
    const c10::cuda::CUDAGuard guard(tensors.front().device());
    const at::Tensor total = squared_total.to(at::kDouble).contiguous();
    const cudaStream_t stream = stream_of(tensors.front());
    for (const auto& [dtype, group] : by_dtype(tensors)) {
      for (const launch::TensorList& batch : batches_of(group)) {
        launch::clip_by_total(dtype, batch, total.const_data_ptr<double>(), max_norm, stream);
      }
    }
  }

  std::string device_support(int index) const override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    const cudaError_t status = launch::kernel_image_status();
    if (status == cudaSuccess) return "";
    cudaDeviceProp properties{};
    const bool known = cudaGetDeviceProperties(&properties, index) == cudaSuccess;
    (void)cudaGetLastError();
    const std::string arch =
        known ? "sm_" + std::to_string(properties.major) + std::to_string(properties.minor) : "?";
    return "loom's CUDA kernels cannot run on cuda:" + std::to_string(index) + " (" +
           (known ? std::string(properties.name) + ", " : std::string()) + arch +
           "): " + cudaGetErrorString(status) + "; rebuild with -DLOOM_CUDA_ARCHITECTURES naming " +
           arch.substr(arch.find('_') + 1) + " (this build's: " LOOM_CUDA_ARCHITECTURES_TEXT ")";
  }
};

}  // namespace
}  // namespace loom::models::kernels

extern "C" __attribute__((visibility("default"))) const loom::models::kernels::CudaKernels*
loom_cuda_kernels() {
  static const loom::models::kernels::CudaKernelsLibrary kernels;
  return &kernels;
}
