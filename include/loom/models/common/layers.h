// Building blocks shared by model families. Parameters are created with explicit tensor options,
// so a model can be built on the meta device (no memory) for planning, or directly on its
// target device; initialization happens separately (see models/llama/init.h).
#pragma once

#include <utility>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>

#include "loom/protocols/gather_codec.h"

namespace loom::models {

// A module with one parameter, `weight`. FSDP builds models on the meta device and then swaps
// each meta parameter for a tensor of its own (a meta tensor cannot be given real storage in
// place), which replace_weight does for the registered parameter and the member together.
class WeightModule : public torch::nn::Module {
 public:
  at::Tensor weight;
  void replace_weight(const at::Tensor& value);

 protected:
  explicit WeightModule(at::Tensor initial);
};

// A module that reads its parameters from its table at each call, never from cached members, so
// that replace() (FSDP's swap of a meta or sharded tensor) takes effect for any of them.
class ParameterTableModule : public torch::nn::Module {
 public:
  // Throws InternalError when the module has no parameter `key`.
  void replace(const std::string& key, const at::Tensor& value);
  const at::Tensor& param(const std::string& key) const { return parameters_[key]; }
};

// Replaces the parameter `name` ("layers.0.attention.wq.weight") of `root`; throws
// InternalError when no WeightModule or ParameterTableModule owns it.
void replace_parameter(torch::nn::Module& root, const std::string& name, const at::Tensor& value);

// How a Linear computes y = x W^T when a model converter changed it (float8 training,
// quantize/float8_linear.h). The module keeps its parameter as it is: names, shapes and dtypes
// in checkpoints do not change; only the matmul does.
class LinearCompute {
 public:
  virtual ~LinearCompute() = default;
  virtual at::Tensor forward(const at::Tensor& input, const at::Tensor& weight) = 0;
  virtual std::string describe() const = 0;
  // How FSDP all-gathers the weight (float8 all-gather); null: in the param dtype.
  virtual std::shared_ptr<GatherCodec> gather_codec() { return nullptr; }
};

// The gather codecs of `root`'s linears' weights, by parameter name, for FsdpOptions.
GatherCodecs linear_gather_codecs(torch::nn::Module& root);

// y = x W^T, plus a bias b [out] when built with one (gpt-oss's attention and router; Llama has
// none).
class LinearImpl : public WeightModule {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, const at::TensorOptions& options,
             bool with_bias = false);
  at::Tensor forward(const at::Tensor& input);
  // The registered "bias" parameter and this member together (as replace_weight).
  void replace_bias(const at::Tensor& value);
  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }

  // Null: at::linear. Set by a converter (quantize::convert_to_float8).
  std::shared_ptr<LinearCompute> compute;
  // False for a linear whose owner reads `weight` itself rather than calling forward (a MoE
  // router's gate, in float32): converters leave it alone.
  bool convertible = true;
  at::Tensor bias;  // undefined without one
  // The part of the bias this rank adds: 1 / tp on a row-parallel linear, whose partial sums the
  // tensor-parallel ranks add up (the whole bias once in the sum, its gradient a partial sum).
  double bias_share = 1.0;
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public WeightModule {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& ids);
};
TORCH_MODULE(Embedding);

// y = x E^T with the table E of `embedding` (tied input and output embeddings): no parameter of
// its own, so the table is one parameter, saved, sharded and updated once. It reads the
// embedding's current weight at each call (FSDP swaps that tensor when it gathers).
class TiedLinearImpl : public torch::nn::Module {
 public:
  explicit TiedLinearImpl(std::shared_ptr<EmbeddingImpl> embedding);
  at::Tensor forward(const at::Tensor& input);

 private:
  std::shared_ptr<EmbeddingImpl> embedding_;  // not a submodule: its weight is not ours
};
TORCH_MODULE(TiedLinear);

// Root-mean-square norm, computed in float32 whatever the input dtype.
class RMSNormImpl : public WeightModule {
 public:
  RMSNormImpl(int64_t dim, double eps, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& input);
  // The residual stream's sum and its norm: (x + delta, forward(x + delta)), or (x, forward(x))
  // when delta is undefined; fused on CPU float32 (kernels::residual_rms_norm).
  std::pair<at::Tensor, at::Tensor> forward_residual(const at::Tensor& x, const at::Tensor& delta);
  double eps;
};
TORCH_MODULE(RMSNorm);

}  // namespace loom::models
