// Qwen3 against transformers. Tiny random Qwen3ForCausalLM models (tools/make_hf_qwen3_model.py:
// head_dim 16 where hidden_size / heads is 8, grouped kv heads, q/k norms away from 1), tied and
// untied, made by the setup venv's transformers 4 inside the test, and one saved by transformers
// 5.25 (tests/data/hf_qwen3/transformers5, its own config.json layout), loaded as `loom generate`
// and `loom eval` load a folder: logits within 1e-5 of transformers' in float32, greedy tokens
// with the KV cache equal to transformers' generate(), and import then export writes back exactly
// the folder's tensors (no lm_head.weight for a tied model), in float32 and in bfloat16.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/generate/generator.h"
#include "loom/generate/inference_model.h"
#include "support/process.h"
#include "unit/hf_test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kTransformers5 =
    std::string(LOOM_SOURCE_DIR) + "/tests/data/hf_qwen3/transformers5";

using loom::testing::row_of;
using loom::testing::tensors_of;

loom::generate::InferenceModel load(const std::string& folder) {
  return loom::testing::load_hf_folder(folder, "qwen3");
}

// `folder`'s logits on its reference ids, loom against the transformers that saved it.
double logits_difference(const std::string& folder) {
  auto reference = tensors_of(folder + "/reference.safetensors");
  auto model = load(folder);
  const at::Tensor got = model.forward(reference.at("ids"));
  const at::Tensor want = reference.at("logits");
  EXPECT_EQ(got.sizes(), want.sizes()) << folder;
  return (got - want).abs().max().item<double>();
}

class HfQwen3 : public ::testing::Test {
 protected:
  // tied/ and untied/ made by the venv's transformers (shared with the other Hf suites), each with
  // reference.safetensors; and the transformers 5 fixture.
  static void SetUpTestSuite() {
    const auto tied =
        loom::testing::made_by_transformers("make_hf_qwen3_model.py", "qwen3_models", {"tied"});
    made_ = new std::string(std::filesystem::path(tied.at(0)).parent_path().string());
  }
  static void TearDownTestSuite() {
    delete made_;
    made_ = nullptr;
  }
  // (what, folder, tied)
  static std::vector<std::tuple<std::string, std::string, bool>> folders() {
    return {{"transformers 4, tied", *made_ + "/tied", true},
            {"transformers 4, untied", *made_ + "/untied", false},
            {"transformers 5, tied", kTransformers5 + "/tied", true}};
  }
  static std::string* made_;
};

std::string* HfQwen3::made_ = nullptr;

}  // namespace

TEST_F(HfQwen3, FoldersHaveTheShapeThatSetsQwen3Apart) {
  for (const auto& [what, folder, tied] : folders()) {
    const json config = json::parse(std::ifstream(folder + "/config.json"));
    EXPECT_EQ(config.at("head_dim"), 16) << what;
    EXPECT_EQ(config.at("hidden_size").get<int>() / config.at("num_attention_heads").get<int>(), 8);
    EXPECT_EQ(config.at("num_key_value_heads"), 2) << what;
    EXPECT_EQ(config.at("tie_word_embeddings"), tied) << what;
    EXPECT_EQ(tensors_of(folder + "/model.safetensors").count("lm_head.weight"), tied ? 0u : 1u);
  }
  // The fixture is in transformers 5's own layout: RoPE in rope_parameters only.
  const json v5 = json::parse(std::ifstream(kTransformers5 + "/tied/config.json"));
  EXPECT_EQ(v5.at("transformers_version").get<std::string>().substr(0, 2), "5.");
  EXPECT_FALSE(v5.contains("rope_theta"));
  EXPECT_EQ(v5.at("rope_parameters").at("rope_theta"), 1e6);
}

TEST_F(HfQwen3, LogitsEqualTransformers) {
  for (const auto& [what, folder, tied] : folders()) {
    const double worst = logits_difference(folder);
    EXPECT_LT(worst, 1e-5) << what;
    std::printf("%s: max |loom - transformers| logit %.2e\n", what.c_str(), worst);
  }
  // The comparison would notice transformers 5's rope_parameters being misread: the same folder
  // with theta 10000 (the default a reader falls back on) computes far from the reference.
  const std::string misread = loom::testing::fresh_temp_dir("qwen3_theta10000");
  fs::copy(kTransformers5 + "/tied", misread);
  json config = json::parse(std::ifstream(misread + "/config.json"));
  config["rope_parameters"]["rope_theta"] = 10000.0;
  std::ofstream(misread + "/config.json") << config.dump(1);
  const double moved = logits_difference(misread);
  EXPECT_GT(moved, 0.1);
  std::printf("transformers 5 folder read with theta 10000: max logit difference %.2f\n", moved);
}

TEST_F(HfQwen3, GreedyTokensWithTheCacheEqualTransformers) {
  for (const auto& [what, folder, tied] : folders()) {
    auto reference = tensors_of(folder + "/reference.safetensors");
    const std::vector<int32_t> want = row_of(reference.at("greedy"));
    auto model = load(folder);
    EXPECT_EQ(loom::testing::greedy_tokens(model, reference), want) << what;
    // Not one token repeated: the comparison sees the cache's positions.
    EXPECT_GT(std::set<int32_t>(want.begin(), want.end()).size(), 4u) << what;
  }
}

namespace {

// `folder` imported, then the step exported in `dtype`: the same tensor names, dtypes and bits.
// Returns the export.
std::string expect_round_trip(const std::string& folder, const std::string& dtype, bool tied,
                              const std::string& what) {
  const std::string checkpoint = loom::testing::fresh_temp_dir("qwen3_rt_ckpt");
  loom::checkpoint::import_from_hf(folder, checkpoint);
  const std::string exported = loom::testing::fresh_temp_dir("qwen3_rt_export");
  loom::checkpoint::HfExportOptions options;
  options.dtype = dtype;
  options.overwrite = true;
  loom::checkpoint::export_to_hf(checkpoint + "/step-0", exported, options);
  const auto original = tensors_of(folder + "/model.safetensors");
  const auto back = tensors_of(exported + "/model.safetensors");
  std::set<std::string> names_a, names_b;
  for (const auto& [name, t] : original) names_a.insert(name);
  for (const auto& [name, t] : back) names_b.insert(name);
  EXPECT_EQ(names_a, names_b) << what;
  for (const auto& [name, tensor] : original) {
    auto it = back.find(name);
    if (it == back.end()) continue;
    EXPECT_EQ(it->second.scalar_type(), tensor.scalar_type()) << what << ": " << name;
    EXPECT_TRUE(at::equal(tensor, it->second)) << what << ": " << name;
  }
  const json config = json::parse(std::ifstream(exported + "/config.json"));
  EXPECT_EQ(config.at("architectures")[0], "Qwen3ForCausalLM");
  EXPECT_EQ(config.at("tie_word_embeddings"), tied);
  EXPECT_EQ(config.at("head_dim"), 16);
  return exported;
}

}  // namespace

TEST_F(HfQwen3, ImportThenExportIsBitwiseTheOriginal) {
  for (const auto& [what, folder, tied] : folders()) {
    const std::string exported = expect_round_trip(folder, "float32", tied, what);
    // The export computes what the original does.
    fs::copy_file(folder + "/reference.safetensors", exported + "/reference.safetensors");
    EXPECT_LT(logits_difference(exported), 1e-5) << what;
  }
  // In bfloat16, as Qwen publishes its models.
  const std::string bf16 = loom::testing::fresh_temp_dir("qwen3_bf16");
  fs::copy(kTransformers5 + "/tied", bf16);
  loom::checkpoint::NamedTensors weights;
  for (const auto& [name, t] : tensors_of(bf16 + "/model.safetensors")) {
    weights.emplace_back(name, t.to(at::kBFloat16));
  }
  loom::checkpoint::save_safetensors(bf16 + "/model.safetensors", weights, {{"format", "pt"}});
  json config = json::parse(std::ifstream(bf16 + "/config.json"));
  config["dtype"] = "bfloat16";
  std::ofstream(bf16 + "/config.json") << config.dump(1);
  expect_round_trip(bf16, "bfloat16", true, "transformers 5, tied, bfloat16");
}
