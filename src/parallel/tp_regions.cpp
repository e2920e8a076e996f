#include "loom/parallel/tp_regions.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"

namespace loom::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group rides in the autograd context as an address: Comms are owned by the runtime, which
// outlives every model and graph.
void save_comm(AutogradContext* ctx, distributed::Comm& tp) {
  ctx->saved_data["comm"] = reinterpret_cast<int64_t>(&tp);
}
distributed::Comm& saved_comm(AutogradContext* ctx) {
  return *reinterpret_cast<distributed::Comm*>(ctx->saved_data["comm"].toInt());
}

// Collectives work on dim 0: move `dim` there (contiguously) and back.
at::Tensor gather_dim(const at::Tensor& x, int64_t dim, distributed::Comm& tp) {
  at::Tensor front = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] *= tp.size();
  at::Tensor out = at::empty(shape, front.options());
  tp.all_gather_into_tensor(out, front);
  return out.movedim(0, dim).contiguous();
}

at::Tensor reduce_scatter_dim(const at::Tensor& x, int64_t dim, distributed::Comm& tp) {
  LOOM_CHECK(x.size(dim) % tp.size() == 0, "sequence parallelism: dim ", dim, " of size ",
             x.size(dim), " does not split over ", tp.size(), " tensor-parallel ranks");
  at::Tensor front = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] /= tp.size();
  at::Tensor out = at::empty(shape, front.options());
  tp.reduce_scatter_tensor(out, front);
  return out.movedim(0, dim).contiguous();
}

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, distributed::Comm* tp) {
    save_comm(ctx, *tp);
    return gather_dim(x, 1, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scatter_dim(grads[0], 1, saved_comm(ctx)), at::Tensor()};
  }
};

struct ReduceScatterSequence : torch::autograd::Function<ReduceScatterSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, distributed::Comm* tp) {
    save_comm(ctx, *tp);
    return reduce_scatter_dim(x, 1, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gather_dim(grads[0], 1, saved_comm(ctx)), at::Tensor()};
  }
};

struct GatherLastDim : torch::autograd::Function<GatherLastDim> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, distributed::Comm* tp,
                            int64_t full) {
    const int64_t n = tp->size();
    const int64_t piece = (full + n - 1) / n;
    const int64_t last = x.dim() - 1;
    const int64_t first = std::min(full, piece * tp->rank());
    LOOM_CHECK(x.size(last) == std::min(piece, full - first), "gather_last_dim: rank ",
               tp->rank(), " holds ", x.size(last), " of ", full, " columns, expected ",
               std::min(piece, full - first));
    ctx->saved_data["first"] = first;
    ctx->saved_data["count"] = x.size(last);
    // Pieces pad to `piece` columns; the padding ends up past column `full` and is cut off.
    at::Tensor padded = x.size(last) == piece
                            ? x
                            : at::constant_pad_nd(x, {0, piece - x.size(last)});
    return gather_dim(padded, last, *tp).narrow(last, 0, full).contiguous();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    const int64_t first = ctx->saved_data["first"].toInt();
    const int64_t count = ctx->saved_data["count"].toInt();
    return {g.narrow(g.dim() - 1, first, count).contiguous(), at::Tensor(), at::Tensor()};
  }
};

struct AllReduceReplicated : torch::autograd::Function<AllReduceReplicated> {
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& x,
                            distributed::Comm* tp) {
    at::Tensor out = x.clone();
    tp->all_reduce(out);
    return out;
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

}  // namespace

at::Tensor gather_sequence(const at::Tensor& x, distributed::Comm& tp) {
  if (tp.size() == 1) return x;
  return GatherSequence::apply(x, &tp);
}

at::Tensor reduce_scatter_sequence(const at::Tensor& x, distributed::Comm& tp) {
  if (tp.size() == 1) return x;
  return ReduceScatterSequence::apply(x, &tp);
}

at::Tensor gather_last_dim(const at::Tensor& x, distributed::Comm& tp, int64_t full) {
  if (tp.size() == 1) return x;
  return GatherLastDim::apply(x, &tp, full);
}

at::Tensor all_reduce_replicated(const at::Tensor& x, distributed::Comm& tp) {
  if (tp.size() == 1) return x;
  return AllReduceReplicated::apply(x, &tp);
}

}  // namespace loom::parallel
