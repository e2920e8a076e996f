#include "loom/quantize/float8_linear.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <string>

#include "loom/core/check.h"
#include "loom/distributed/comm.h"
#include "loom/models/kernels/cuda.h"
#include "loom/protocols/shared_input.h"
#include "loom/quantize/float8_cuda.h"

namespace loom::quantize {

Float8Recipe float8_recipe(const std::string& name, std::optional<bool> power_of_2) {
  const CastSpec e4m3_tensor{Scaling::kTensorwise, Float8Format::kE4M3};
  const CastSpec e4m3_axis{Scaling::kAxiswise, Float8Format::kE4M3};
  const CastSpec high_precision{Scaling::kNone, Float8Format::kE4M3};
  Float8Recipe r;
  r.name = name;
  if (name == "tensorwise") {
    r.input = r.weight = r.input_for_grad_weight = r.weight_for_grad_input = e4m3_tensor;
    r.grad_output = r.grad_output_for_grad_weight = {Scaling::kTensorwise, Float8Format::kE5M2};
    r.power_of_2 = false;
  } else if (name == "rowwise") {
    r.input = r.weight = r.grad_output = e4m3_axis;
    r.input_for_grad_weight = r.weight_for_grad_input = r.grad_output_for_grad_weight = e4m3_axis;
    r.power_of_2 = true;
  } else if (name == "rowwise_with_gw_hp") {
    r.input = r.weight = r.grad_output = e4m3_axis;
    r.weight_for_grad_input = e4m3_tensor;
    r.input_for_grad_weight = r.grad_output_for_grad_weight = high_precision;
    r.power_of_2 = true;
  } else if (name == "blockwise") {
    // DeepSeek-V3's: every operand in e4m3, activations and gradients in 1 x 128 tiles along
    // each GEMM's reduction dimension, weights in 128 x 128 blocks, float32 scales.
    const CastSpec tiles{Scaling::kBlockwise, Float8Format::kE4M3, 1};
    const CastSpec blocks{Scaling::kBlockwise, Float8Format::kE4M3, kBlock};
    r.input = r.grad_output = r.input_for_grad_weight = r.grad_output_for_grad_weight = tiles;
    r.weight = r.weight_for_grad_input = blocks;
    r.power_of_2 = false;
  } else {
    LOOM_THROW(InputError, "quantize.linear.float8.recipe_name: unknown recipe '", name,
               "' (tensorwise, rowwise, rowwise_with_gw_hp or blockwise)");
  }
  if (power_of_2) r.power_of_2 = *power_of_2;
  return r;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One operand's cast; tensorwise amaxes are shared over the tensor-parallel group. On CUDA with
// loom's kernels on, the fused cast kernels (float8_cuda.h) compute the same bits in fewer passes.
// `with_transposed`: the fused tensorwise cast also writes the row-major transposed copy a
// GEMM of the transpose reads (ignored elsewhere, where that GEMM copies or emulates).
Float8Tensor cast(const at::Tensor& x, const CastSpec& spec, int64_t reduction_dim,
                  const Float8LinearOptions& options, bool with_transposed = false) {
  if (x.is_cuda() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
      models::kernels::kernels_run_on(x.get_device())) {
    if (const Float8CudaCasts* fused = float8_cuda_casts()) {
      return fused_quantize(*fused, x, spec, reduction_dim, options.recipe.power_of_2,
                            options.amax_group, with_transposed);
    }
  }
  at::Tensor a = amax(x, spec, reduction_dim);
  if (options.amax_group != nullptr && spec.scaling == Scaling::kTensorwise) {
    at::Tensor flat = a.reshape({1});
    options.amax_group->all_reduce(flat, distributed::ReduceOp::kMax);
    a = flat.reshape({});
  }
  const at::Tensor scale = amax_to_scale(a, spec.format, options.recipe.power_of_2);
  if (spec.scaling != Scaling::kBlockwise) return quantize_with_scale(x, scale, spec.format);
  // Tiles lie within a tensor-parallel shard when its width is a multiple of the tile (the
  // converter's rule), so they need no reduction over the group.
  const auto [tile_rows, tile_cols] = blockwise_tile(spec, reduction_dim);
  return quantize_with_scale(x, scale, spec.format, tile_rows, tile_cols);
}

// The weight's cast for a GEMM, through the cache where there is one. A tensorwise cast under
// tensor parallelism all-reduces its amax: it is made at every use, so that every rank of the
// group issues the same collectives whatever its cache holds.
Float8Tensor weight_cast(const at::Tensor& weight, const CastSpec& spec, int64_t reduction_dim,
                         const Float8LinearOptions& options, WeightCastCache* cache) {
  const bool collective = options.amax_group != nullptr && spec.scaling == Scaling::kTensorwise;
  if (cache == nullptr || collective) return cast(weight, spec, reduction_dim, options);
  return cache->get(weight, spec, reduction_dim,
                    [&] { return cast(weight, spec, reduction_dim, options); });
}

std::atomic<int64_t> g_input_casts{0};

// The forward's cast of `input` (as `x`, its rows): shared with the other float8 linears that
// read the same activation inside a SharedInputScope (attention's q, k and v: one cast, one
// tensor-parallel amax all-reduce, instead of three), else made here.
Float8Tensor input_cast(const at::Tensor& input, const at::Tensor& x,
                        const Float8LinearOptions& options) {
  const CastSpec& spec = options.recipe.input;
  const std::string key = fmt::format(
      "float8 input {} {} {} {} {}", static_cast<int>(spec.scaling), static_cast<int>(spec.format),
      spec.block_width, options.recipe.power_of_2, static_cast<const void*>(options.amax_group));
  if (auto kept = models::shared_input_value(input, key)) {
    return *static_cast<const Float8Tensor*>(kept.get());
  }
  Float8Tensor q = cast(x, spec, 1, options);
  g_input_casts.fetch_add(1, std::memory_order_relaxed);
  models::keep_shared_input_value(input, key, std::make_shared<Float8Tensor>(q));
  return q;
}

bool reusable(const CastSpec& first, const CastSpec& second) {
  return first == second && first.scaling == Scaling::kTensorwise;
}

}  // namespace

int64_t float8_input_casts_made() {
  return g_input_casts.load(std::memory_order_relaxed);
}

bool weight_cast_serves_backward(const Float8Recipe& r) {
  if (!(r.weight == r.weight_for_grad_input)) return false;
  return r.weight.scaling == Scaling::kTensorwise ||
         (r.weight.scaling == Scaling::kBlockwise && r.weight.block_width == kBlock);
}

namespace {

void save_operand(AutogradContext* ctx, const std::string& key, const Float8Tensor& t) {
  ctx->saved_data[key + "_data"] = t.data;
  ctx->saved_data[key + "_scale"] = t.scale;
}

Float8Tensor saved_operand(AutogradContext* ctx, const std::string& key) {
  auto data = ctx->saved_data.find(key + "_data");
  if (data == ctx->saved_data.end()) return {};
  return {data->second.toTensor(), ctx->saved_data[key + "_scale"].toTensor()};
}

// A GEMM of two high-precision operands (rowwise_with_gw_hp's weight gradient): in their dtype
// when they agree, float32 otherwise.
at::Tensor high_precision_mm(const at::Tensor& a, const at::Tensor& b, at::ScalarType out) {
  if (a.scalar_type() == b.scalar_type()) return at::mm(a, b).to(out);
  return at::mm(a.to(at::kFloat), b.to(at::kFloat)).to(out);
}

struct Float8LinearFunction : torch::autograd::Function<Float8LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const Float8LinearOptions* options, const Float8Tensor* prepared,
                            at::ScalarType out_dtype, WeightCastCache* cache,
                            const at::Tensor* shared_as) {
    const Float8Recipe& r = options->recipe;
    const at::Tensor x = input.reshape({-1, input.size(-1)});
    const Float8Tensor xq = input_cast(shared_as != nullptr ? *shared_as : input, x, *options);
    const Float8Tensor wq =
        prepared->defined() ? *prepared : weight_cast(weight, r.weight, 1, *options, cache);
    ctx->saved_data["cache"] = reinterpret_cast<int64_t>(cache);
    at::Tensor y = scaled_mm(xq, wq.t(), out_dtype, options->emulate, /*fast_accum=*/true);
    ctx->saved_data["options"] = reinterpret_cast<int64_t>(options);
    ctx->saved_data["input_shape"] = input.sizes().vec();
    // The input, when cast the same way for the weight gradient, is kept in float8 (half the
    // activation memory); otherwise in high precision and cast again in backward. The weight is
    // kept as the parameter (FSDP frees and regathers it between forward and backward; a float8
    // copy saved here would outlive the resharding) and cast again, or taken from `prepared`,
    // which FSDP's float8 all-gather fills again before the unit's backward.
    const bool keep_xq = reusable(r.input_for_grad_weight, r.input);
    LOOM_CHECK(!prepared->defined() || weight_cast_serves_backward(r),
               "float8: a prepared (FSDP float8-gathered) weight needs the tensorwise or "
               "blockwise recipe");
    if (keep_xq) save_operand(ctx, "xq", xq);
    ctx->saved_data["prepared"] =
        prepared->defined() ? reinterpret_cast<int64_t>(prepared) : int64_t{0};
    ctx->save_for_backward({keep_xq ? at::Tensor() : x, weight});
    std::vector<int64_t> out_shape = input.sizes().vec();
    out_shape.back() = weight.size(0);
    return y.view(out_shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto& options =
        *reinterpret_cast<const Float8LinearOptions*>(ctx->saved_data["options"].toInt());
    const Float8Recipe& r = options.recipe;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor go = grads[0].reshape({-1, grads[0].size(-1)});
    // Cast once for both GEMMs (tensorwise): the weight gradient's reads its transpose, which
    // the fused cast writes in the same pass on a float8 GPU.
    const bool shared = reusable(r.grad_output_for_grad_weight, r.grad_output);
    const Float8Tensor go_q = cast(go, r.grad_output, 1, options,
                                   shared && !options.emulate && hardware_float8(go.device()));
    at::Tensor grad_input, grad_weight;
    if (ctx->needs_input_grad(0)) {
      const auto* prepared =
          reinterpret_cast<const Float8Tensor*>(ctx->saved_data["prepared"].toInt());
      auto* cache = reinterpret_cast<WeightCastCache*>(ctx->saved_data["cache"].toInt());
      const Float8Tensor wq = prepared != nullptr && prepared->defined()
                                  ? *prepared
                                  : weight_cast(weight, r.weight_for_grad_input, 0, options, cache);
      // In grad_output's dtype, as torchao's (autograd casts it to the input's).
      grad_input = scaled_mm(go_q, wq, go.scalar_type(), options.emulate)
                       .view(ctx->saved_data["input_shape"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) {
      grad_weight = weight_gradient(ctx, go, go_q, x, options);
    }
    return {grad_input,   grad_weight,  at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }

  // grad_output^T @ input, as the recipe casts it (or in high precision).
  static at::Tensor weight_gradient(AutogradContext* ctx, const at::Tensor& go,
                                    const Float8Tensor& go_q, const at::Tensor& x,
                                    const Float8LinearOptions& options) {
    const Float8Recipe& r = options.recipe;
    // In grad_output's dtype, as torchao's: autograd casts it to the weight's (a float32 weight
    // under autocast gets a bfloat16-rounded gradient, as it does in torchao).
    const at::ScalarType dtype = go.scalar_type();
    if (r.grad_output_for_grad_weight.scaling == Scaling::kNone) {
      return high_precision_mm(go.t(), x, dtype);
    }
    const Float8Tensor go_t = reusable(r.grad_output_for_grad_weight, r.grad_output)
                                  ? go_q
                                  : cast(go, r.grad_output_for_grad_weight, 0, options);
    Float8Tensor xq = saved_operand(ctx, "xq");
    if (!xq.defined()) xq = cast(x, r.input_for_grad_weight, 0, options);
    return scaled_mm(go_t.t(), xq, dtype, options.emulate);
  }
};

}  // namespace

at::Tensor float8_linear(const at::Tensor& input, const at::Tensor& weight,
                         const Float8LinearOptions& options, const Float8Tensor& prepared_weight,
                         std::optional<at::ScalarType> out_dtype, WeightCastCache* weight_casts,
                         const at::Tensor* shared_as) {
  return Float8LinearFunction::apply(input, weight, &options, &prepared_weight,
                                     out_dtype.value_or(input.scalar_type()), weight_casts,
                                     shared_as);
}

namespace {

// The reduction dimension a weight cast depends on, or -1 when both give the same cast.
int64_t cast_key_dim(const CastSpec& spec, int64_t reduction_dim) {
  if (spec.scaling == Scaling::kTensorwise) return -1;
  if (spec.scaling == Scaling::kBlockwise && spec.block_width == kBlock) return -1;
  return reduction_dim;
}

}  // namespace

Float8Tensor WeightCastCache::get(const at::Tensor& weight, const CastSpec& spec,
                                  int64_t reduction_dim,
                                  const std::function<Float8Tensor()>& make) {
  const void* impl = weight.unsafeGetTensorImpl();
  const void* data = weight.const_data_ptr();
  const int64_t version = static_cast<int64_t>(weight._version());
  if (impl != impl_ || data != data_ || version != version_) {
    entries_.clear();
    impl_ = impl;
    data_ = data;
    version_ = version;
  }
  const int64_t dim = cast_key_dim(spec, reduction_dim);
  for (const Entry& e : entries_) {
    if (e.spec == spec && e.reduction_dim == dim) return e.value;
  }
  Float8Tensor value = make();
  ++casts_made_;
  entries_.push_back({spec, dim, value});
  return value;
}

at::Tensor Float8LinearCompute::forward(const at::Tensor& input, const at::Tensor& weight) {
  // Under autocast the input goes to the autocast dtype first, as torchao's Float8Linear does:
  // its amax and cast see what a bfloat16 run computes, and the output is in that dtype (as
  // at::linear's would be). The GEMMs inside follow the recipe, not autocast.
  // Each linear makes its own copy (as torchao does: their gradients then meet in float32),
  // and the float8 cast of it is shared, keyed on the activation the scope declared (q, k and v
  // read one: one cast, not three; the copies are equal).
  const at::DeviceType device = input.device().type();
  if (!at::autocast::is_autocast_enabled(device)) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    return float8_linear(input, weight, options_, gathered_, input.scalar_type(),
                         options_.cache_weight_casts ? &weight_casts_ : nullptr);
  }
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(device);
  const at::Tensor x = input.to(dtype);
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return float8_linear(x, weight, options_, gathered_, dtype,
                       options_.cache_weight_casts ? &weight_casts_ : nullptr, &input);
}

std::string Float8LinearCompute::describe() const {
  std::string text = "float8 " + options_.recipe.name;
  if (options_.recipe.power_of_2) text += ", power-of-two scales";
  if (options_.emulate) text += ", emulated";
  if (options_.fsdp_float8_all_gather) text += ", float8 all-gather";
  return text;
}

Float8LinearCompute* float8_compute(torch::nn::Module& module) {
  auto* linear = dynamic_cast<models::LinearImpl*>(&module);
  if (linear == nullptr) return nullptr;
  return dynamic_cast<Float8LinearCompute*>(linear->compute.get());
}

}  // namespace loom::quantize
