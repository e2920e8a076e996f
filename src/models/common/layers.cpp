#include "loom/models/common/layers.h"

#include <ATen/ATen.h>

#include "loom/core/check.h"
#include "loom/models/kernels/rms_norm.h"

namespace loom::models {

WeightModule::WeightModule(at::Tensor initial)
    : weight(register_parameter("weight", std::move(initial))) {}

void WeightModule::replace_weight(const at::Tensor& value) {
  weight = value;
  parameters_["weight"] = value;
}

void ParameterTableModule::replace(const std::string& key, const at::Tensor& value) {
  LOOM_CHECK(parameters_.contains(key), "replace: module ", name(), " has no parameter ", key);
  parameters_[key] = value;
}

GatherCodecs linear_gather_codecs(torch::nn::Module& root) {
  GatherCodecs out;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    const auto* linear = item.value()->as<LinearImpl>();
    if (linear == nullptr || linear->compute == nullptr) continue;
    if (auto codec = linear->compute->gather_codec()) out[item.key() + ".weight"] = codec;
  }
  return out;
}

void replace_parameter(torch::nn::Module& root, const std::string& name, const at::Tensor& value) {
  const auto dot = name.rfind('.');
  LOOM_CHECK(dot != std::string::npos, "replace_parameter: '", name, "' names no module");
  const std::string path = name.substr(0, dot);
  const std::string key = name.substr(dot + 1);
  for (const auto& item : root.named_modules()) {
    if (item.key() != path) continue;
    if (auto* table = dynamic_cast<ParameterTableModule*>(item.value().get())) {
      table->replace(key, value);
      return;
    }
    if (auto* linear = dynamic_cast<LinearImpl*>(item.value().get()); linear && key == "bias") {
      linear->replace_bias(value);
      return;
    }
    auto* owner = dynamic_cast<WeightModule*>(item.value().get());
    LOOM_CHECK(owner != nullptr && key == "weight", "replace_parameter: module '", path,
               "' has no replaceable ", key);
    owner->replace_weight(value);
    return;
  }
  LOOM_THROW(InternalError, "replace_parameter: no module '", path, "'");
}

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, const at::TensorOptions& options,
                       bool with_bias)
    : WeightModule(at::empty({out_features, in_features}, options)) {
  if (with_bias) bias = register_parameter("bias", at::empty({out_features}, options));
}

void LinearImpl::replace_bias(const at::Tensor& value) {
  LOOM_CHECK(bias.defined(), "replace_bias: this linear has no bias");
  bias = value;
  parameters_["bias"] = value;
}

at::Tensor LinearImpl::forward(const at::Tensor& input) {
  const at::Tensor b = !bias.defined() || bias_share == 1.0 ? bias : bias * bias_share;
  if (compute) {
    const at::Tensor out = compute->forward(input, weight);
    return b.defined() ? out + b.to(out.scalar_type()) : out;
  }
  return b.defined() ? at::linear(input, weight, b) : at::linear(input, weight);
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options)
    : WeightModule(at::empty({num_embeddings, dim}, options)) {}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  return at::embedding(weight, ids);
}

TiedLinearImpl::TiedLinearImpl(std::shared_ptr<EmbeddingImpl> embedding)
    : embedding_(std::move(embedding)) {}

at::Tensor TiedLinearImpl::forward(const at::Tensor& input) {
  return at::linear(input, embedding_->weight);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, const at::TensorOptions& options)
    : WeightModule(at::empty({dim}, options)), eps(eps_) {}

at::Tensor RMSNormImpl::forward(const at::Tensor& input) {
  // On float32: loom's fused CPU kernel, or ATen's rms_norm (fused on CUDA) where it does not
  // apply.
  const int64_t dim = input.size(-1);
  if (input.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat) {
    return kernels::rms_norm(input, weight, eps);
  }
  at::Tensor normed = at::rms_norm(input.to(at::kFloat), {dim}, std::nullopt, eps);
  return normed.to(input.scalar_type()) * weight;
}

std::pair<at::Tensor, at::Tensor> RMSNormImpl::forward_residual(const at::Tensor& x,
                                                                const at::Tensor& delta) {
  // As forward(): float32 takes the kernel (which falls back itself where it does not apply).
  if (x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat) {
    return kernels::residual_rms_norm(x, delta, weight, eps);
  }
  at::Tensor sum = delta.defined() ? x + delta : x;
  return {sum, forward(sum)};
}

}  // namespace loom::models
