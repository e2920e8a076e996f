#include "loom/quantize/float8_grouped.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include "loom/core/check.h"
#include "loom/quantize/float8.h"

namespace loom::quantize {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr CastSpec kRowwise{Scaling::kAxiswise, Float8Format::kE4M3};

// a [n, k] @ b [k, m], both cast row-wise along k, in `dtype`.
at::Tensor rowwise_mm(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
  return scaled_mm(quantize(a, kRowwise, 1, true), quantize(b, kRowwise, 0, true), dtype, true);
}

std::vector<int64_t> group_sizes(const at::Tensor& counts) {
  const at::Tensor cpu = counts.to(at::kCPU).to(at::kLong).contiguous();
  return {cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel()};
}

struct Float8GroupedMm : torch::autograd::Function<Float8GroupedMm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& counts) {
    const std::vector<int64_t> sizes = group_sizes(counts);
    LOOM_CHECK(static_cast<int64_t>(sizes.size()) == w.size(0),
               "float8 grouped GEMM: ", sizes.size(), " counts for ", w.size(0), " groups");
    at::Tensor y = at::empty({x.size(0), w.size(2)}, x.options());
    int64_t row = 0;
    for (size_t g = 0; g < sizes.size(); ++g) {
      if (sizes[g] == 0) continue;
      y.narrow(0, row, sizes[g])
          .copy_(rowwise_mm(x.narrow(0, row, sizes[g]), w[g], x.scalar_type()));
      row += sizes[g];
    }
    LOOM_CHECK(row == x.size(0), "float8 grouped GEMM: counts sum to ", row, " for ", x.size(0),
               " rows");
    ctx->save_for_backward({x, w});
    ctx->saved_data["sizes"] = sizes;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor go = grads[0].contiguous();
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    at::Tensor gx = at::zeros_like(x);
    at::Tensor gw = at::zeros_like(w);
    int64_t row = 0;
    for (size_t g = 0; g < sizes.size(); ++g) {
      if (sizes[g] == 0) continue;
      const at::Tensor xg = x.narrow(0, row, sizes[g]);
      const at::Tensor gog = go.narrow(0, row, sizes[g]);
      const auto index = static_cast<int64_t>(g);
      gx.narrow(0, row, sizes[g]).copy_(rowwise_mm(gog, w[index].t(), x.scalar_type()));
      gw[index].copy_(rowwise_mm(xg.t(), gog, w.scalar_type()));
      row += sizes[g];
    }
    return {gx, gw, at::Tensor()};
  }
};

}  // namespace

at::Tensor float8_grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) {
  // The GEMMs follow the recipe, not autocast.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return Float8GroupedMm::apply(x, w, counts);
}

std::vector<std::string> convert_grouped_to_float8(torch::nn::Module& root,
                                                   const std::vector<std::string>& fqns) {
  std::vector<std::string> converted;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    auto* experts = dynamic_cast<models::GroupedExpertsImpl*>(item.value().get());
    if (experts == nullptr) continue;
    bool chosen = fqns.empty();
    for (const auto& f : fqns) chosen = chosen || item.key().find(f) != std::string::npos;
    if (!chosen) continue;
    experts->compute = std::make_shared<Float8GroupedCompute>();
    converted.push_back(item.key());
  }
  return converted;
}

}  // namespace loom::quantize
