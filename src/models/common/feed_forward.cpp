#include "loom/models/common/feed_forward.h"

#include <ATen/ATen.h>

#include "loom/models/kernels/swiglu.h"

namespace loom::models {

FeedForwardImpl::FeedForwardImpl(const DecoderArgs& args, const at::TensorOptions& options) {
  const int64_t hidden = args.ffn_hidden_dim();
  w1 = register_module("w1", Linear(args.dim, hidden, options));
  w2 = register_module("w2", Linear(hidden, args.dim, options));
  w3 = register_module("w3", Linear(args.dim, hidden, options));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  return w2->forward(kernels::swiglu(w1->forward(x), w3->forward(x)));
}

}  // namespace loom::models
