#include "loom/quantize/float8_grouped.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <utility>
#include <vector>

#include "loom/core/check.h"
#include "loom/core/cuda_support.h"
#include "loom/core/logging.h"
#include "loom/core/per_device_answer.h"
#include "loom/quantize/float8.h"

namespace loom::quantize {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr CastSpec kRowwise{Scaling::kAxiswise, Float8Format::kE4M3};

// a [n, k] @ b [k, m], both cast row-wise along k, in `dtype`; `emulate`: the float32
// definition even where a float8 GEMM could run.
at::Tensor rowwise_mm(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype,
                      bool emulate = true) {
  return scaled_mm(quantize(a, kRowwise, 1, true), quantize(b, kRowwise, 0, true), dtype, emulate);
}

std::vector<int64_t> group_sizes(const at::Tensor& counts) {
  const at::Tensor cpu = counts.to(at::kCPU).to(at::kLong).contiguous();
  return {cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel()};
}

// a [M, R] (cast per row) times each group's slice of b, every group in one at::_scaled_grouped_mm
// (sm90's float8 grouped GEMM): the left operand row-major, the right one column-major, the scales
// as the kernel's multipliers (1 / scale), `ends` the groups' cumulative row counts (int32, on
// the device: no host sync). The kernel writes bfloat16.
at::Tensor grouped_kernel_mm(const Float8Tensor& a, const Float8ExpertCasts& b,
                             const at::Tensor& ends, bool fast_accum) {
  const at::Tensor right = b.data.transpose(-2, -1).contiguous().transpose(-2, -1);
  return at::_scaled_grouped_mm(a.data.contiguous(), right,
                                a.scale.reciprocal().reshape({-1}).to(at::kFloat).contiguous(),
                                b.scale.reciprocal().to(at::kFloat).contiguous(), ends,
                                std::nullopt, std::nullopt, at::kBFloat16, fast_accum);
}

// The definition of the same product (float32), group by group, for the self-check.
at::Tensor grouped_reference(const Float8Tensor& a, const Float8ExpertCasts& b,
                             const std::vector<int64_t>& sizes) {
  const at::Tensor x = a.dequantize();
  const at::Tensor w = b.data.to(at::kFloat) * b.scale.reciprocal().unsqueeze(1);
  at::Tensor out = at::zeros({x.size(0), w.size(2)}, x.options());
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    if (sizes[g] > 0) {
      out.narrow(0, row, sizes[g])
          .copy_(at::mm(x.narrow(0, row, sizes[g]), w[static_cast<int64_t>(g)]));
    }
    row += sizes[g];
  }
  return out;
}

// Whether at::_scaled_grouped_mm computes the definition on `index` (an sm90 device: the float8
// grouped kernels are Hopper's): asked once per device on uneven groups (an empty one
// included), the forward's and grad_input's operand layouts. A mismatch or an error is logged once
// and that device's grouped GEMMs stay emulated (correct, not fast).
bool grouped_kernel_agrees(int index) {
  const device::CudaSupport* cuda = device::cuda_support();
  const auto properties = cuda ? cuda->properties(index) : std::nullopt;
  if (!properties || properties->major != 9) return false;
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  std::string why;
  try {
    at::Generator gen = cuda->make_generator(index, 0x5eed);  // the job's stream stays as it is
    const auto options = at::TensorOptions().device(device);
    const std::vector<int64_t> sizes = {5, 0, 19, 40};
    const at::Tensor ends = at::tensor(std::vector<int32_t>{5, 5, 24, 64}, options.dtype(at::kInt));
    const at::Tensor x = at::randn({64, 64}, gen, options);
    const at::Tensor grad = at::randn({64, 48}, gen, options);
    const at::Tensor w = at::randn({4, 64, 48}, gen, options);
    struct Case {
      Float8Tensor a;
      Float8ExpertCasts b;
      bool fast_accum;  // as the forward calls it
    };
    const Case cases[] = {
        {quantize(x, kRowwise, 1, true), quantize_experts(w), true},  // forward
        {quantize(grad, kRowwise, 1, true), quantize_experts(w.transpose(1, 2).contiguous()),
         false},  // grad x
    };
    for (const auto& [a, b, fast_accum] : cases) {
      const at::Tensor want = grouped_reference(a, b, sizes);
      const at::Tensor got = grouped_kernel_mm(a, b, ends, fast_accum).to(at::kFloat);
      const double error = (got - want).abs().max().item<double>();
      const double scale = want.abs().max().item<double>();
      if (!(error <= 1e-2 * scale)) {
        why = "differs from the definition by " + std::to_string(error) + " of " +
              std::to_string(scale);
        break;
      }
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!why.empty()) {
    log::get("float8")->warn(
        "float8 grouped GEMM on cuda:{}: at::_scaled_grouped_mm {}; the experts' GEMMs are "
        "emulated there (correct, not fast)",
        index, why.substr(0, 300));
  }
  return why.empty();
}

// The experts' forward and grad_input GEMMs go through at::_scaled_grouped_mm: bf16 activations
// (the kernel writes bf16) of widths that are multiples of 16, on a device whose kernel passed
// its check.
// (Rows equal to the experts' count are left to the emulation: later PyTorch releases read a
// scale of that length as ambiguous between per-row and per-expert.)
bool grouped_kernel_usable(const at::Tensor& x, const at::Tensor& w) {
  return x.scalar_type() == at::kBFloat16 && x.size(1) % 16 == 0 && w.size(2) % 16 == 0 &&
         x.size(0) != w.size(0) && float8_grouped_kernel_trusted(x.device());
}

struct Float8GroupedMm : torch::autograd::Function<Float8GroupedMm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& counts) {
    LOOM_CHECK(counts.numel() == w.size(0), "float8 grouped GEMM: ", counts.numel(), " counts for ",
               w.size(0), " groups");
    if (grouped_kernel_usable(x, w)) {
      // The counts sum to x's rows (the dispatcher's contract; checking it here would wait for
      // the device, which this path exists to avoid).
      const at::Tensor ends = counts.cumsum(0).to(at::kInt);
      ctx->save_for_backward({x, w, counts, ends});
      return grouped_kernel_mm(quantize(x, kRowwise, 1, true), quantize_experts(w), ends, true)
          .to(x.scalar_type());
    }
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
    const bool kernel = saved.size() == 4;  // the forward took at::_scaled_grouped_mm
    // Only what is asked for: the zero-bubble schedules' input pass wants gx alone, their
    // weight pass gw alone.
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    at::Tensor gx;
    if (kernel && want_x) {
      // grad_x = grad_y · w[g]ᵀ for every group in one launch (w[g]ᵀ cast per column along N).
      gx = grouped_kernel_mm(quantize(go, kRowwise, 1, true),
                             quantize_experts(w.transpose(1, 2).contiguous()), saved[3], false)
               .to(x.scalar_type());
    }
    const bool gx_by_group = !kernel && want_x;
    if (!gx_by_group && !want_w) return {gx, at::Tensor(), at::Tensor()};
    // The weight gradient reduces over each group's tokens: group by group (its scales run over
    // the group's rows), with the row counts on the host.
    const std::vector<int64_t> sizes =
        kernel ? group_sizes(saved[2]) : ctx->saved_data["sizes"].toIntVector();
    if (gx_by_group) gx = at::zeros_like(x);
    at::Tensor gw = want_w ? at::zeros_like(w) : at::Tensor();
    int64_t row = 0;
    for (size_t g = 0; g < sizes.size(); ++g) {
      if (sizes[g] == 0) continue;
      const at::Tensor xg = x.narrow(0, row, sizes[g]);
      const at::Tensor gog = go.narrow(0, row, sizes[g]);
      const auto index = static_cast<int64_t>(g);
      if (gx_by_group) {
        gx.narrow(0, row, sizes[g]).copy_(rowwise_mm(gog, w[index].t(), x.scalar_type()));
      }
      if (want_w) gw[index].copy_(rowwise_mm(xg.t(), gog, w.scalar_type(), /*emulate=*/!kernel));
      row += sizes[g];
    }
    return {gx, gw, at::Tensor()};
  }
};

}  // namespace

Float8ExpertCasts quantize_experts(const at::Tensor& w) {
  // One amax, scale and cast for all experts: the same arithmetic, element by element, as each
  // slice's quantize() (the max is exact; amax_to_scale and the cast are elementwise).
  const at::Tensor scale =
      amax_to_scale(amax(w, Scaling::kAxiswise, 1), kRowwise.format, /*power_of_2=*/true);
  const Float8Tensor q = quantize_with_scale(w, scale, kRowwise.format);
  return {q.data, scale.squeeze(1)};
}

bool float8_grouped_kernel_trusted(const at::Device& device) {
  if (!device.is_cuda()) return false;
  static PerDeviceAnswer answers;
  return answers.get(device, grouped_kernel_agrees);
}

at::Tensor float8_grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) {
  // Under autocast the tokens go to the autocast dtype first (as float8_linear's input, and
  // what the grouped kernel reads); the GEMMs follow the recipe, not autocast.
  const at::DeviceType device = x.device().type();
  const at::Tensor input = at::autocast::is_autocast_enabled(device)
                               ? x.to(at::autocast::get_autocast_dtype(device))
                               : x;
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return Float8GroupedMm::apply(input, w, counts);
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
