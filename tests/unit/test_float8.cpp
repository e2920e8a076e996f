// Float8 training (src/quantize): casts and scales against their definitions, the emulated GEMM
// against ATen's own at::_scaled_mm CPU kernel, the float8 linear's three GEMMs against the
// recipes, the converter's choice of linears, and the config keys.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config_test_util.h"
#include "loom/config/diagnostics.h"
#include "loom/models/common/layers.h"
#include "loom/models/model_spec.h"
#include "loom/optim/registry.h"
#include "loom/protocols/shared_input.h"
#include "loom/quantize/convert.h"
#include "loom/quantize/float8.h"
#include "loom/quantize/float8_grouped.h"
#include "loom/quantize/float8_linear.h"
#include "loom/train/supported_features.h"

namespace q = loom::quantize;

namespace {

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn(shape, g, at::TensorOptions().dtype(at::kFloat));
}

// The recipe's operands by hand: x [M, K] and w [N, K] quantized per tensor or along K.
q::Float8Tensor by_hand(const at::Tensor& x, const q::CastSpec& spec, int64_t dim, bool pow2) {
  at::Tensor amax =
      spec.scaling == q::Scaling::kTensorwise ? x.abs().max() : x.abs().amax({dim}, true);
  at::Tensor scale = (q::max_finite(spec.format) / amax.to(at::kDouble)).to(at::kFloat);
  // torchao's formula; it equals loom's exact round-down except within a few ulps below a power
  // of two (docs/float8.md), which random data never reaches.
  if (pow2) scale = at::exp2(at::floor(at::log2(scale)));
  const double limit = q::max_finite(spec.format);
  return {(x * scale).clamp(-limit, limit).to(q::scalar_type(spec.format)), scale};
}

}  // namespace

TEST(Float8, ScalesAreMaxOverAmax) {
  const at::Tensor amax = at::full({}, 2.0f);
  EXPECT_EQ(q::amax_to_scale(amax, q::Float8Format::kE4M3, false).item<float>(), 224.0f);
  EXPECT_EQ(q::amax_to_scale(amax, q::Float8Format::kE5M2, false).item<float>(), 28672.0f);
  const at::Tensor x = randn({64, 32}, 1);
  const q::Float8Tensor e4m3 =
      q::quantize(x, {q::Scaling::kTensorwise, q::Float8Format::kE4M3}, 1, false);
  const float amax_x = x.abs().max().item<float>();
  EXPECT_FLOAT_EQ(e4m3.scale.item<float>(), static_cast<float>(448.0 / amax_x));
  EXPECT_EQ(e4m3.data.scalar_type(), at::kFloat8_e4m3fn);
  // The largest magnitude lands on the format's largest value.
  EXPECT_EQ(e4m3.data.to(at::kFloat).abs().max().item<float>(), 448.0f);
  const q::Float8Tensor e5m2 =
      q::quantize(x, {q::Scaling::kTensorwise, q::Float8Format::kE5M2}, 1, false);
  EXPECT_FLOAT_EQ(e5m2.scale.item<float>(), static_cast<float>(57344.0 / amax_x));
  EXPECT_EQ(e5m2.data.to(at::kFloat).abs().max().item<float>(), 57344.0f);
  // Axiswise: one scale per row along the reduction dim.
  const q::Float8Tensor rows =
      q::quantize(x, {q::Scaling::kAxiswise, q::Float8Format::kE4M3}, 1, false);
  ASSERT_EQ(rows.scale.sizes(), (std::vector<int64_t>{64, 1}));
  EXPECT_TRUE(at::equal(rows.data.to(at::kFloat).abs().amax({1}), at::full({64}, 448.0f)));
  // An all-zero tensor gets a finite scale.
  EXPECT_TRUE(
      std::isfinite(q::amax_to_scale(at::zeros({}), q::Float8Format::kE4M3, false).item<float>()));
}

TEST(Float8, E4m3RoundTripWithinTwoToTheMinusFour) {
  const at::Tensor x = randn({4096}, 2).view({64, 64});
  for (bool pow2 : {false, true}) {
    const q::Float8Tensor t =
        q::quantize(x, {q::Scaling::kTensorwise, q::Float8Format::kE4M3}, 1, pow2);
    const at::Tensor back = t.dequantize();
    // Within the normal range (scaled magnitude >= 2^-6): 3 mantissa bits, error <= 2^-4.
    const at::Tensor normal = (x * t.scale).abs() >= std::ldexp(1.0, -6);
    ASSERT_GT(normal.sum().item<int64_t>(), 4000);
    const at::Tensor rel = ((back - x).abs() / x.abs()).masked_select(normal);
    EXPECT_LE(rel.max().item<double>(), std::ldexp(1.0, -4)) << "pow2 " << pow2;
  }
}

TEST(Float8, PowerOfTwoScalesInvertExactly) {
  const at::Tensor x = randn({32, 48}, 3) * 7.3;
  const q::Float8Tensor t =
      q::quantize(x, {q::Scaling::kAxiswise, q::Float8Format::kE4M3}, 1, true);
  const at::Tensor log2 = at::log2(t.scale);
  EXPECT_TRUE(at::equal(log2, at::round(log2)));
  // Rounded down: never above max / amax, so nothing saturates.
  EXPECT_TRUE((t.scale <= 448.0 / x.abs().amax({1}, true)).all().item<bool>());
  // data / scale and back is exact in float32.
  const at::Tensor data = t.data.to(at::kFloat);
  EXPECT_TRUE(at::equal(t.dequantize() * t.scale, data));
  EXPECT_TRUE(at::equal(
      q::quantize_with_scale(t.dequantize(), t.scale, q::Float8Format::kE4M3).data.to(at::kFloat),
      data));
}

// torch 2.11's CPU at::_scaled_mm takes per-tensor scales only (rowwise: "only supports
// per-tensor scaling for CPU backend"), so the row-wise emulation is checked by hand below.
TEST(Float8, EmulatedGemmEqualsScaledMmOnCpu) {
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{32, 64, 48}, {16, 256, 80}}) {
    const q::CastSpec spec{q::Scaling::kTensorwise, q::Float8Format::kE4M3};
    const q::Float8Tensor a = q::quantize(randn({m, k}, 4), spec, 1, false);
    const q::Float8Tensor b = q::quantize(randn({n, k}, 5), spec, 1, false).t();
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor emulated = q::scaled_mm(a, b, dtype, true);
      const at::Tensor kernel =
          at::_scaled_mm(a.data, b.data, a.scale.reciprocal(), b.scale.reciprocal(), std::nullopt,
                         std::nullopt, dtype);
      EXPECT_EQ(emulated.scalar_type(), dtype);
      EXPECT_EQ(max_abs_diff(emulated, kernel), 0.0) << m << "x" << k << "x" << n;
    }
  }
}

TEST(Float8, LinearGemmsFollowEachRecipe) {
  const at::Tensor x = randn({2, 16, 64}, 6);
  const at::Tensor w0 = randn({32, 64}, 7) * 0.1;
  const at::Tensor go = randn({2, 16, 32}, 8);
  const at::Tensor x2 = x.view({32, 64}), go2 = go.view({32, 32});
  for (const char* name : {"tensorwise", "rowwise", "rowwise_with_gw_hp"}) {
    q::Float8LinearOptions options;
    options.recipe = q::float8_recipe(name);
    options.emulate = true;
    const q::Float8Recipe& r = options.recipe;
    const bool p2 = r.power_of_2;
    at::Tensor xin = x.clone().set_requires_grad(true);
    at::Tensor w = w0.clone().set_requires_grad(true);
    at::Tensor y = q::float8_linear(xin, w, options);
    y.backward(go);
    // output = input @ weight^T
    const at::Tensor y_hand = q::scaled_mm(by_hand(x2, r.input, 1, p2),
                                           by_hand(w0, r.weight, 1, p2).t(), at::kFloat, true);
    EXPECT_EQ(max_abs_diff(y.view({32, 32}), y_hand), 0.0) << name;
    // grad_input = grad_output @ weight
    const at::Tensor gi_hand =
        q::scaled_mm(by_hand(go2, r.grad_output, 1, p2),
                     by_hand(w0, r.weight_for_grad_input, 0, p2), at::kFloat, true);
    EXPECT_EQ(max_abs_diff(xin.grad().view({32, 64}), gi_hand), 0.0) << name;
    // grad_weight = grad_output^T @ input
    const at::Tensor gw_hand =
        r.input_for_grad_weight.scaling == q::Scaling::kNone
            ? at::mm(go2.t(), x2)
            : q::scaled_mm(by_hand(go2, r.grad_output_for_grad_weight, 0, p2).t(),
                           by_hand(x2, r.input_for_grad_weight, 0, p2), at::kFloat, true);
    EXPECT_EQ(max_abs_diff(w.grad(), gw_hand), 0.0) << name;
    // And all of it near the float32 linear.
    const double scale = at::linear(x, w0).abs().max().item<double>();
    EXPECT_LT(max_abs_diff(y, at::linear(x, w0)) / scale, 0.08) << name;
  }
  // The formats: tensorwise gradients in e5m2, the rowwise recipes e4m3 everywhere.
  EXPECT_EQ(q::float8_recipe("tensorwise").grad_output.format, q::Float8Format::kE5M2);
  EXPECT_EQ(q::float8_recipe("rowwise").grad_output.format, q::Float8Format::kE4M3);
  EXPECT_EQ(q::float8_recipe("rowwise_with_gw_hp").weight_for_grad_input.scaling,
            q::Scaling::kTensorwise);
  EXPECT_FALSE(q::float8_recipe("tensorwise").power_of_2);
  EXPECT_TRUE(q::float8_recipe("tensorwise", true).power_of_2);
  EXPECT_FALSE(q::float8_recipe("rowwise", false).power_of_2);
}

namespace {

// A blockwise cast by hand, tile by tile: x [R, C] in tiles of tile_rows x tile_cols (edge tiles
// cut short), each scaled by 448 / its max |x| (float64, then float32), returned dequantized
// as the GEMM reads it (data * (1 / scale)).
at::Tensor blockwise_by_hand(const at::Tensor& x, int64_t tile_rows, int64_t tile_cols) {
  at::Tensor out = at::empty_like(x);
  for (int64_t r = 0; r < x.size(0); r += tile_rows) {
    for (int64_t c = 0; c < x.size(1); c += tile_cols) {
      const at::Tensor tile = x.slice(0, r, r + tile_rows).slice(1, c, c + tile_cols);
      const at::Tensor scale = (448.0 / tile.abs().max().to(at::kDouble)).to(at::kFloat);
      const at::Tensor data = (tile * scale).clamp(-448, 448).to(at::kFloat8_e4m3fn);
      out.slice(0, r, r + tile_rows).slice(1, c, c + tile_cols) =
          data.to(at::kFloat) * scale.reciprocal();
    }
  }
  return out;
}

}  // namespace

// DeepSeek-V3's recipe, emulated: each of the linear's three GEMMs equals its definition with
// the tiles cut by hand (200 tokens: the weight gradient's 128-token tiles end short).
TEST(Float8, BlockwiseRecipeCastsTilesAndBlocksAsDeepSeekV3Defines) {
  const at::Tensor x = randn({200, 256}, 16) * 3;
  const at::Tensor w0 = randn({384, 256}, 17) * 0.1;
  const at::Tensor go = randn({200, 384}, 18);
  q::Float8LinearOptions options;
  options.recipe = q::float8_recipe("blockwise");
  options.emulate = true;
  at::Tensor xin = x.clone().set_requires_grad(true);
  at::Tensor w = w0.clone().set_requires_grad(true);
  at::Tensor y = q::float8_linear(xin, w, options);
  y.backward(go);
  const at::Tensor w_blocks = blockwise_by_hand(w0, 128, 128);
  // output = input (1 x 128 tiles along K) @ weight (128 x 128 blocks)^T
  EXPECT_EQ(max_abs_diff(y, at::mm(blockwise_by_hand(x, 1, 128), w_blocks.t())), 0.0);
  // grad_input = grad_output (1 x 128 tiles along N) @ weight (the same blocks)
  EXPECT_EQ(max_abs_diff(xin.grad(), at::mm(blockwise_by_hand(go, 1, 128), w_blocks)), 0.0);
  // grad_weight = grad_output^T @ input, both cast again in 128-token tiles along M
  EXPECT_EQ(max_abs_diff(w.grad(),
                         at::mm(blockwise_by_hand(go, 128, 1).t(), blockwise_by_hand(x, 128, 1))),
            0.0);
  // The scales' shapes: one per tile.
  const q::Float8Tensor xq = q::quantize(x, options.recipe.input, 1, false);
  EXPECT_EQ(xq.scale.sizes(), (std::vector<int64_t>{200, 2}));
  const q::Float8Tensor wq = q::quantize(w0, options.recipe.weight, 1, false);
  EXPECT_EQ(wq.scale.sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(wq.t().scale.sizes(), (std::vector<int64_t>{2, 3}));
  // Near the float32 linear, and closer than one scale for the whole tensor would be.
  const double scale = at::mm(x, w0.t()).abs().max().item<double>();
  EXPECT_LT(max_abs_diff(y, at::mm(x, w0.t())) / scale, 0.05);
  // An outlier in one tile costs only that tile its precision.
  at::Tensor spiky = x.clone();
  spiky.index_put_({0, 0}, 1e4);
  const q::Float8Tensor spiky_q = q::quantize(spiky, options.recipe.input, 1, false);
  EXPECT_EQ(max_abs_diff(spiky_q.dequantize().slice(0, 1), xq.dequantize().slice(0, 1)), 0.0);
  EXPECT_EQ(options.recipe.grad_output.format, q::Float8Format::kE4M3);
  EXPECT_FALSE(options.recipe.power_of_2);
}

// Weights cast once per optimizer step: two microbatches' forwards and backwards take one
// weight cast (two for rowwise, whose forward and grad_input GEMMs scale the weight along other
// dimensions), the optimizer's step (fused AdamW, which writes in place) drops it, and the
// numbers equal casting at every use bit for bit.
TEST(Float8, WeightsAreCastOncePerOptimizerStep) {
  for (const char* name : {"tensorwise", "rowwise", "blockwise"}) {
    SCOPED_TRACE(name);
    std::vector<at::Tensor> grads[2], outputs[2];
    int64_t casts = 0;
    for (bool cached : {false, true}) {
      q::Float8LinearOptions options;
      options.recipe = q::float8_recipe(name);
      options.emulate = true;
      options.cache_weight_casts = cached;
      auto compute = std::make_shared<q::Float8LinearCompute>(options);
      at::Tensor w = (randn({256, 128}, 20) * 0.1).set_requires_grad(true);
      loom::config::OptimizerSection adamw;  // AdamW, at::_fused_adamw_
      adamw.lr = 1e-2;
      auto optimizer = loom::optim::build_optimizer(adamw, std::vector<at::Tensor>{w});
      for (int step = 0; step < 2; ++step) {
        for (int micro = 0; micro < 2; ++micro) {
          // An input that wants its gradient: the backward's grad_input GEMM casts the weight.
          const at::Tensor x = randn({2, 64, 128}, 21 + step * 2 + micro).set_requires_grad(true);
          at::Tensor y = compute->forward(x, w);
          y.pow(2).sum().backward();
          outputs[cached].push_back(y.detach());
        }
        grads[cached].push_back(w.grad().clone());
        optimizer->step();
        optimizer->zero_grad();
      }
      if (cached) casts = compute->weight_casts().casts_made();
    }
    const int64_t per_step = std::string(name) == "rowwise" ? 2 : 1;
    EXPECT_EQ(casts, 2 * per_step) << "one weight cast per step for the forwards and backwards";
    for (size_t i = 0; i < outputs[0].size(); ++i) {
      EXPECT_TRUE(at::equal(outputs[0][i], outputs[1][i])) << "output " << i;
    }
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_TRUE(at::equal(grads[0][i], grads[1][i])) << "weight gradient of step " << i;
    }
  }
}

// Under autocast the input is cast to the autocast dtype before its float8 cast, as torchao's
// Float8Linear does: the output and every gradient equal the linear of the bfloat16 input
// outside autocast (not an amax of the float32 values), and the weight gradient comes in
// grad_output's dtype (bfloat16-rounded, then float32 for the float32 weight), as torchao's.
TEST(Float8, UnderAutocastTheInputIsCastToItsDtypeFirstAsTorchaoDoes) {
  for (const char* name : {"tensorwise", "rowwise", "blockwise"}) {
    SCOPED_TRACE(name);
    q::Float8LinearOptions options;
    options.recipe = q::float8_recipe(name);
    options.emulate = true;
    const at::Tensor x0 = randn({32, 128}, 60) * 3;
    const at::Tensor w0 = randn({48, 128}, 61) * 0.1;
    const at::Tensor go = randn({32, 48}, 62).to(at::kBFloat16);
    at::Tensor x = x0.clone().set_requires_grad(true);
    at::Tensor w = w0.clone().set_requires_grad(true);
    at::Tensor y;
    {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      y = q::Float8LinearCompute(options).forward(x, w);
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
    }
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    y.backward(go);
    at::Tensor x_bf16 = x0.to(at::kBFloat16).set_requires_grad(true);
    at::Tensor w_ref = w0.clone().set_requires_grad(true);
    const at::Tensor y_ref = q::Float8LinearCompute(options).forward(x_bf16, w_ref);
    y_ref.backward(go);
    EXPECT_TRUE(at::equal(y, y_ref)) << max_abs_diff(y, y_ref);
    EXPECT_TRUE(at::equal(x.grad(), x_bf16.grad().to(at::kFloat)));
    EXPECT_TRUE(at::equal(w.grad(), w_ref.grad()));
    EXPECT_TRUE(at::equal(w.grad(), w.grad().to(at::kBFloat16).to(at::kFloat)))
        << "the weight gradient in grad_output's dtype";
  }
}

// The grouped kernel's right operand: all experts cast in one pass, bit for bit each expert's
// own row-wise cast (what the emulation does group by group), zeros and an outlier included.
TEST(Float8, ExpertsCastTogetherAsEachAlone) {
  at::Tensor w = randn({3, 64, 48}, 50);
  w.index_put_({1, 5, 7}, 0);
  w.index_put_({2, 9, 3}, 900.0);
  w[0].zero_();  // an expert with nothing to scale
  const q::Float8ExpertCasts all = q::quantize_experts(w);
  ASSERT_EQ(all.scale.sizes(), (std::vector<int64_t>{3, 48}));
  for (int64_t e = 0; e < 3; ++e) {
    const q::Float8Tensor one =
        q::quantize(w[e], {q::Scaling::kAxiswise, q::Float8Format::kE4M3}, 0, /*power_of_2=*/true);
    EXPECT_TRUE(at::equal(all.data[e].view(at::kByte), one.data.view(at::kByte))) << e;
    EXPECT_TRUE(at::equal(all.scale[e], one.scale.reshape({-1}))) << e;
  }
}

// Linears that read one activation inside a SharedInputScope (attention's q, k and v; the
// feed-forward's w1 and w3) share its forward cast: three linears, one cast, and each output
// and gradient bit for bit what casting per linear gives. Outside a scope each casts its own.
TEST(Float8, LinearsReadingOneActivationShareItsCast) {
  // Under autocast too: the three readers share the activation's bfloat16 copy, and its cast.
  for (const auto& [name, autocast] :
       {std::pair{"tensorwise", false}, std::pair{"rowwise", false}, std::pair{"blockwise", false},
        std::pair{"tensorwise", true}}) {
    SCOPED_TRACE(std::string(name) + (autocast ? " under autocast" : ""));
    q::Float8LinearOptions options;
    options.recipe = q::float8_recipe(name);
    options.emulate = true;
    std::vector<std::shared_ptr<q::Float8LinearCompute>> linears;
    std::vector<at::Tensor> weights;
    for (int i = 0; i < 3; ++i) {
      linears.push_back(std::make_shared<q::Float8LinearCompute>(options));
      weights.push_back((randn({128, 256}, 30 + i) * 0.1).set_requires_grad(true));
    }
    std::vector<at::Tensor> outputs[2], grads[2];
    int64_t casts[2] = {0, 0};
    for (bool shared : {false, true}) {
      const at::Tensor x = randn({2, 32, 256}, 40).set_requires_grad(true);
      const int64_t before = q::float8_input_casts_made();
      at::Tensor sum;
      {
        std::optional<loom::models::SharedInputScope> scope;
        if (shared) scope.emplace(x);
        at::autocast::set_autocast_enabled(at::kCPU, autocast);
        at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
        for (int i = 0; i < 3; ++i) {
          const at::Tensor y = linears[i]->forward(x, weights[i]).to(at::kFloat);
          outputs[shared].push_back(y.detach());
          sum = sum.defined() ? sum + y.pow(2).sum() : y.pow(2).sum();
        }
        at::autocast::set_autocast_enabled(at::kCPU, false);
      }
      casts[shared] = q::float8_input_casts_made() - before;
      sum.backward();
      grads[shared].push_back(x.grad().clone());
      for (auto& w : weights) {
        grads[shared].push_back(w.grad().clone());
        w.mutable_grad() = at::Tensor();
      }
    }
    EXPECT_EQ(casts[0], 3);
    EXPECT_EQ(casts[1], 1) << "one cast for the three readers";
    for (size_t i = 0; i < outputs[0].size(); ++i) {
      EXPECT_TRUE(at::equal(outputs[0][i], outputs[1][i])) << "output " << i;
    }
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_TRUE(at::equal(grads[0][i], grads[1][i])) << "gradient " << i;
    }
  }
}

// The model declares its shared activations: one forward of the debug model casts each block's
// attention input once (q, k, v), its feed-forward input once (w1, w3), and wo's and w2's
// inputs: 4 casts a block instead of 7.
TEST(Float8, TheModelsBlocksCastEachSharedActivationOnce) {
  loom::config::JobConfig config;  // llama3 debugmodel: 6 blocks
  config.model.converters = {"float8"};
  config.quantize.linear.float8.emulate = true;
  auto model = loom::models::build_model(config, 96, at::TensorOptions().dtype(at::kFloat));
  model->init_weights(1);
  auto conversion = q::convert_to_float8(model->module(), q::float8_options(config), {});
  ASSERT_EQ(conversion.converted.size(), 42u);
  const at::Tensor tokens = at::randint(0, 96, {1, 16}, at::kLong);
  const int64_t before = q::float8_input_casts_made();
  (void)model->forward(tokens);
  EXPECT_EQ(q::float8_input_casts_made() - before, 6 * 4);
}

TEST(Float8, ConverterPicksLinearsAndKeepsTheStateDict) {
  loom::config::JobConfig config;  // llama3 debugmodel
  config.model.converters = {"float8"};
  config.quantize.linear.float8.filter_fqns = {"layers.1.feed_forward"};
  config.quantize.linear.float8.emulate = true;
  auto model = loom::models::build_model(config, 0, at::TensorOptions().device(at::kMeta));
  std::vector<std::pair<std::string, at::Tensor>> before;
  for (const auto& p : model->module().named_parameters()) before.emplace_back(p.key(), p.value());
  const q::Conversion c = q::convert_to_float8(model->module(), q::float8_options(config),
                                               config.quantize.linear.float8.filter_fqns);
  auto has = [](const std::vector<std::string>& list, const std::string& prefix) {
    for (const auto& s : list) {
      if (s.rfind(prefix, 0) == 0) return true;
    }
    return false;
  };
  EXPECT_TRUE(has(c.converted, "layers.0.attention.wq"));
  EXPECT_TRUE(has(c.converted, "layers.0.feed_forward.w2"));
  EXPECT_TRUE(has(c.skipped, "output (output layer)"));
  EXPECT_TRUE(has(c.skipped, "layers.1.feed_forward.w1 (filter_fqns"));
  EXPECT_FALSE(has(c.converted, "output"));
  size_t n = 0;
  for (const auto& p : model->module().named_parameters()) {
    ASSERT_LT(n, before.size());
    EXPECT_EQ(p.key(), before[n].first);
    EXPECT_EQ(p.value().scalar_type(), before[n].second.scalar_type());
    EXPECT_EQ(p.value().sizes(), before[n].second.sizes());
    ++n;
  }
  EXPECT_EQ(n, before.size());
  // Dims that are not multiples of 16 stay in high precision.
  torch::nn::Module root;
  root.register_module("odd", loom::models::Linear(24, 32, at::TensorOptions().device(at::kMeta)));
  root.register_module("even", loom::models::Linear(32, 48, at::TensorOptions().device(at::kMeta)));
  const q::Conversion small = q::convert_to_float8(root, q::float8_options(config), {});
  EXPECT_EQ(small.converted, std::vector<std::string>{"even"});
  // Blockwise: whole 128 x 128 weight blocks only.
  config.quantize.linear.float8.recipe_name = "blockwise";
  root.register_module("blocks",
                       loom::models::Linear(256, 384, at::TensorOptions().device(at::kMeta)));
  const q::Conversion blocks = q::convert_to_float8(root, q::float8_options(config), {});
  EXPECT_EQ(blocks.converted, std::vector<std::string>{"blocks"});
  EXPECT_TRUE(has(blocks.skipped, "even (dims 32x48 not multiples of 128)"));
}

TEST(Float8, ConfigKeysAreImplementedAndChecked) {
  auto loaded = loom::testing::load_toml(R"(
[model]
converters = ["float8"]
[quantize.linear.float8]
recipe_name = "rowwise"
filter_fqns = ["output"]
emulate = true
round_scales_to_power_of_2 = false
)");
  EXPECT_TRUE(loaded.unimplemented_keys.empty())
      << loaded.unimplemented_keys.size() << " unimplemented, e.g. "
      << loaded.unimplemented_keys.front();
  EXPECT_TRUE(loom::train::unsupported_features(loaded.config, {}).empty());
  const std::string bad = loom::testing::load_error(R"(
[quantize.linear.float8]
recipe_name = "rowwize"
)");
  EXPECT_NE(bad.find("quantize.linear.float8.recipe_name"), std::string::npos) << bad;
  EXPECT_THROW(q::float8_recipe("rowwize"), loom::InputError);
  // A float8 all-gather needs per-tensor weight scales; unknown converters are refused.
  loom::config::JobConfig c = loaded.config;
  c.quantize.linear.float8.enable_fsdp_float8_all_gather = true;
  auto problems = loom::train::unsupported_features(c, {});
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("enable_fsdp_float8_all_gather"), std::string::npos) << problems[0];
  c = loaded.config;
  c.model.converters = {"mx"};
  problems = loom::train::unsupported_features(c, {});
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("unknown converter 'mx'"), std::string::npos) << problems[0];
}

// Each group of the experts' grouped GEMM is a row-wise float8 GEMM (e4m3, power-of-two scales
// along each GEMM's reduction dim), forward and both gradients; empty groups get zeros.
TEST(Float8, GroupedGemmIsRowwisePerGroup) {
  const at::Tensor x0 = randn({20, 32}, 9), w0 = randn({3, 32, 48}, 10) * 0.1;
  const at::Tensor go = randn({20, 48}, 11);
  const at::Tensor counts = at::tensor(std::vector<int64_t>{8, 0, 12});
  at::Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  at::Tensor y = q::float8_grouped_mm(x, w, counts);
  y.backward(go);
  const q::CastSpec rows{q::Scaling::kAxiswise, q::Float8Format::kE4M3};
  auto mm = [&](const at::Tensor& a, const at::Tensor& b) {
    return q::scaled_mm(by_hand(a, rows, 1, true), by_hand(b, rows, 0, true), at::kFloat, true);
  };
  int64_t row = 0;
  for (int64_t g : {0, 2}) {
    const int64_t n = g == 0 ? 8 : 12;
    const at::Tensor xg = x0.narrow(0, row, n), gog = go.narrow(0, row, n);
    EXPECT_EQ(max_abs_diff(y.narrow(0, row, n), mm(xg, w0[g])), 0.0) << g;
    EXPECT_EQ(max_abs_diff(x.grad().narrow(0, row, n), mm(gog, w0[g].t())), 0.0) << g;
    EXPECT_EQ(max_abs_diff(w.grad()[g], mm(xg.t(), gog)), 0.0) << g;
    row += n;
  }
  EXPECT_EQ(w.grad()[1].abs().max().item<float>(), 0.0f);
  EXPECT_LT(max_abs_diff(y.narrow(0, 0, 8), at::mm(x0.narrow(0, 0, 8), w0[0])) /
                at::mm(x0.narrow(0, 0, 8), w0[0]).abs().max().item<double>(),
            0.08);
  // The converter finds the MoE layers' routed experts by name.
  loom::config::JobConfig config;
  config.model.name = "qwen3_moe";
  config.model.flavor = "debugmodel_moe";
  config.model.converters = {"float8", "quantize.grouped_mm.float8"};
  config.quantize.grouped_mm.float8.fqns = {"experts"};
  EXPECT_TRUE(loom::train::unsupported_features(config, {}).empty());
  auto model = loom::models::build_model(config, 0, at::TensorOptions().device(at::kMeta));
  const auto converted = q::convert_grouped_to_float8(model->module(), {"experts"});
  ASSERT_FALSE(converted.empty());
  EXPECT_NE(converted.front().find("moe.experts"), std::string::npos) << converted.front();
  EXPECT_TRUE(q::convert_grouped_to_float8(model->module(), {"no_such"}).empty());
}
