// DeepSeek-V3 against transformers. Tiny random DeepseekV3ForCausalLM models made by the setup
// venv's transformers inside the test (tools/make_hf_deepseek_v3_model.py): latent attention with
// and without the q bottleneck, YaRN with the softmax-scale correction, interleaved and
// rotate-half rotary features, two dense layers then mixtures of 8 experts with group limits,
// sigmoid scores, a shared expert and a non-zero e_score_correction_bias. Checked: the first MoE
// block alone and the whole model's logits within 1e-5 of transformers' in float32, greedy tokens
// with the latent cache equal to transformers' generate() and to loom's own decoding without a
// cache, the cache's size per token, and import then export writing back the folder's tensors.
// The `plain` variant also as transformers 5.25 saved it (tests/data/hf_deepseek_v3/transformers5:
// rope_parameters instead of rope_scaling, dtype, head_dim).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/generate/generator.h"
#include "loom/generate/inference_model.h"
#include "loom/models/common/decoder_model.h"
#include "loom/models/common/kv_cache.h"
#include "loom/models/model_spec.h"
#include "support/process.h"
#include "unit/hf_test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
namespace test_hf_deepseek_v3 {  // its own names in a unity batch

using loom::testing::row_of;
using loom::testing::tensors_of;

loom::generate::InferenceModel load(const std::string& folder) {
  return loom::testing::load_hf_folder(folder, "deepseek_v3");
}

// qlora and plain by the venv's transformers 4, then plain by transformers 5.
std::vector<std::string> folders() {
  auto made = loom::testing::made_by_transformers("make_hf_deepseek_v3_model.py",
                                                  "deepseek_v3_models", {"qlora", "plain"});
  made.push_back(std::string(LOOM_SOURCE_DIR) + "/tests/data/hf_deepseek_v3/transformers5/plain");
  return made;
}

TEST(HfDeepseekV3, ReadsLatentAttentionRoutingAndTheBias) {
  for (size_t v = 0; v < folders().size(); ++v) {
    auto model = load(folders()[v]);
    auto& decoder = dynamic_cast<loom::models::DecoderModel&>(*model.model);
    const auto& args = decoder.args();
    ASSERT_TRUE(args.mla && args.moe && args.yarn);
    EXPECT_EQ(args.mla->q_lora_rank, v == 0 ? 24 : 0);
    EXPECT_EQ(args.rope_layout,
              v == 0 ? loom::models::RopeLayout::kInterleaved : loom::models::RopeLayout::kHalves);
    EXPECT_EQ(args.moe->num_expert_groups, 4);
    EXPECT_EQ(args.moe->num_limited_groups, 2);
    EXPECT_EQ(args.moe->score_function, loom::models::ScoreFunction::kSigmoid);
    EXPECT_DOUBLE_EQ(args.moe->route_scale, 2.5);
    const auto& blocks = decoder.transformer()->blocks;
    ASSERT_EQ(blocks.size(), 4u);
    for (size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_EQ(static_cast<bool>(blocks[i]->moe), i >= 2) << "layer " << i;
      EXPECT_TRUE(blocks[i]->latent_attention);
    }
    // The bias came from the folder (the test's values are in (0, 0.3)), not zeros.
    EXPECT_GT(blocks[2]->moe->expert_bias.min().item<double>(), 0.0);
  }
}

TEST(HfDeepseekV3, MoEBlockAndLogitsEqualTransformers) {
  for (const std::string& folder : folders()) {
    auto reference = tensors_of(folder + "/reference.safetensors");
    auto model = load(folder);
    auto& decoder = dynamic_cast<loom::models::DecoderModel&>(*model.model);
    auto& block = decoder.transformer()->blocks.at(reference.at("block_layer").item<int64_t>());
    ASSERT_TRUE(block->moe);
    at::NoGradGuard no_grad;
    const at::Tensor block_out = block->moe->forward(reference.at("block_in"));
    const double block_worst = (block_out - reference.at("block_out")).abs().max().item<double>();
    EXPECT_LT(block_worst, 1e-5) << folder;
    const at::Tensor logits = model.forward(reference.at("ids"));
    ASSERT_EQ(logits.sizes(), reference.at("logits").sizes());
    const double worst = (logits - reference.at("logits")).abs().max().item<double>();
    EXPECT_LT(worst, 1e-5) << folder;
    std::printf("%s: max |loom - transformers| MoE block %.2e, logits %.2e\n", folder.c_str(),
                block_worst, worst);
    // The check sees the bias: routing without it moves the block's output.
    const at::Tensor bias = block->moe->expert_bias.clone();
    block->moe->expert_bias.zero_();
    const double unbiased =
        (block->moe->forward(reference.at("block_in")) - reference.at("block_out"))
            .abs()
            .max()
            .item<double>();
    block->moe->expert_bias.copy_(bias);
    EXPECT_GT(unbiased, 1e-3) << folder;
  }
}

TEST(HfDeepseekV3, GreedyTokensWithTheLatentCacheEqualTransformersAndNoCache) {
  for (const std::string& folder : folders()) {
    auto reference = tensors_of(folder + "/reference.safetensors");
    const std::vector<int32_t> want = row_of(reference.at("greedy"));
    auto model = load(folder);
    EXPECT_EQ(loom::testing::greedy_tokens(model, reference), want) << folder;
    EXPECT_GT(std::set<int32_t>(want.begin(), want.end()).size(), 4u) << folder;

    // loom without a cache: the whole sequence through forward() at every step.
    at::Tensor ids = reference.at("prompt").clone();
    for (size_t i = 0; i < want.size(); ++i) {
      const at::Tensor next = model.forward(ids).select(1, ids.size(1) - 1).argmax(-1, true);
      ids = at::cat({ids, next.to(at::kLong)}, 1);
    }
    EXPECT_EQ(row_of(ids.slice(1, reference.at("prompt").size(1))), want) << folder;

    // The cache holds the normed latent and the rotary key per layer, not per-head keys/values.
    auto cache = model.model->new_inference_cache(1, 8, {});
    const auto& kv = dynamic_cast<const loom::models::KVCache&>(*cache);
    EXPECT_TRUE(kv.keys.empty());
    EXPECT_EQ(kv.bytes_per_slot(), 4 * (16 + 8) * 4);  // layers x (kv rank + rope) x float32
  }
}

TEST(HfDeepseekV3, ImportThenExportWritesTheFolderBack) {
  for (const std::string& folder : folders()) {
    const std::string exported = loom::testing::expect_import_export_bitwise(folder, "deepseek_v3");
    const json config = json::parse(std::ifstream(exported + "/config.json"));
    const json source = json::parse(std::ifstream(folder + "/config.json"));
    EXPECT_EQ(config.at("architectures")[0], "DeepseekV3ForCausalLM");
    for (const char* key :
         {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
          "head_dim", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
          "n_shared_experts", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor",
          "first_k_dense_replace", "rope_interleave"}) {
      EXPECT_EQ(config.at(key), source.at(key)) << folder << ": " << key;
    }
    // transformers 4 saves the YaRN as rope_scaling, 5 as rope_parameters (with the theta).
    json rope =
        source.contains("rope_scaling") ? source.at("rope_scaling") : source.at("rope_parameters");
    rope.erase("rope_theta");
    rope.erase("type");
    json exported_rope = config.at("rope_scaling");
    exported_rope.erase("type");
    EXPECT_EQ(exported_rope, rope) << folder;
    // The exported folder is the same model: loom reads it back to the same logits.
    auto reference = tensors_of(folder + "/reference.safetensors");
    auto model = load(exported);
    const double worst =
        (model.forward(reference.at("ids")) - reference.at("logits")).abs().max().item<double>();
    EXPECT_LT(worst, 1e-5) << folder;
  }
}

TEST(HfDeepseekV3, SettingsTransformersIgnoresAreRefusedByName) {
  const std::string folder = loom::testing::fresh_temp_dir("deepseek_v3_softmax");
  fs::copy(folders()[0], folder, fs::copy_options::recursive);
  json config = json::parse(std::ifstream(folder + "/config.json"));
  config["scoring_func"] = "softmax";
  std::ofstream(folder + "/config.json") << config.dump(2);
  try {
    load(folder);
    FAIL() << "a softmax-scored DeepSeek folder was accepted";
  } catch (const loom::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("scoring_func is \"softmax\""), std::string::npos)
        << e.what();
  }
}

// The flavors' YaRN (torchtitan's: on beyond 4096 trained positions) follows the context the
// weights were trained at, not the window a generation asks for.
TEST(DeepseekV3Flavors, YarnFollowsTheTrainingContextNotTheWindow) {
  const auto& spec = loom::models::find_model_spec("deepseek_v3");
  loom::models::BuildOptions options;
  options.flavor = "debugmodel";
  options.tensor_options = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
  options.max_seq_len = 16384;
  options.trained_seq_len = 2048;
  EXPECT_FALSE(loom::models::decoder_args(*spec.build(options)).yarn_active());
  options.max_seq_len = 2048;
  options.trained_seq_len = 8192;
  const auto long_trained = loom::models::decoder_args(*spec.build(options));
  ASSERT_TRUE(long_trained.yarn_active());
  EXPECT_EQ(long_trained.yarn->factor, 40.0);
  options.trained_seq_len = 0;  // training itself: the context is max_seq_len
  EXPECT_FALSE(loom::models::decoder_args(*spec.build(options)).yarn_active());
}

// checkpoint import wrote a COMPLETE step-0 from folders missing a weight (the final norm, a
// router gate, the routing bias) or holding a NaN bias, and replaced a training run's step-0.
TEST(HfDeepseekV3, ImportRefusesMissingOrNonFiniteWeightsAndKeepsAnExistingStep) {
  const std::string source = folders()[1];
  auto without = [&](const std::string& dropped, const std::string& nan_tensor) {
    const std::string folder = loom::testing::fresh_temp_dir("deepseek_v3_hostile");
    fs::copy(source, folder, fs::copy_options::recursive);
    loom::checkpoint::NamedTensors kept;
    for (auto& [name, t] : tensors_of(folder + "/model.safetensors")) {
      if (name == dropped) continue;
      kept.emplace_back(name, name == nan_tensor ? t.clone().fill_(NAN) : t);
    }
    loom::checkpoint::save_safetensors(folder + "/model.safetensors", kept, {{"format", "pt"}});
    return folder;
  };
  auto import_error = [](const std::string& folder, const std::string& out) {
    try {
      loom::checkpoint::import_from_hf(folder, out);
    } catch (const loom::InputError& e) {
      return std::string(e.what());
    }
    return std::string("imported");
  };
  for (const char* dropped :
       {"model.norm.weight", "model.layers.2.mlp.gate.weight",
        "model.layers.3.mlp.gate.e_score_correction_bias", "lm_head.weight"}) {
    const std::string out = loom::testing::fresh_temp_dir("deepseek_v3_hostile_out");
    const std::string error = import_error(without(dropped, ""), out);
    EXPECT_NE(error.find(std::string("needs weights the folder does not hold")), std::string::npos)
        << dropped << ": " << error;
    EXPECT_NE(error.find(dropped), std::string::npos) << error;
    EXPECT_FALSE(fs::exists(out + "/step-0")) << dropped;
  }
  const std::string nan_out = loom::testing::fresh_temp_dir("deepseek_v3_nan_out");
  const std::string nan_error =
      import_error(without("", "model.layers.2.mlp.gate.e_score_correction_bias"), nan_out);
  EXPECT_NE(nan_error.find("layers.2.moe.expert_bias' holds NaN or Inf"), std::string::npos)
      << nan_error;
  EXPECT_FALSE(fs::exists(nan_out + "/step-0"));
  // A weight stored transposed is refused at import, not when the checkpoint is loaded.
  {
    const std::string folder = loom::testing::fresh_temp_dir("deepseek_v3_transposed");
    fs::copy(source, folder, fs::copy_options::recursive);
    loom::checkpoint::NamedTensors kept;
    for (auto& [name, t] : tensors_of(folder + "/model.safetensors")) {
      kept.emplace_back(name,
                        name == "model.layers.0.mlp.gate_proj.weight" ? t.t().contiguous() : t);
    }
    loom::checkpoint::save_safetensors(folder + "/model.safetensors", kept, {{"format", "pt"}});
    const std::string shape_out = loom::testing::fresh_temp_dir("deepseek_v3_transposed_out");
    const std::string error = import_error(folder, shape_out);
    EXPECT_NE(error.find("layers.0.feed_forward.w1.weight has shape"), std::string::npos) << error;
    EXPECT_NE(error.find("config.json implies"), std::string::npos) << error;
    EXPECT_FALSE(fs::exists(shape_out + "/step-0"));
  }

  // An existing step-0 (a training run's) stays unless --overwrite.
  const std::string out = loom::testing::fresh_temp_dir("deepseek_v3_existing");
  fs::create_directories(out + "/step-0");
  std::ofstream(out + "/step-0/COMPLETE") << "step 0\n";
  EXPECT_NE(import_error(source, out).find("already exists"), std::string::npos);
  EXPECT_TRUE(fs::exists(out + "/step-0/COMPLETE"));
  loom::checkpoint::import_from_hf(source, out, {}, nullptr, /*overwrite=*/true);
  EXPECT_TRUE(fs::exists(out + "/step-0/index.json"));
  // An import over an earlier import (a job with initial_load_in_hf restarted before its first
  // checkpoint): its step-0 holds hf_config.json, which loom wrote and may remove.
  ASSERT_TRUE(fs::exists(out + "/step-0/hf_config.json"));
  loom::checkpoint::import_from_hf(source, out, {}, nullptr, /*overwrite=*/true);
  EXPECT_TRUE(fs::exists(out + "/step-0/COMPLETE"));
}

// q_lora_rank: null with q_a_* weights got a misleading name (the tensor had "no place").
TEST(HfDeepseekV3, ABottleneckWithoutQLoraRankIsNamed) {
  const std::string folder = loom::testing::fresh_temp_dir("deepseek_v3_no_qlora");
  fs::copy(folders()[0], folder, fs::copy_options::recursive);  // qlora: has q_a_proj
  json config = json::parse(std::ifstream(folder + "/config.json"));
  config["q_lora_rank"] = nullptr;
  std::ofstream(folder + "/config.json") << config.dump(2);
  try {
    loom::checkpoint::import_from_hf(folder, loom::testing::fresh_temp_dir("deepseek_v3_nq_out"));
    FAIL() << "imported q_a_proj weights into a model without a query bottleneck";
  } catch (const loom::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("q_lora_rank is null or missing"), std::string::npos)
        << e.what();
  }
}

}  // namespace test_hf_deepseek_v3
}  // namespace
