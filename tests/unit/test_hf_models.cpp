// Llamas saved by transformers 4.57 and 5.24 (tests/data/hf_llama, made by
// tools/make_hf_llama_fixture.py) compute, when loom loads the folder as `loom eval` and
// `loom generate` do, the per-token losses transformers computed on them, within 1e-5; and the
// comparison would notice the RoPE being misread (rope_theta taken as 10000).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "loom/generate/inference_model.h"
#include "support/process.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kFixtures = std::string(LOOM_SOURCE_DIR) + "/tests/data/hf_llama";

const json& expected() {
  static const json values = json::parse(std::ifstream(kFixtures + "/expected.json"));
  return values;
}

// Per-token cross-entropy of the fixture's ids under the model in `folder`.
std::vector<double> loom_losses(const std::string& folder) {
  loom::generate::ModelSource source;
  source.checkpoint = folder;
  source.tokenizer = "byte";
  source.device = "cpu";
  auto model = loom::generate::load_inference_model(source);
  const auto ids = expected()["ids"].get<std::vector<int64_t>>();
  at::Tensor tokens = at::tensor(ids, at::kLong);
  at::Tensor inputs = tokens.slice(0, 0, tokens.size(0) - 1).unsqueeze(0);
  at::Tensor logits = model.forward(inputs)[0].to(at::kDouble);
  at::Tensor losses = at::cross_entropy_loss(logits, tokens.slice(0, 1), {}, at::Reduction::None);
  return std::vector<double>(losses.data_ptr<double>(), losses.data_ptr<double>() + losses.numel());
}

double mean(const std::vector<double>& x) {
  double sum = 0;
  for (double v : x) sum += v;
  return sum / static_cast<double>(x.size());
}

void expect_transformers_losses(const std::string& version) {
  const json& reference = expected()[version];
  const auto want = reference["losses"].get<std::vector<double>>();
  const auto got = loom_losses(kFixtures + "/" + version);
  ASSERT_EQ(got.size(), want.size());
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) > std::abs(got[worst] - want[worst])) worst = i;
  }
  EXPECT_LT(std::abs(got[worst] - want[worst]), 1e-4)
      << version << " token " << worst << ": loom " << got[worst] << ", transformers "
      << want[worst];
  const double relative = std::abs(mean(got) - mean(want)) / mean(want);
  EXPECT_LT(relative, 1e-5) << version << ": loom " << mean(got) << ", transformers " << mean(want);
  std::printf("%s: mean loss loom %.9f, transformers %.9f (relative %.2e); worst token %.2e\n",
              version.c_str(), mean(got), mean(want), relative, std::abs(got[worst] - want[worst]));
  // The same folder with rope_theta 10000 (what loom read from transformers 5's layout before):
  // loom follows transformers there too, and the difference is far beyond the tolerance.
  const std::string misread = loom::testing::fresh_temp_dir("hf_misread_" + version);
  fs::copy_file(kFixtures + "/" + version + "/model.safetensors", misread + "/model.safetensors");
  json config = json::parse(std::ifstream(kFixtures + "/" + version + "/config.json"));
  if (config.contains("rope_parameters")) config["rope_parameters"]["rope_theta"] = 10000.0;
  if (config.contains("rope_theta")) config["rope_theta"] = 10000.0;
  std::ofstream(misread + "/config.json") << config.dump(1);
  const double wrong = mean(loom_losses(misread));
  const double transformers_wrong = reference["mean_loss_if_theta_10000"].get<double>();
  EXPECT_LT(std::abs(wrong - transformers_wrong) / transformers_wrong, 1e-5);
  EXPECT_GT(std::abs(wrong - mean(want)) / mean(want), 1e-3)
      << "the fixture does not tell rope_theta 10000 from its own";
}

}  // namespace

TEST(HfModels, SavedByTransformers4EvaluatesAsTransformers) {
  expect_transformers_losses("transformers4");
}

TEST(HfModels, SavedByTransformers5EvaluatesAsTransformers) {
  expect_transformers_losses("transformers5");
}
