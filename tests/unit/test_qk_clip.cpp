// QK-clip (MuonClip): a layer whose logits are driven past the threshold gets the rescaled
// projections a hand computation gives, and its offending heads then reach the threshold exactly
// on the same input (multi-head and latent attention) or at most it (grouped-query), the other
// heads untouched.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "loom/models/common/qk_clip.h"
#include "loom/models/deepseek_v3/args.h"
#include "model_test_util.h"

namespace loom {
namespace {

using models::MaxLogits;

// Layer 0's statistic over one training forward of `tokens` (its input does not depend on any
// later weight).
at::Tensor layer0_logits(models::DecoderModel& model, MaxLogits& statistic,
                         const at::Tensor& tokens) {
  statistic.enabled = true;
  statistic.per_head = at::Tensor();
  model.module().train();
  model.forward(tokens);
  return statistic.per_head.clone();
}

// A threshold between the smallest and the largest head, so some heads pass it and some not.
double middle(const at::Tensor& s) {
  return 0.5 * (s.min().item<double>() + s.max().item<double>());
}

// rows [h * per_head, (h + 1) * per_head) of `w` times factor(h, row within the head).
at::Tensor scaled_by_hand(const at::Tensor& w, int64_t heads, int64_t per_head,
                          const std::function<double(int64_t, int64_t)>& factor) {
  at::Tensor out = w.clone();
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < per_head; ++r) out[h * per_head + r].mul_(factor(h, r));
  }
  return out;
}

void apply(const models::RowFactors& factors, const std::map<std::string, at::Tensor>& weights) {
  at::NoGradGuard no_grad;
  for (const auto& [name, rows] : factors) weights.at(name).mul_(rows.unsqueeze(1));
}

TEST(QkClip, MultiHeadLogitsPastTheThresholdEndAtIt) {
  auto args = testing::tiny_llama_args();
  args.n_kv_heads = args.n_heads;  // one key per query head: the bound is exact
  auto model = testing::decoder_lm(args, 7);
  auto attention = model->transformer()->blocks[0]->attention;
  {
    at::NoGradGuard no_grad;  // large logits, as a run that needs the clip has
    attention->wq->weight.mul_(40);
    attention->wk->weight.mul_(40);
  }
  const at::Tensor tokens = at::randint(0, 97, {2, 16}, at::kLong);
  const at::Tensor before = layer0_logits(*model, attention->max_logits, tokens);
  const double tau = middle(before);
  ASSERT_TRUE((before > tau).any().item<bool>() && (before < tau).any().item<bool>()) << before;

  const at::Tensor gammas = models::qk_clip_gammas(before, tau);
  const int64_t hd = attention->head_dim, heads = args.n_heads;
  auto gamma = [&](int64_t h) { return std::min(1.0, tau / before[h].item<double>()); };
  const at::Tensor wq = scaled_by_hand(attention->wq->weight, heads, hd,
                                       [&](int64_t h, int64_t) { return std::sqrt(gamma(h)); });
  const at::Tensor wk = scaled_by_hand(attention->wk->weight, heads, hd,
                                       [&](int64_t h, int64_t) { return std::sqrt(gamma(h)); });
  apply(models::grouped_query_row_factors(gammas, heads, hd, 0.5),
        {{"wq", attention->wq->weight}, {"wk", attention->wk->weight}});
  EXPECT_TRUE(at::allclose(attention->wq->weight, wq, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(attention->wk->weight, wk, 1e-6, 1e-7));

  const at::Tensor after = layer0_logits(*model, attention->max_logits, tokens);
  for (int64_t h = 0; h < heads; ++h) {
    const double want = before[h].item<double>() > tau ? tau : before[h].item<double>();
    EXPECT_NEAR(after[h].item<double>(), want, 1e-4 * std::abs(want)) << "head " << h;
  }
}

TEST(QkClip, GroupedQueryHeadsEndAtOrUnderTheThresholdWithTheirGroupsKeyScaledByItsMin) {
  auto args = testing::tiny_llama_args();  // 4 query heads over 2 kv heads
  auto model = testing::decoder_lm(args, 9);
  auto attention = model->transformer()->blocks[0]->attention;
  {
    at::NoGradGuard no_grad;
    attention->wq->weight.mul_(40);
    attention->wk->weight.mul_(40);
  }
  const at::Tensor tokens = at::randint(0, 97, {2, 16}, at::kLong);
  const at::Tensor before = layer0_logits(*model, attention->max_logits, tokens);
  const double tau = middle(before), alpha = 0.3;
  const int64_t hd = attention->head_dim;
  auto gamma = [&](int64_t h) { return std::min(1.0, tau / before[h].item<double>()); };
  const at::Tensor wq = scaled_by_hand(
      attention->wq->weight, 4, hd, [&](int64_t h, int64_t) { return std::pow(gamma(h), alpha); });
  const at::Tensor wk = scaled_by_hand(attention->wk->weight, 2, hd, [&](int64_t g, int64_t) {
    return std::pow(std::min(gamma(2 * g), gamma(2 * g + 1)), 1 - alpha);
  });
  apply(models::grouped_query_row_factors(models::qk_clip_gammas(before, tau), 2, hd, alpha),
        {{"wq", attention->wq->weight}, {"wk", attention->wk->weight}});
  EXPECT_TRUE(at::allclose(attention->wq->weight, wq, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(attention->wk->weight, wk, 1e-6, 1e-7));
  const at::Tensor after = layer0_logits(*model, attention->max_logits, tokens);
  EXPECT_LE(after.max().item<double>(), tau * (1 + 1e-4)) << before << after;
}

// Kimi K2's rule on DeepSeek's attention: per head, the no-rope query and key parts by
// sqrt(gamma), the rope query part by gamma, values and the shared rotary key untouched; with
// and without the query's low-rank path.
TEST(QkClip, LatentAttentionHeadsPastTheThresholdEndAtItAndTheOthersKeepTheirs) {
  for (int64_t q_lora : {0, 8}) {
    SCOPED_TRACE("q_lora_rank " + std::to_string(q_lora));
    auto args = testing::tiny_llama_args();
    args.n_kv_heads.reset();
    args.use_scaled_rope = false;
    args.mla = models::MLAArgs{q_lora, 16, 8, 8, 12, 1e-6};
    auto model = std::make_unique<models::DecoderModel>("deepseek_v3", "test", args,
                                                        at::TensorOptions(), models::ModelPart{},
                                                        models::deepseek_v3::init_parameter);
    model->init_weights(5);
    auto attention = model->transformer()->blocks[0]->latent_attention;
    models::Linear query = q_lora == 0 ? attention->wq : attention->wq_b;
    {
      at::NoGradGuard no_grad;
      query->weight.mul_(30);
      attention->wkv_b->weight.mul_(30);
      attention->wkv_a->weight.mul_(5);
    }
    const at::Tensor tokens = at::randint(0, 97, {2, 16}, at::kLong);
    const at::Tensor before = layer0_logits(*model, attention->max_logits, tokens);
    const double tau = middle(before);
    ASSERT_TRUE((before > tau).any().item<bool>() && (before < tau).any().item<bool>());
    auto gamma = [&](int64_t h) { return std::min(1.0, tau / before[h].item<double>()); };
    const at::Tensor wq = scaled_by_hand(query->weight, 4, 16, [&](int64_t h, int64_t r) {
      return r < 8 ? std::sqrt(gamma(h)) : gamma(h);  // 8 no-rope rows, then 8 rope rows
    });
    const at::Tensor wkv_b =
        scaled_by_hand(attention->wkv_b->weight, 4, 20,
                       [&](int64_t h, int64_t r) { return r < 8 ? std::sqrt(gamma(h)) : 1.0; });
    const at::Tensor wkv_a = attention->wkv_a->weight.clone();
    const std::string query_name = q_lora == 0 ? "wq" : "wq_b";
    apply(models::latent_row_factors(models::qk_clip_gammas(before, tau), args.mla.value(),
                                     query_name, 0.5),
          {{query_name, query->weight}, {"wkv_b", attention->wkv_b->weight}});
    EXPECT_TRUE(at::allclose(query->weight, wq, 1e-6, 1e-7));
    EXPECT_TRUE(at::allclose(attention->wkv_b->weight, wkv_b, 1e-6, 1e-7));
    EXPECT_TRUE(at::equal(attention->wkv_a->weight, wkv_a));
    const at::Tensor after = layer0_logits(*model, attention->max_logits, tokens);
    for (int64_t h = 0; h < 4; ++h) {
      const double want = before[h].item<double>() > tau ? tau : before[h].item<double>();
      EXPECT_NEAR(after[h].item<double>(), want, 1e-4 * std::abs(want)) << "head " << h;
    }
  }
}

// Validation and generation forwards do not count; a logit at or under tau clips nothing.
TEST(QkClip, OnlyTrainingForwardsCountAndHeadsUnderTheThresholdKeepGammaOne) {
  auto model = testing::decoder_lm(testing::tiny_llama_args(), 3);
  auto& statistic = model->transformer()->blocks[0]->attention->max_logits;
  statistic.enabled = true;
  const at::Tensor tokens = at::randint(0, 97, {1, 8}, at::kLong);
  {
    at::NoGradGuard no_grad;
    model->forward(tokens);
  }
  EXPECT_FALSE(statistic.per_head.defined());
  model->module().eval();
  model->forward(tokens);
  EXPECT_FALSE(statistic.per_head.defined());
  const float inf = std::numeric_limits<float>::infinity();
  const at::Tensor gammas = models::qk_clip_gammas(at::tensor({-inf, -3.0f, 2.0f, 8.0f}), 4.0);
  EXPECT_TRUE(at::allclose(gammas, at::tensor({1.0f, 1.0f, 1.0f, 0.5f})));
  // A diverged step's S (inf, NaN) clips nothing: factors of 0 or NaN would ruin the weights.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(at::equal(models::qk_clip_gammas(at::tensor({inf, nan, 8.0f}), 4.0),
                        at::tensor({1.0f, 1.0f, 0.5f})));
}

}  // namespace
}  // namespace loom
