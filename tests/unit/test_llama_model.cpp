#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <set>

#include <torch/csrc/autograd/function.h>

#include "loom/core/check.h"
#include "loom/models/llama/init.h"
#include "loom/models/common/attention.h"
#include "loom/models/common/init.h"
#include "loom/models/common/rope.h"
#include "loom/models/common/decoder.h"
#include "loom/models/model_spec.h"
#include "loom/models/qwen3/args.h"
#include "unit/model_test_util.h"

namespace llama = loom::models::llama;
using loom::testing::tiny_llama_args;

namespace {

loom::models::Transformer tiny_model(uint64_t seed = 1, llama::LlamaArgs args = tiny_llama_args()) {
  loom::models::Transformer model(args, at::TensorOptions().dtype(at::kFloat));
  llama::init_weights(model, seed);
  return model;
}

}  // namespace

TEST(LlamaArgs, FfnHiddenSizeMatchesLlama3) {
  const auto& f = llama::llama3_flavors();
  EXPECT_EQ(f.at("debugmodel").ffn_hidden_dim(), 768);
  EXPECT_EQ(f.at("8B").ffn_hidden_dim(), 14336);
  EXPECT_EQ(f.at("70B").ffn_hidden_dim(), 28672);
  EXPECT_EQ(f.at("405B").ffn_hidden_dim(), 53248);
  EXPECT_EQ(loom::models::ffn_hidden_dim(64, 32, std::nullopt), 192);
}

TEST(LlamaArgs, FlavorParameterCountsOnMeta) {
  const auto& spec = loom::models::find_model_spec("llama3");
  auto count = [&](const std::string& flavor) {
    loom::models::BuildOptions options;
    options.flavor = flavor;
    options.tensor_options = at::TensorOptions().device(at::kMeta);
    return spec.build(options)->summary(8192).total_params;
  };
  EXPECT_EQ(count("8B"), 8030261248);
  // 8B less 28 of its layers (218112000 parameters each).
  EXPECT_EQ(count("8B_4layers"), 8030261248 - 28 * 218112000LL);
  EXPECT_EQ(count("70B"), 70553706496);
  EXPECT_EQ(count("405B"), 405853388800);
}

TEST(LlamaArgs, SummaryFlopsFollowTheFormula) {
  const auto& spec = loom::models::find_model_spec("llama3");
  loom::models::BuildOptions options;
  options.flavor = "8B";
  options.tensor_options = at::TensorOptions().device(at::kMeta);
  auto summary = spec.build(options)->summary(8192);
  const double expected = 6.0 * (8030261248.0 - 128256.0 * 4096) + 12.0 * 32 * 32 * 128 * 8192;
  EXPECT_DOUBLE_EQ(summary.flops_per_token, expected);
  EXPECT_THROW(loom::models::check_flavor(spec, "9B"), loom::InputError);
  EXPECT_THROW(loom::models::find_model_spec("gpt5"), loom::InputError);
}

TEST(LlamaArgs, InconsistentArgumentsAreRejected) {
  auto args = tiny_llama_args();
  args.n_kv_heads = 3;
  EXPECT_THROW(args.validate(), loom::InputError);
  args = tiny_llama_args();
  args.dim = 66;
  EXPECT_THROW(args.validate(), loom::InputError);
}

TEST(RMSNorm, MatchesTheDefinition) {
  loom::models::RMSNorm norm(8, 1e-5, at::TensorOptions());
  at::NoGradGuard no_grad;
  norm->weight.copy_(at::arange(1, 9, at::kFloat));
  at::Tensor x = at::randn({3, 8}, at::kDouble);
  at::Tensor expected =
      x / at::sqrt(x.pow(2).mean(-1, true) + 1e-5) * at::arange(1, 9, at::kDouble);
  at::Tensor got = norm->forward(x.to(at::kFloat));
  EXPECT_TRUE(at::allclose(got.to(at::kDouble), expected, 1e-5, 1e-6));
}

TEST(Rope, RotatesEachPairByPositionTimesFrequency) {
  // head_dim 4: frequencies 1 and theta^-1/2; rotation of each adjacent pair by pos * freq.
  llama::LlamaArgs args;
  args.dim = 4;
  args.n_heads = 1;
  args.rope_theta = 10000;
  args.use_scaled_rope = false;
  at::Tensor freqs_cis = loom::models::precompute_freqs_cis(args, 5, at::kCPU);
  at::Tensor x = at::randn({1, 5, 1, 4}, at::kFloat);
  at::Tensor out = loom::models::apply_rotary_emb(x, freqs_cis);
  const double freqs[2] = {1.0, 1.0 / 100.0};
  for (int64_t pos = 0; pos < 5; ++pos) {
    for (int pair = 0; pair < 2; ++pair) {
      const double angle = pos * freqs[pair];
      const double a = x[0][pos][0][2 * pair].item<double>();
      const double b = x[0][pos][0][2 * pair + 1].item<double>();
      EXPECT_NEAR(out[0][pos][0][2 * pair].item<double>(),
                  a * std::cos(angle) - b * std::sin(angle), 1e-5);
      EXPECT_NEAR(out[0][pos][0][2 * pair + 1].item<double>(),
                  a * std::sin(angle) + b * std::cos(angle), 1e-5);
    }
  }
}

TEST(Rope, Llama31ScalingKeepsHighAndDividesLowFrequencies) {
  loom::models::RopeScaling scaling;
  at::Tensor plain = loom::models::rope_frequencies(128, 500000, false, scaling);
  at::Tensor scaled = loom::models::rope_frequencies(128, 500000, true, scaling);
  // Wavelength below 8192 / 4 = 2048: unchanged. Above 8192: divided by 8. Between: blended.
  for (int64_t i = 0; i < 64; ++i) {
    const double f = plain[i].item<double>();
    const double wavelen = 2 * M_PI / f;
    const double s = scaled[i].item<double>();
    if (wavelen < 2048) {
      EXPECT_FLOAT_EQ(s, f);
    } else if (wavelen > 8192) {
      EXPECT_FLOAT_EQ(s, f / 8);
    } else {
      EXPECT_LE(s, f);
      EXPECT_GE(s, f / 8);
    }
  }
}

TEST(Attention, RepeatKvServesConsecutiveQueryHeads) {
  at::Tensor kv = at::randn({2, 3, 2, 4});
  at::Tensor repeated = loom::models::repeat_kv(kv, 3);
  ASSERT_EQ(repeated.sizes(), (std::vector<int64_t>{2, 3, 6, 4}));
  for (int64_t head = 0; head < 6; ++head) {
    EXPECT_TRUE(at::equal(repeated.select(2, head), kv.select(2, head / 3)));
  }
}

TEST(Attention, GroupedQueryEqualsFullAttentionWithRepeatedWeights) {
  auto gqa_args = tiny_llama_args();  // 4 heads, 2 kv heads
  auto mha_args = gqa_args;
  mha_args.n_kv_heads = 4;
  loom::models::Attention gqa(gqa_args, at::TensorOptions());
  loom::models::Attention mha(mha_args, at::TensorOptions());
  at::NoGradGuard no_grad;
  for (auto* lin : {&gqa->wq, &gqa->wk, &gqa->wv, &gqa->wo}) (*lin)->weight.normal_(0, 0.1);
  const int64_t hd = gqa_args.head_dim();
  mha->wq->weight.copy_(gqa->wq->weight);
  mha->wo->weight.copy_(gqa->wo->weight);
  // Each kv head's rows, repeated for the two query heads it serves.
  mha->wk->weight.copy_(
      gqa->wk->weight.view({2, 1, hd, 64}).expand({2, 2, hd, 64}).reshape({4 * hd, 64}));
  mha->wv->weight.copy_(
      gqa->wv->weight.view({2, 1, hd, 64}).expand({2, 2, hd, 64}).reshape({4 * hd, 64}));
  at::Tensor freqs = loom::models::precompute_freqs_cis(gqa_args, 8, at::kCPU);
  at::Tensor x = at::randn({2, 8, 64});
  EXPECT_TRUE(at::allclose(gqa->forward(x, freqs), mha->forward(x, freqs), 1e-5, 1e-6));
}

TEST(Transformer, IsCausal) {
  auto model = tiny_model();
  at::NoGradGuard no_grad;
  at::Tensor tokens = at::randint(0, 97, {1, 12}, at::kLong);
  at::Tensor logits = model->forward(tokens);
  at::Tensor changed = tokens.clone();
  changed[0][7] = (changed[0][7].item<int64_t>() + 1) % 97;
  at::Tensor logits2 = model->forward(changed);
  EXPECT_TRUE(at::equal(logits.slice(1, 0, 7), logits2.slice(1, 0, 7)));
  EXPECT_FALSE(at::allclose(logits.slice(1, 7), logits2.slice(1, 7)));
}

TEST(Transformer, ParameterNamesFollowTorchtitan) {
  auto model = tiny_model();
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  std::vector<std::string> expected = {"tok_embeddings.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    for (const char* n : {"attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
                          "attention.wo.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
                          "feed_forward.w3.weight", "attention_norm.weight", "ffn_norm.weight"}) {
      expected.push_back(p + n);
    }
  }
  expected.push_back("norm.weight");
  expected.push_back("output.weight");
  EXPECT_EQ(names, expected);
  EXPECT_TRUE(model->named_buffers().is_empty());  // freqs_cis is recomputed, never saved
}

TEST(Init, FollowsTorchtitanDistributions) {
  auto args = tiny_llama_args();
  args.dim = 256;
  args.n_heads = 8;
  args.n_kv_heads = 8;
  args.n_layers = 3;
  auto model = tiny_model(7, args);
  auto params = model->named_parameters();
  EXPECT_NEAR(params["tok_embeddings.weight"].std().item<double>(), 1.0, 0.05);
  EXPECT_NEAR(params["layers.0.attention.wq.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(params["layers.2.attention.wo.weight"].std().item<double>(), 0.02 / std::sqrt(6.0),
              0.001);
  EXPECT_NEAR(params["layers.0.feed_forward.w3.weight"].std().item<double>(), 0.02 / std::sqrt(2.0),
              0.002);
  const double out_std = 1.0 / 16.0;
  EXPECT_LE(params["output.weight"].abs().max().item<double>(), 3 * out_std + 1e-6);
  EXPECT_TRUE(at::equal(params["norm.weight"], at::ones({256})));
}

// Qwen3 trains from scratch with torchtitan's rule too: the table tied to the head is drawn as
// the head (std dim^-0.5, cut at 3 std), not N(0, 1) and not Hugging Face's N(0, 0.02); the
// blocks' output projections are depth-scaled; the q/k norms start at 1.
TEST(Init, Qwen3DrawsItsTiedTableAsTheHead) {
  const auto args = loom::models::qwen3::qwen3_flavors().at("debugmodel");
  ASSERT_TRUE(args.tie_embeddings);
  loom::models::DecoderModel model("qwen3", "debugmodel", args, {}, loom::models::ModelPart{},
                                   loom::models::qwen3::init_parameter);
  model.init_weights(5);
  auto params = model.transformer()->named_parameters();
  const double head_std = 1.0 / std::sqrt(static_cast<double>(args.dim));
  const at::Tensor table = params["tok_embeddings.weight"];
  EXPECT_NEAR(table.std().item<double>(), head_std, 0.1 * head_std);
  EXPECT_LE(table.abs().max().item<double>(), 3 * head_std + 1e-6);
  const int64_t last = args.n_layers - 1;
  const std::string wo = "layers." + std::to_string(last) + ".attention.wo.weight";
  const double wo_std = 0.02 / std::sqrt(2.0 * static_cast<double>(args.n_layers));
  EXPECT_NEAR(params[wo].std().item<double>(), wo_std, 0.1 * wo_std);
  EXPECT_NEAR(params["layers.0.attention.wq.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_TRUE(at::equal(params["layers.0.attention.q_norm.weight"],
                        at::ones_like(params["layers.0.attention.q_norm.weight"])));
}

TEST(Init, DependsOnlyOnSeedAndName) {
  auto a = tiny_model(11);
  auto b = tiny_model(11);
  auto c = tiny_model(12);
  auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  for (const auto& item : pa) {
    EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
  }
  EXPECT_FALSE(at::equal(pa["layers.0.attention.wq.weight"], pc["layers.0.attention.wq.weight"]));
  // A deeper model draws the shared parameters identically: each comes from its own generator.
  auto deeper_args = tiny_llama_args();
  deeper_args.n_layers = 3;
  auto d = tiny_model(11, deeper_args);
  EXPECT_TRUE(at::equal(pa["layers.1.feed_forward.w2.weight"],
                        d->named_parameters()["layers.1.feed_forward.w2.weight"]));
}

namespace {

// Checkpointed regions in the autograd graph behind `output`.
int count_checkpoint_nodes(const at::Tensor& output) {
  std::vector<torch::autograd::Node*> stack = {output.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int count = 0;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!node || !seen.insert(node).second) continue;
    if (node->name() == "loom::CheckpointBackward") ++count;
    for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
  }
  return count;
}

}  // namespace

TEST(ActivationCheckpointWiring, ModeDecidesWhichBlocksAreCheckpointed) {
  loom::config::JobConfig config;  // debugmodel: 6 blocks
  config.training.seq_len = 16;
  auto model = loom::models::build_model(config, 64, at::TensorOptions().dtype(at::kFloat));
  model->init_weights(1);
  at::Tensor tokens = at::randint(0, 64, {1, 16}, at::kLong);
  auto checkpointed = [&](const char* mode, const char* option) {
    loom::config::ActivationCheckpointSection ac;
    ac.mode = mode;
    ac.selective_ac_option = option;
    model->apply_activation_checkpointing(ac);
    return count_checkpoint_nodes(model->forward(tokens));
  };
  EXPECT_EQ(checkpointed("none", "2"), 0);
  EXPECT_EQ(checkpointed("full", "2"), 6);
  EXPECT_EQ(checkpointed("selective", "2"), 3);
  EXPECT_EQ(checkpointed("selective", "3"), 2);
}
