#include "loom/models/common.h"

#include <ATen/ATen.h>

namespace loom::models {

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, const at::TensorOptions& options)
    : weight(register_parameter("weight", at::empty({out_features, in_features}, options))) {}

at::Tensor LinearImpl::forward(const at::Tensor& input) {
  return at::linear(input, weight);
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options)
    : weight(register_parameter("weight", at::empty({num_embeddings, dim}, options))) {}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  return at::embedding(weight, ids);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, const at::TensorOptions& options)
    : weight(register_parameter("weight", at::empty({dim}, options))), eps(eps_) {}

at::Tensor RMSNormImpl::forward(const at::Tensor& input) {
  // ATen's fused rms_norm (one kernel forward and backward where available), on float32.
  const int64_t dim = input.size(-1);
  if (input.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat) {
    return at::rms_norm(input, {dim}, weight, eps);
  }
  at::Tensor normed = at::rms_norm(input.to(at::kFloat), {dim}, std::nullopt, eps);
  return normed.to(input.scalar_type()) * weight;
}

}  // namespace loom::models
