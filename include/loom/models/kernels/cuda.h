// loom's CUDA kernels: RMSNorm with the residual add fused, SwiGLU, RoPE on q and k (both
// layouts), cross-entropy fused with the log-softmax, and the gradient norm with its clip. Each
// has its backward. They are compiled by nvcc (src/models/kernels/cuda/*.cu) into
// bin/libloom_cuda.so, which loom loads where a GPU may be (include/loom/core/cuda_support.h).
//
// They sit behind the same seam as the fused CPU kernels: kernels::rms_norm, swiglu, rotary_qk,
// cross_entropy_sum, squared_norm and the clip take them for CUDA tensors of float32 or bfloat16
// when they are enabled, and the ATen composition otherwise. They are opt-in
// (`training.cuda_kernels`) until their `cuda` tests (tests/unit/test_cuda_kernels.cpp) have
// passed on a lent GPU and docs/performance.md records it. Their arithmetic is shared with a CPU
// replay of each kernel's threads (src/models/kernels/cuda/replay.h), which the default suite
// tests against ATen.
//
// Numerics: loads in the tensors' dtype, arithmetic in float32 (float64 for the squared norm),
// one rounding at each store; reductions in a fixed order (same result every run).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace loom::models::kernels {

// The kernels' entry points on tensors (CUDA, contiguous, float32 or bfloat16, checked by the
// callers in this folder); each launches on the current stream of the tensors' device.
class CudaKernels {
 public:
  virtual ~CudaKernels() = default;

  struct NormOutputs {
    at::Tensor sum;   // x + delta (undefined without delta)
    at::Tensor y;     // the norm's output
    at::Tensor rstd;  // float32 [rows]
  };
  // delta may be undefined; weight in x's dtype (the kernel also reads a float32 weight).
  virtual NormOutputs rms_norm_forward(const at::Tensor& x, const at::Tensor& delta,
                                       const at::Tensor& weight, double eps) const = 0;
  // (grad of the normed input plus grad_residual where defined, grad of the weight in its dtype),
  // each only where wanted.
  virtual std::pair<at::Tensor, at::Tensor> rms_norm_backward(
      const at::Tensor& grad, const at::Tensor& s, const at::Tensor& weight, const at::Tensor& rstd,
      const at::Tensor& grad_residual, bool want_s, bool want_weight) const = 0;

  virtual at::Tensor swiglu_forward(const at::Tensor& a, const at::Tensor& b) const = 0;
  virtual std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad,
                                                            const at::Tensor& a,
                                                            const at::Tensor& b) const = 0;

  // rotation: float32 [>= seq, head_dim] (cos, sin of each pair); sign -1 rotates back. Pairs
  // are read in the rotate-half layout where halves_in, written in it where halves_out (else
  // the interleaved layout).
  virtual std::pair<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& rotation, bool halves_in,
                                                   bool halves_out, float sign) const = 0;

  // (the loss summed over rows, a float32 0-d tensor; each row's logsumexp, float32 [rows]).
  virtual std::pair<at::Tensor, at::Tensor> cross_entropy_forward(const at::Tensor& logits,
                                                                  const at::Tensor& labels,
                                                                  int64_t ignore_index) const = 0;
  // grad_scale: a one-element float32 tensor on the device (read there). in_place writes the
  // gradient over `logits` and returns it.
  virtual at::Tensor cross_entropy_backward(const at::Tensor& logits, const at::Tensor& labels,
                                            const at::Tensor& lse, const at::Tensor& grad_scale,
                                            int64_t ignore_index, bool in_place) const = 0;

  // sum of x^2 over every element, float64 [1] on the tensors' device.
  virtual at::Tensor squared_norm(const std::vector<at::Tensor>& tensors) const = 0;
  // Scales every tensor in place by min(1, max_norm / (sqrt(squared_total) + 1e-6)) (1 when not
  // finite), computed on the device from squared_total (float64, one element).
  virtual void clip(const std::vector<at::Tensor>& tensors, const at::Tensor& squared_total,
                    double max_norm) const = 0;

  // Empty when the kernels run on CUDA device `index` (this build holds an image for its
  // architecture: LOOM_CUDA_ARCHITECTURES), else why not, naming the architecture. The float8
  // casts of the same library answer alike.
  virtual std::string device_support(int index) const = 0;
};

// The kernels in the loaded CUDA support library; null where it is not built, not loaded, or
// built without the kernels (no nvcc at configure).
const CudaKernels* cuda_kernels();

// The switch `training.cuda_kernels` sets (off by default).
void set_cuda_kernels_enabled(bool enabled);
bool cuda_kernels_enabled();

// cuda_kernels() when enabled, else null: what the seam's functions ask.
const CudaKernels* enabled_cuda_kernels();

// True for a CUDA tensor the kernels take: float32 or bfloat16, contiguous, not empty, on a
// device the kernels run on (kernels_run_on).
bool cuda_kernel_tensor(const at::Tensor& t);

// Whether cuda_kernels() run on CUDA device `index` (asked once per device; false without them).
bool kernels_run_on(int index);

// One line for the log: whether loom's CUDA kernels or ATen's compositions run on CUDA device
// `index`, and why.
std::string cuda_kernels_status(int index = 0);

}  // namespace loom::models::kernels
