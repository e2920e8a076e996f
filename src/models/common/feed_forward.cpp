#include "loom/models/common/feed_forward.h"

#include <ATen/ATen.h>

#include "loom/models/kernels/swiglu.h"
#include "loom/protocols/shared_input.h"

namespace loom::models {

FeedForwardImpl::FeedForwardImpl(const DecoderArgs& args, const at::TensorOptions& options)
    : FeedForwardImpl(args.dim, args.ffn_hidden_dim(), options) {}

FeedForwardImpl::FeedForwardImpl(int64_t dim, int64_t hidden, const at::TensorOptions& options) {
  w1 = register_module("w1", Linear(dim, hidden, options));
  w2 = register_module("w2", Linear(hidden, dim, options));
  w3 = register_module("w3", Linear(dim, hidden, options));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  at::Tensor gate, up;
  {
    const SharedInputScope shared(x);  // w1 and w3 read one x (float8: one cast)
    gate = w1->forward(x);
    up = w3->forward(x);
  }
  return w2->forward(kernels::swiglu(gate, up));
}

}  // namespace loom::models
