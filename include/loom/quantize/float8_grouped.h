// Float8 grouped GEMMs for a mixture of experts' routed experts (quantize.grouped_mm.float8):
// y[rows of group g] = x[rows of g] · w[g], each group a row-wise float8 GEMM as the rowwise
// recipe defines it (float8_linear.h): e4m3, power-of-two scales along each GEMM's reduction
// dimension, for the forward GEMM and both backward GEMMs (grad_x = grad_y[g] · w[g]ᵀ,
// grad_w[g] = x[g]ᵀ · grad_y[g], whose scales run over the group's tokens). Emulated in float32
// (the definition) except on Hopper (sm90) with bf16 activations whose widths are multiples of
// 16: there the forward and grad_x GEMMs of every group run as one at::_scaled_grouped_mm (group
// ends on the device: no host sync), once the device's kernel has matched the definition on a
// small problem (float8_grouped_kernel_trusted); the weight gradient stays group by group, each
// a float8 GEMM where its shape allows.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "loom/models/common/moe.h"

namespace loom::quantize {

// Every expert's slice of w [E, R, C] cast per column along R, in one pass (what
// at::_scaled_grouped_mm reads as its right operand): data [E, R, C] e4m3, scales [E, C] with
// power-of-two scales, bit for bit each slice's quantize(w[e], row-wise, 0).
struct Float8ExpertCasts {
  at::Tensor data, scale;
};
Float8ExpertCasts quantize_experts(const at::Tensor& w);

// Whether `device` runs the experts' GEMMs through at::_scaled_grouped_mm: an sm90 GPU whose
// kernel matched the definition (forward and grad_x layouts, uneven and empty groups) when first
// asked; a mismatch is logged once under [float8]. False off CUDA.
bool float8_grouped_kernel_trusted(const at::Device& device);

// x [N, K] sorted by group, w [G, K, M], counts [G] int64 (sum N).
at::Tensor float8_grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts);

class Float8GroupedCompute final : public models::GroupedMatmulCompute {
 public:
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) override {
    return float8_grouped_mm(x, w, counts);
  }
  std::string describe() const override {
    return "float8 rowwise grouped GEMM (at::_scaled_grouped_mm on sm90 with bf16, else "
           "emulated)";
  }
};

// Installs the compute in every GroupedExperts module of `root` whose FQN contains one of `fqns`
// (every one when `fqns` is empty); returns their FQNs.
std::vector<std::string> convert_grouped_to_float8(torch::nn::Module& root,
                                                   const std::vector<std::string>& fqns);

}  // namespace loom::quantize
