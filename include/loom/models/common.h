// Building blocks shared by model families. Parameters are created with explicit tensor options,
// so a model can be built on the meta device (no memory) for planning, or directly on its
// target device; initialization happens separately (see models/llama/init.h).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace loom::models {

// y = x W^T, no bias (Llama has none).
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& input);
  at::Tensor weight;
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;
};
TORCH_MODULE(Embedding);

// Root-mean-square norm, computed in float32 whatever the input dtype.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& input);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

}  // namespace loom::models
