// SwiGLU feed-forward: w2(silu(w1 x) * w3 x).
#pragma once

#include "loom/models/common/layers.h"
#include "loom/models/common/decoder_args.h"

namespace loom::models {

class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(const DecoderArgs& args, const at::TensorOptions& options);
  FeedForwardImpl(int64_t dim, int64_t hidden, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);

  Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(FeedForward);

}  // namespace loom::models
